"""The version the judged policy's workers hold for evaluation, through the global state.

The controller's :class:`system.run.stopping.EvaluationWindows` decides: it opens a round per
version to judge, and the run's coordination writes its order under :data:`HOLD_KEY`
(:meth:`~system.run.coordination.coordinator.Coordination.say_hold`). :class:`EvaluationHold`
follows it in each policy worker of the judged policy, on its heartbeat: evaluation requests are
then answered by the held version while training goes on with the newest.
"""

from __future__ import annotations

from typing import Any

from api.global_state import GlobalState

HOLD_KEY = "evaluation/hold"
"""Global state: ``{"policy": name, "round": n, "version": v}``: hold version ``v``, the
trainer's newest when the round opened, or the one a worker said it holds (so every worker
holds that one); without ``"version"`` (no trainer stats yet), what is loaded now. None when
nothing is held."""


class EvaluationHold:
    """In a policy worker of the judged policy: follow :data:`HOLD_KEY` (on its heartbeat).

    A new round holds the version the order names, or, when it names none or the parameter
    service no longer has it, the version loaded now; when the order names another version
    later (the one the first worker to answer held), a worker takes that one instead."""

    def __init__(self, state: GlobalState, worker: Any):
        self.state = state
        self.worker = worker
        self.round = 0
        self.tried: tuple[int, int] | None = None

    def __call__(self) -> None:
        value, _ = self.state.get(HOLD_KEY)
        order = value if isinstance(value, dict) else None
        if order is None or order.get("policy") != self.worker.policy_name:
            if self.worker.held is not None:
                self.worker.release()
            self.round = 0
            return
        round_, version = order.get("round"), order.get("version")
        if type(round_) is not int:
            return
        if round_ != self.round:
            self.round, self.tried = round_, None
            if type(version) is int:  # the trainer's newest, or what is loaded if it is gone
                self.tried = (round_, version)
                self.worker.hold_evaluation(round_, version, or_loaded=True)
            else:
                self.worker.hold_evaluation(round_)
            return
        held = self.worker.held
        other = type(version) is int and (held is None or held.version != version)
        if other and self.tried != (round_, version):  # one try: a failure is logged, once
            self.tried = (round_, version)
            self.worker.hold_evaluation(round_, version)
