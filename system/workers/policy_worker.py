"""The policy worker: answers many actors' rollout requests in batches, with fresh weights.

Each poll first takes the newest parameters the parameter service pushed (if any newer than the
ones loaded; an unchanged version is never reloaded), then gathers requests for a bounded time,
runs one ``rollout`` over their concatenation, and sends every actor its rows back.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from api.namedarray import concatenate
from api.policy import Policy, RolloutRequest
from system.errors import ParameterNotFoundError, PeerTimeoutError
from system.parameters.interfaces import ParameterSubscriber
from system.run.plan import Role
from system.streams.inference import InferenceServer, PendingRequest
from system.workers.base import Worker

logger = logging.getLogger(__name__)


class PolicyWorker(Worker):
    role = Role.POLICY

    def __init__(
        self,
        worker_id: str,
        policy_name: str,
        policy: Policy,
        server: InferenceServer,
        params: ParameterSubscriber | None,
        *,
        max_batch_rows: int = 1024,
        max_wait_ms: float = 0.0,
    ):
        super().__init__(worker_id)
        self.policy_name = policy_name
        self.policy = policy
        self.server = server
        self.params = params
        self.max_batch_rows = max_batch_rows
        self.max_wait_ms = max_wait_ms
        self.policy.eval_mode()

    def poll(self) -> int:
        self._update_parameters()
        pending = self.server.gather(self.max_batch_rows, self.max_wait_ms)
        if not pending:
            return 0
        started = time.perf_counter()
        requests = [self._with_state(p.request) for p in pending]
        # One request (the common case when actors send all their environments at once) needs
        # neither concatenating nor slicing: both copy every field.
        request = requests[0] if len(requests) == 1 else concatenate(requests)
        result = self.policy.rollout(request)
        version = self.policy.version
        if len(pending) == 1:
            self.server.reply(pending[0], result, version)
            offset = pending[0].rows
        else:
            offset = 0
            for p in pending:
                rows = p.rows
                self.server.reply(p, result[offset : offset + rows], version)
                offset += rows
        self._count(pending, offset, time.perf_counter() - started)
        return offset

    def _update_parameters(self) -> None:
        if self.params is None:
            return
        latest = self.params.poll_latest(self.policy_name)
        if latest is None:
            return
        self._load(*latest)

    def _load(self, version: int, checkpoint) -> None:
        if version <= self.policy.version:  # unchanged, or older: versions only go up
            return
        self.policy.load_checkpoint(checkpoint)
        self.stats["parameter_loads"] = self.stats.get("parameter_loads", 0) + 1

    def reconnect(self, params: ParameterSubscriber) -> None:
        """The parameter service was restarted at new addresses: listen there from now on, and
        take the newest version at once (one pushed before the new subscription is missed)."""
        old, self.params = self.params, params
        if old is not None:
            old.close()
        try:
            self._catch_up(params)
        except (ParameterNotFoundError, PeerTimeoutError) as e:
            logger.warning("%s: the restarted service has no parameters yet: %s", self.worker_id,
                           e)  # fmt: skip

    def _catch_up(self, params: ParameterSubscriber) -> None:
        self._load(*params.get(self.policy_name))

    def _with_state(self, request: RolloutRequest) -> RolloutRequest:
        """Fill the memory of a request that came without one (an actor's first request)."""
        default = self.policy.default_policy_state
        if default is None:
            if request.policy_state is not None:
                request = request[:]  # shallow: same leaves, new container
                request.policy_state = None
            return request
        if request.policy_state is None:
            rows = len(request.on_reset)
            request = request[:]
            request.policy_state = default.apply(lambda x: np.repeat(x, rows, axis=0))
        return request

    def _count(self, pending: list[PendingRequest], rows: int, seconds: float) -> None:
        s = self.stats
        s["batches"] = s.get("batches", 0) + 1
        s["rows"] = s.get("rows", 0) + rows
        s["requests"] = s.get("requests", 0) + len(pending)
        s["rollout_s"] = s.get("rollout_s", 0.0) + seconds
        s["version"] = self.policy.version

    def close(self) -> None:
        self.server.close()
        if self.params is not None:
            self.params.close()
