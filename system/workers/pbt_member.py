"""Population-based training in a run: a member's trainer carries out the controller's orders.

On every heartbeat the trainer of a PBT member looks at ``pbt/<member>/order`` in the global
state (:mod:`system.run.pbt_driver` writes it). A new order means: fetch the source member's
newest weights from the parameter service, load them into this trainer's policy under this
member's next version (versions of a policy only grow, so its policy workers take the copy like
any new version), publish them, and train on with the order's hyper-parameters
(``Trainer.set_hyperparameters``: no restart). What was done goes to ``pbt/<member>/applied``,
with digests of the weights before, of the source's and after, so the copy can be checked.

A trainer restarted after it applied an order finds its weights already in the parameter service
(they were published): it only sets the order's hyper-parameters again.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import numpy as np

from api.errors import ConfigError, UserError
from api.global_state import GlobalState

logger = logging.getLogger(__name__)


class PBTMember:
    def __init__(self, state: GlobalState, worker: Any, starting: dict[str, float]):
        self.state = state
        self.worker = worker
        self.member = worker.policy_name
        self.seen = 0
        """The version of the order key last carried out."""
        self._set_hyperparameters(starting)  # an unknown name fails the run at once

    def __call__(self) -> None:
        order, version = self.state.get(f"pbt/{self.member}/order")
        if version == self.seen or not isinstance(order, dict):
            return
        self.seen = version
        self._set_hyperparameters(order["hyperparameters"])
        applied, _ = self.state.get(f"pbt/{self.member}/applied")
        if isinstance(applied, dict) and applied.get("generation", 0) >= order["generation"]:
            return  # restarted after applying it: the weights are the published ones
        report = self.copy_weights(str(order["source"]))
        report.update(generation=order["generation"], hyperparameters=order["hyperparameters"])
        self.state.set(f"pbt/{self.member}/applied", report)

    def copy_weights(self, source: str) -> dict[str, Any]:
        """Load ``source``'s newest published weights as this member's next version; publish."""
        policy = self.worker.trainer.policy
        version_before = policy.version
        digest_before = weights_digest(policy.get_checkpoint())
        source_version, params = self.worker.params.get(source)
        policy.load_checkpoint({**params, "version": version_before + 1})
        self.worker.publish(persist=False)
        self.worker.stats["pbt_exploits"] = self.worker.stats.get("pbt_exploits", 0) + 1
        logger.info("%s: copied %s v%d as v%d", self.member, source, source_version, policy.version)
        return {
            "source": source,
            "source_version": int(source_version),
            "version_before": int(version_before),
            "version_after": int(policy.version),
            "digest_before": digest_before,
            "digest_source": weights_digest(params),
            "digest_after": weights_digest(policy.get_checkpoint()),
        }

    def _set_hyperparameters(self, values: dict[str, float]) -> None:
        try:
            self.worker.trainer.set_hyperparameters(dict(values))
        except UserError as e:
            raise ConfigError([f"pbt.hyperparameters: {e}"]) from e
        for name, value in values.items():  # kept in the trainer's stats, so in metrics.jsonl
            self.worker.stats[f"hp/{name}"] = float(value)


def weights_digest(checkpoint: Any) -> str:
    """A digest of every array of a checkpoint (its ``version`` left out), in key order."""
    h = hashlib.sha256()
    for path, leaf in _leaves(checkpoint, ""):
        if path == "version":
            continue
        array = np.ascontiguousarray(_to_numpy(leaf))
        h.update(f"{path}:{array.dtype.str}:{array.shape}".encode())
        h.update(array.tobytes())
    return h.hexdigest()[:16]


def _leaves(node: Any, path: str):
    if isinstance(node, dict):
        for key in sorted(node, key=str):
            yield from _leaves(node[key], f"{path}.{key}" if path else str(key))
    else:
        yield path, node


def _to_numpy(leaf: Any) -> np.ndarray:
    if hasattr(leaf, "detach"):  # a torch tensor (not imported here: only its methods are used)
        return leaf.detach().cpu().numpy()
    return np.asarray(leaf)
