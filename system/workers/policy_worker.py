"""The policy worker: answers many actors' rollout requests in batches, with fresh weights.

Each poll first takes the newest parameters the parameter service pushed (if any newer than the
ones loaded; an unchanged version is never reloaded), then gathers requests for a bounded time,
runs one ``rollout`` over their concatenation, and sends every actor its rows back.

The judged policy's workers *hold* a version for evaluation, one per evaluation window
(:meth:`PolicyWorker.hold_evaluation`, on the controller's order in the global state, see
:mod:`system.run.stopping`): evaluation requests are answered by a copy of that version, which
the parameter service keeps under the worker's tag (``eval``; ``eval-<index>`` past the first
worker) and writes to a file, while training requests keep getting the newest weights. A window
so judges one version, and the version whose windows confirm a target is what the run delivers
(``summary.json``'s ``solved_version``, what ``troupe eval`` plays).

Its stages (:mod:`system.timing`): ``load_params`` (new weights), ``wait_requests``, ``batch``
(decoding requests and concatenating them), ``forward`` and ``reply``; every heartbeat also
gives the distribution of rows a forward pass (``batch_rows_*``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from api.errors import UserError
from api.namedarray import NamedArray, concatenate
from api.policy import Policy, RolloutRequest
from system.errors import ParameterNotFoundError, PeerTimeoutError
from system.parameters.interfaces import ParameterSubscriber
from system.roles import Role
from system.streams.inference import InferenceServer, PendingRequest
from system.timing import BatchSizes
from system.workers.base import Worker

logger = logging.getLogger(__name__)

EVAL_TAG = "eval"
"""The parameter service's tag of the version a policy worker holds for evaluation."""


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
        make_copy: Callable[[], Policy] | None = None,
        eval_tag: str = EVAL_TAG,
    ):
        super().__init__(worker_id)
        self.policy_name = policy_name
        self.policy = policy
        self.server = server
        self.params = params
        self.max_batch_rows = max_batch_rows
        self.max_wait_ms = max_wait_ms
        self.make_copy = make_copy
        """Builds a second instance of the policy, for holding a version (None: cannot hold)."""
        self.eval_tag = eval_tag
        """This worker's tag of the version it holds: each worker moves only its own, so none
        lets go of (and deletes the file of) a version another one holds."""
        self.held: Policy | None = None
        """The version evaluation requests get while held; None: they get the newest."""
        self.held_round = 0
        self.cannot_hold = False
        self._spare: Policy | None = None
        self.batch_sizes = BatchSizes()
        self.policy.eval_mode()

    def poll(self) -> int:
        clock = self.stages
        clock.enter("load_params")
        self._update_parameters()
        clock.enter("wait_requests")
        if not self.server.wait(timeout_ms=50):
            return 0
        clock.enter("batch")
        pending = self.server.gather(self.max_batch_rows, self.max_wait_ms)
        if not pending:
            return 0
        started = time.perf_counter()
        if self.held is None:
            rows = self._answer(pending, self.policy)
        else:  # two forward passes when both kinds wait: the held version is another network
            evaluation: list[PendingRequest] = []
            training: list[PendingRequest] = []
            for p in pending:
                (evaluation if _evaluation_only(p.request) else training).append(p)
            rows = self._answer(training, self.policy) + self._answer(evaluation, self.held)
        self._count(pending, rows, time.perf_counter() - started)
        return rows

    def _answer(self, pending: list[PendingRequest], policy: Policy) -> int:
        """One rollout of ``policy`` over these requests; every actor gets its rows back."""
        if not pending:
            return 0
        self.stages.enter("batch")
        requests = [self._with_state(p.request) for p in pending]
        # One request (the common case when actors send all their environments at once) needs
        # neither concatenating nor slicing: both copy every field.
        request = requests[0] if len(requests) == 1 else concatenate(requests)
        self.stages.enter("forward")
        result = policy.rollout(request)
        self.batch_sizes.add(_answered_rows(self.policy_name, policy, request, result))
        self.stages.enter("reply")
        version = policy.version
        if len(pending) == 1:
            self.server.reply(pending[0], result, version)
            return pending[0].rows
        offset = 0
        for p in pending:
            rows = p.rows
            self.server.reply(p, result[offset : offset + rows], version)
            offset += rows
        return offset

    # ----------------------------------------------------------------- holding a version
    def hold_evaluation(
        self, round_: int, version: int | None = None, *, or_loaded: bool = False
    ) -> int | None:
        """Answer evaluation requests with one version until :meth:`release`: ``version`` (from
        the parameter service), or the one loaded now. Either is tagged :attr:`eval_tag` there
        first, so the service keeps it and writes its file. Returns the version held, or None
        if this worker cannot hold (no copy of the policy can be built; the stats say so, for
        the controller) or the service could not give or tag it (logged; no episode of the
        round's version comes from this worker, and the controller's round ends for it).

        ``or_loaded``: where the service no longer has ``version``, hold the loaded one instead
        (said at INFO: a fast trainer's newest version, named when a round opens, is often gone
        by the time the order arrives; the round then holds what the first worker held)."""
        if self.make_copy is None or self.params is None:
            self.cannot_hold = True
            return None
        try:
            checkpoint = self._checkpoint_to_hold(version)
        except ParameterNotFoundError as e:
            if not or_loaded or version is None:
                logger.warning("%s: cannot hold a version for evaluation: %s", self.worker_id, e)
                return None
            logger.info("%s: %s; holding the loaded version", self.worker_id, e)
            return self.hold_evaluation(round_)
        except PeerTimeoutError as e:
            logger.warning("%s: cannot hold a version for evaluation: %s", self.worker_id, e)
            return None
        if self._spare is None:
            self._spare = self.make_copy()
            self._spare.eval_mode()
        self._spare.load_checkpoint(checkpoint)
        self.held, self.held_round = self._spare, round_
        logger.info("%s: evaluation holds version %d (round %d)", self.worker_id,
                    self._spare.version, round_)  # fmt: skip
        return self._spare.version

    def _checkpoint_to_hold(self, version: int | None):
        if version is not None and version != self.policy.version:
            checkpoint = self.params.get(self.policy_name, version)[1]  # another worker's
            self.params.tag(self.policy_name, version, self.eval_tag)
            return checkpoint
        try:
            self.params.tag(self.policy_name, self.policy.version, self.eval_tag)
        except ParameterNotFoundError:  # this worker fell behind: the service let it go
            self._load(*self.params.get(self.policy_name))
            self.params.tag(self.policy_name, self.policy.version, self.eval_tag)
        return self.policy.get_checkpoint()

    def release(self) -> None:
        """Evaluation requests get the newest version again."""
        self.held = None

    def collect_stats(self) -> dict:
        """Every heartbeat says what is held (a lost one must not leave the controller
        waiting), or that nothing can be."""
        if self.held is not None:
            self.stats["held_version"] = self.held.version
            self.stats["held_round"] = self.held_round
        elif self.cannot_hold:
            self.stats["hold_unsupported"] = 1
        self.stats.update(self.batch_sizes.take())
        epsilon = getattr(self.policy, "current_epsilon", None)
        if epsilon is not None:  # the exploration the actors get now (a Q policy's epsilon)
            self.stats["epsilon"] = float(epsilon)
        return super().collect_stats()

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


