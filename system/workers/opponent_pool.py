"""Self-play against the past: a policy worker that plays versions of another policy it draws
from a pool of snapshots (``api.config.league.SelfPlayConfig``).

The opponent's policy worker subscribes to the *learner's* parameter pushes. Every
``snapshot_every``-th version it receives joins a bounded pool, and every ``swap_every_s``
seconds it draws the version it plays from that pool, by a sampling rule. It answers requests
exactly as any policy worker does, and the version it reports with every answer is the
learner's version it plays, so actors record who played whom and the controller rates every
snapshot (``system.run.coordination.ratings``).

The pool outlives its worker: each snapshot that joins it is tagged at the parameter service
(``pool-<opponent>-<worker index>-<slot>``, one tag per place in the pool), which keeps the
version and writes its file. A restarted opponent worker, and every opponent worker of a resumed
run, reads its tags back (:meth:`OpponentPolicyWorker.restore_pool`) and goes on playing the
same past versions instead of only the newest. A snapshot whose tag cannot be written (the
service let the version go, or did not answer) stays in this worker's pool and is counted
(``pool_untagged``): only that one is missing after a restart.

``prioritized`` sampling reads the learner's score against each version from the run's global
state (``selfplay/scores``, written by the controller): versions the learner still loses to are
drawn more often, as in prioritised fictitious self-play.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from api.config.league import SelfPlayConfig
from api.global_state import GlobalStateError, global_state
from api.policy import Policy, RolloutRequest, RolloutResult
from system.errors import ParameterNotFoundError, PeerTimeoutError
from system.parameters.interfaces import ParameterSubscriber
from system.streams.inference import InferenceServer
from system.workers.policy_worker import PolicyWorker

logger = logging.getLogger(__name__)

ACTION_MASK_KEY = "action_mask"
"""The observation key of legal actions, as environments and policies write and read it."""
SCORES_KEY = "selfplay/scores"
"""Global state key: ``{str(version): the learner's mean score against it}`` (1 win, 0 loss)."""


def pool_tag(opponent: str, index: int, slot: int) -> str:
    """The parameter-service tag of place ``slot`` in the pool of ``opponent``'s worker
    ``index``."""
    return f"pool-{opponent}-{index}-{slot}"


class OpponentPool:
    """Snapshots of a learner's versions, at most ``size``, and the rule that draws one.

    Each snapshot has a place (a *slot*, ``0 .. size-1``): the next one kept takes the slot
    after the newest's, which in a full pool is the oldest's, the one it pushes out."""

    def __init__(self, snapshot_every: int, size: int, sampling: str, seed: int = 0):
        self.snapshot_every = snapshot_every
        self.size = size
        self.sampling = sampling
        self.rng = np.random.default_rng(seed)
        self.snapshots: OrderedDict[int, Any] = OrderedDict()
        self._last_kept: int | None = None
        self._next_slot = 0

    def __len__(self) -> int:
        return len(self.snapshots)

    def offer(self, version: int, checkpoint: Any) -> int | None:
        """Keep ``version`` if it is ``snapshot_every`` past the last one kept (the first one
        always is); the oldest leaves a full pool. The slot it took if it was kept, else None."""
        if self._last_kept is not None and version < self._last_kept + self.snapshot_every:
            return None
        self.snapshots[version] = _own_copy(checkpoint)  # pushed arrays may map shared memory
        self._last_kept = version
        while len(self.snapshots) > self.size:
            self.snapshots.popitem(last=False)
        slot, self._next_slot = self._next_slot, (self._next_slot + 1) % self.size
        return slot

    def restore(self, slots: dict[int, tuple[int, Any]]) -> None:
        """Fill an empty pool with ``{slot: (version, checkpoint)}`` saved by an earlier
        worker: its newest ``size``, oldest first, and the next snapshot takes the place after
        the newest's. Where that worker's pool was larger (``selfplay.pool_size`` lowered on a
        resume), the places start again from 0."""
        by_version = sorted(slots.items(), key=lambda item: item[1][0])[-self.size :]
        larger = any(slot >= self.size for slot, _ in by_version)
        for slot, (version, checkpoint) in by_version:
            self.snapshots[version] = _own_copy(checkpoint)
            self._last_kept, self._next_slot = version, 0 if larger else (slot + 1) % self.size

    def draw(self, scores: dict[int, float] | None = None) -> tuple[int, Any]:
        """A ``(version, checkpoint)`` by the sampling rule; ``scores`` (the learner's mean
        score against a version, 0 to 1) weight ``prioritized``: ``(1 - score) ** 2``, so a
        version the learner always beats is rarely drawn (unknown versions count as 0.5)."""
        versions = list(self.snapshots)
        if self.sampling == "latest-heavy" and self.rng.random() < 0.5:
            version = versions[-1]
        elif self.sampling == "prioritized":
            known = scores or {}
            weights = np.array([(1.0 - known.get(v, 0.5)) ** 2 + 1e-3 for v in versions])
            version = versions[int(self.rng.choice(len(versions), p=weights / weights.sum()))]
        else:
            version = versions[int(self.rng.integers(len(versions)))]
        return version, self.snapshots[version]


class OpponentPolicyWorker(PolicyWorker):
    """A policy worker whose weights are a drawn past version of ``learner``, not its own."""

    def __init__(
        self,
        worker_id: str,
        policy_name: str,
        policy: Policy,
        server: InferenceServer,
        params: ParameterSubscriber,
        selfplay: SelfPlayConfig,
        *,
        index: int = 0,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if selfplay.random_moves > 0:
            policy = RandomMoves(policy, selfplay.random_moves, seed)
        super().__init__(worker_id, policy_name, policy, server, params)
        self.learner = selfplay.learner
        self.pool = OpponentPool(
            selfplay.snapshot_every, selfplay.pool_size, selfplay.sampling, seed
        )
        self.index = index
        self.swap_every_s = selfplay.swap_every_s
        self.clock = clock
        self.next_swap = 0.0

    def restore_pool(self) -> int:
        """Take back the snapshots an earlier worker in this place tagged (a restart, or a
        resumed run); returns how many. Missing tags are a fresh pool's, not an error (nor
        is one place missing: its tag could not be written). Places past ``pool_size`` are
        read while there are any, for a run resumed with a smaller pool."""
        saved: dict[int, tuple[int, Any]] = {}
        slot = 0
        while slot < self.pool.size or slot - 1 in saved:
            try:
                saved[slot] = self.params.get(self.learner, pool_tag(self.policy_name, self.index,
                                                                      slot))  # fmt: skip
            except ParameterNotFoundError:
                pass
            except PeerTimeoutError as e:  # play on from what came back; said, not hidden
                logger.warning("%s: the pool's snapshots from place %d on are not restored: %s",
                               self.worker_id, slot, e)  # fmt: skip
                break
            slot += 1
        self.pool.restore(saved)
        self._pool_stats()
        return len(self.pool)

    def offer(self, version: int, checkpoint: Any) -> None:
        """A version of the learner this worker received: it joins the pool if it is due, and
        its tag at the service keeps it for a restarted worker."""
        slot = self.pool.offer(version, checkpoint)
        if slot is None:
            return
        self._pool_stats()
        try:
            self.params.tag(self.learner, version, pool_tag(self.policy_name, self.index, slot))
        except (ParameterNotFoundError, PeerTimeoutError) as e:
            self.stats["pool_untagged"] = self.stats.get("pool_untagged", 0) + 1
            logger.warning("%s: snapshot %d is in the pool but not saved for a restart: %s",
                           self.worker_id, version, e)  # fmt: skip

    def _pool_stats(self) -> None:
        if len(self.pool):
            self.stats["pool_size"] = len(self.pool)
            self.stats["pool_newest"] = next(reversed(self.pool.snapshots))

    def _update_parameters(self) -> None:
        latest = self.params.poll_latest(self.learner)
        if latest is not None:
            self.offer(*latest)
        now = self.clock()
        if len(self.pool) and now >= self.next_swap:
            self.next_swap = now + self.swap_every_s
            version, checkpoint = self.pool.draw(self._scores())
            if version != self.policy.version:  # older or newer: a drawn version is played
                self.policy.load_checkpoint(checkpoint)
                self.stats["parameter_loads"] = self.stats.get("parameter_loads", 0) + 1
            self.stats["opponent_version"] = version

    def _scores(self) -> dict[int, float] | None:
        if self.pool.sampling != "prioritized":
            return None
        try:
            value, _ = global_state().get(SCORES_KEY)
        except GlobalStateError:  # no run state in this process (serial mode): no scores
            return None
        if not isinstance(value, dict):
            return None
        return {int(k): float(v) for k, v in value.items() if str(k).isdigit()}

    def _catch_up(self, params: ParameterSubscriber) -> None:
        """After the parameter service moved: the learner's newest joins the pool (if due)."""
        self.offer(*params.get(self.learner))


class RandomMoves:
    """The opponent's policy, except that with probability ``p`` a training row's action is a
    uniformly random legal one (from the observation's ``action_mask`` when it has one)."""

    def __init__(self, policy: Policy, p: float, seed: int = 0):
        self.policy = policy
        self.p = p
        self.rng = np.random.default_rng(seed)

    def __getattr__(self, name: str) -> Any:  # version, checkpoints, state: the policy's own
        return getattr(self.policy, name)

    def rollout(self, request: RolloutRequest) -> RolloutResult:
        result = self.policy.rollout(request)
        n = len(request.on_reset)
        rows = np.flatnonzero((self.rng.random(n) < self.p) & ~request.is_evaluation[:, 0])
        if len(rows) == 0:
            return result
        mask = getattr(request.obs, ACTION_MASK_KEY, None)
        actions = np.array(result.action, copy=True)
        choices = int(self.policy.action_space.n)
        for r in rows:
            legal = np.flatnonzero(mask[r]) if mask is not None else np.arange(choices)
            if legal.size:
                actions[r] = self.rng.choice(legal)
        result.action = actions
        return result


def _own_copy(tree: Any) -> Any:
    if isinstance(tree, np.ndarray):
        return np.array(tree, copy=True)
    if isinstance(tree, dict):
        return {k: _own_copy(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_own_copy(v) for v in tree)
    return tree
