"""The controller's global coordination: the run's key/value state and what drives it.

One object the controller consults at a few points of its loop: a worker's configuration (the
state as it is), each heartbeat (the entries that worker lacks go back in the ``ack``), a
``state_write`` (answered, or refused with the reason), finished episodes and trainer stats (for
the curriculum and PBT drivers), and each metrics record (the drivers decide; their figures join
the record; the state is saved to the run folder when it changed). In a worker,
:func:`follow_coordination` adds following the curriculum, PBT orders or an evaluation hold
(:mod:`.evaluation_hold`) to its heartbeat.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from api import global_state
from api.config import ExperimentConfig
from api.global_state import GlobalState
from system.errors import WireError
from system.ratelimit import BadMessages
from system.roles import Role
from system.run.control_protocol import StateResult, StateWrite
from system.run.coordination.curriculum import CurriculumDriver, CurriculumFollower
from system.run.coordination.evaluation_hold import HOLD_KEY, EvaluationHold
from system.run.coordination.pbt import PBTDriver
from system.run.coordination.ratings import Ratings
from system.run.coordination.state import StateStore, answer_write
from system.run.episodes import EpisodeRecord
from system.run.plan import WorkerPlan
from system.run.stopping import judged_policy

logger = logging.getLogger(__name__)


class Coordination:
    def __init__(self, config: ExperimentConfig, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.store = StateStore.load(self.run_dir)  # a resumed run goes on with its state
        global_state.install(self.store)  # the controller's callbacks read and write this one
        self.curriculum = (
            CurriculumDriver(config.curriculum, self.store) if config.curriculum.metric else None
        )
        self.pbt = PBTDriver(config, self.store, self.run_dir) if config.pbt.members else None
        self.ratings = Ratings(config, self.run_dir, self.store)
        # a resumed run's state may still hold a version: the first order releases it
        self._hold_said = self.store.get(HOLD_KEY)[0]
        self.bad_writes = BadMessages(logger, "global state writes")

    def snapshot(self) -> dict[str, Any]:
        """The whole state, for a worker's configuration."""
        return self.store.snapshot()

    def changes(self, revision: int | None) -> dict[str, Any] | None:
        """For a heartbeat's answer: the entries changed since the revision the worker has
        (None: it is up to date, or follows no state)."""
        return None if revision is None else self.store.changes_since(revision)

    def write(self, request: StateWrite, may_write: bool) -> StateResult:
        reply, error = answer_write(self.store, request, may_write)
        if error is not None:
            self.bad_writes.record(error)
        return reply

    def refuse(self, body: Any, error: WireError) -> StateResult:
        """The answer to a ``state_write`` that does not parse, naming the field."""
        self.bad_writes.record(error)
        ident = body.get("id") if isinstance(body, dict) else None
        return StateResult(ident if type(ident) is int else None, False, error=str(error))

    def on_episodes(self, episodes: list[EpisodeRecord], evaluation: bool) -> None:
        self.ratings.on_episodes(episodes)
        if self.curriculum is not None and not evaluation:
            self.curriculum.on_episodes(len(episodes))
        if self.pbt is not None and evaluation:
            self.pbt.on_eval_episodes(episodes)

    def on_train_stats(self, policy: str, stats: dict[str, float]) -> None:
        if self.pbt is not None:
            self.pbt.on_train_stats(policy, stats)

    def on_evaluation(self, mean_return: float | None, episodes: list[EpisodeRecord]) -> None:
        """Evaluation windows reach the drivers episode by episode (:meth:`on_episodes`)."""

    def on_record(self, record: dict[str, Any]) -> dict[str, Any]:
        """The drivers' figures for this metrics record (after they acted on it)."""
        extra: dict[str, Any] = self.ratings.on_record()
        if self.curriculum is not None:
            extra.update(self.curriculum.on_record(record))
        if self.pbt is not None:
            extra.update(self.pbt.on_record(record))
        self.store.save(self.run_dir)
        return extra

    def summary(self) -> dict[str, Any]:
        """What the drivers add to summary.json."""
        out: dict[str, Any] = {}
        if self.curriculum is not None:
            out["curriculum_stage"] = self.curriculum.index
        if self.pbt is not None:
            out["pbt"] = self.pbt.summary()
        if self.ratings.players:
            out["ratings"] = self.ratings.summary()
        return out

    def stop_reason(self) -> str:
        return self.pbt.stop_reason() if self.pbt is not None else ""

    def say_hold(self, order: dict[str, Any] | None) -> None:
        """Tell the judged policy's workers, through the global state, to hold the version
        they have for evaluation (or to stop holding), when the order changed
        (:meth:`system.run.stopping.EvaluationWindows.hold_order`)."""
        if order != self._hold_said:
            self.store.set(HOLD_KEY, order)
            self._hold_said = order

    def close(self) -> None:
        self.store.save(self.run_dir)
        if self.pbt is not None:
            self.pbt.close()
        global_state.install(None)


# ----------------------------------------------------------------------- in a worker
def follow_coordination(
    state: GlobalState, plan: WorkerPlan, cfg: ExperimentConfig, worker: Any
) -> list[Callable[[], None]]:
    """The heartbeat hooks by which ``worker`` follows the run: the curriculum (actors), PBT
    orders (a PBT member's trainer) or the hold of a version for evaluation (the judged
    policy's policy workers). Each has run once already: a restarted worker joins the run's
    stage or order before its first step."""
    policy = getattr(plan, "policy", "")
    follow: Callable[[], None] | None = None
    if plan.role is Role.ACTOR and cfg.curriculum.metric:
        follow = CurriculumFollower(state, worker, cfg.curriculum.key)
    elif plan.role is Role.POLICY and policy == judged_policy(cfg):
        follow = EvaluationHold(state, worker)
    elif plan.role is Role.TRAINER and policy in cfg.pbt.members:
        from system.run.coordination.pbt import PBTMember

        args = cfg.policies[policy].trainer.args
        follow = PBTMember(state, worker, {k: args[k] for k in cfg.pbt.hyperparameters})
    if follow is None:
        return []
    follow()
    return [follow]