def _evaluation_only(request: RolloutRequest) -> bool:
    """A request of an evaluation actor: every row greedy (actors never mix the two)."""
    flags = request.is_evaluation
    return flags is not None and bool(np.all(flags))


def _answered_rows(name: str, policy: Policy, request: RolloutRequest, result) -> int:
    """The batch's rows, once its answer is checked to have an action for each: a policy of
    one's own that answers with fewer or more rows is named here, rather than as a numpy error
    in the actor that records the answer."""
    rows = len(request.on_reset)
    try:
        answered = len(result.action)
    except TypeError:
        answered = None
    if answered != rows:
        raise UserError(
            f"policy '{name}' ({type(policy).__name__}).rollout answered a batch of {rows} "
            f"observations with {answered if answered is not None else 'no'} actions: a "
            "RolloutResult holds one row per observation, in the request's order"
        )
    for field_name in ("policy_output", "policy_state"):
        value = getattr(result, field_name, None)
        if value is not None and not isinstance(value, NamedArray):
            raise UserError(
                f"policy '{name}' ({type(policy).__name__}).rollout returned a "
                f"{type(value).__name__} as {field_name}: a NamedArray is needed (e.g. "
                "NamedArray(log_prob=..., value=...) from api.namedarray), or None"
            )
    return rows
