"""The controller's tally: typed heartbeat stats in, a metrics record and a display snapshot out.

Every metric key of the run's own figures is made here (``env_frames``, ``fps``,
``episode_return``, ``eval/...``, ``policy/<name>/...``, ``trainer/<name>/...``,
``worker_health/...``, ``timing/...``, ``custom/...``); the coordination drivers add theirs
(curriculum stage, PBT scores, ratings) to the record the controller writes.

What happens with the episodes and trainer stats besides counting (the user's callbacks, the
curriculum, PBT, ratings) is the observers' business: the tally calls each
:class:`TallyObserver` as figures come, as Sample Factory's runner does for its reporters.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from api.config import ExperimentConfig
from system import timing
from system.errors import WireError
from system.roles import Role, WorkerState
from system.run.display import PolicyLine, Snapshot, WorkerLine
from system.run.episodes import EpisodeRecord, EpisodeWindow, is_custom, is_number
from system.run.plan import WorkerPlan
from system.run.stopping import EvaluationWindows, judged_policy
from system.run.worker_record import WorkerRecord
from system.workers.trainer_hooks import CUSTOM_STAT

logger = logging.getLogger(__name__)

RETURNS_WINDOW = 100
"""Training episodes the ``episode_return`` of a record averages (``evaluation.policy``'s
return in them, where one is named)."""
ENDLESS_STEPS = 100_000
"""Steps of every training environment with no episode ended anywhere, after which the run
says that its environment may never end one (returns, evaluation and the stop target need
ends; a long episode of a real task, a game of Atari, ends far sooner)."""

FPS_WINDOW_S = 10.0
"""Seconds of records the recent frame rate (``fps_recent``) is measured over. ``fps``, the
mean since the launch, still counts the start-up minutes long after a run has reached speed;
what the live panel and the metrics endpoint show is this one."""

RECOVERED = {
    "worker_health/env_resets": "env_errors",
    "worker_health/dropped_episodes": "nonfinite_episodes",
}
"""Record keys of what the actors recovered from, losing some steps, and the actor stat each
counts: environments rebuilt after they raised or broke the contract
(``actors.on_env_error=reset``), episodes dropped for a NaN (``actors.on_nonfinite``)."""


@dataclass(frozen=True)
class WorkerStats:
    """One heartbeat's stats, checked: what any role may report, and the rest as numbers."""

    env_frames: int = 0
    eval_env_frames: int = 0
    frames_per_step: int = 1
    """An actor's emulator frames a step (``Environment.frames_per_step``)."""
    episodes: list[EpisodeRecord] = field(default_factory=list)
    """Finished training episodes."""
    eval_episodes: list[EpisodeRecord] = field(default_factory=list)
    epsilon: float | None = None
    """The exploration rate a policy worker acts with."""
    peak_rss_mb: float = 0.0
    numbers: dict[str, int | float] = field(default_factory=dict)
    """Every number it reported, as it was (an int stays one), timing stages aside: a
    trainer's losses, the ``version`` a worker holds, ..."""
    timing: dict[str, float] = field(default_factory=dict)
    """Seconds per stage since the last heartbeat (:mod:`system.timing`)."""
    flags: dict[str, bool] = field(default_factory=dict)
    """What it reported as true or false (a policy worker's ``hold_unsupported``)."""

    @classmethod
    def from_heartbeat(cls, stats: dict[str, Any]) -> WorkerStats:
        """Raises :class:`WireError` naming the field that does not fit."""
        timed = {k: float(v) for k, v in stats.items() if is_number(v)}
        rest = timing.without_timing(stats)
        numbers = {k: v for k, v in rest.items() if is_number(v)}
        return cls(
            env_frames=_count(rest, "env_frames"),
            eval_env_frames=_count(rest, "eval_env_frames"),
            frames_per_step=max(1, _count(rest, "frames_per_step")),
            episodes=_episodes(rest, "episodes"),
            eval_episodes=_episodes(rest, "eval_episodes"),
            epsilon=_float_or_none(numbers.get("epsilon")),
            peak_rss_mb=float(numbers.get("peak_rss_mb", 0.0)),
            numbers=numbers,
            timing={k: v for k, v in timed.items() if k not in rest},
            flags={k: v for k, v in rest.items() if isinstance(v, bool)},
        )


def _float_or_none(value: int | float | None) -> float | None:
    return None if value is None else float(value)


def _count(stats: dict[str, Any], key: str) -> int:
    value = stats.get(key, 0)
    if type(value) is not int or value < 0:
        raise WireError(f"heartbeat stats: '{key}' must be an int >= 0, got {value!r}")
    return value


def _episodes(stats: dict[str, Any], key: str) -> list[EpisodeRecord]:
    records = stats.get(key, [])
    if not isinstance(records, list):
        raise WireError(f"heartbeat stats: '{key}' must be a list, got {records!r}")
    try:
        return [EpisodeRecord.from_wire(record) for record in records]
    except WireError as e:
        raise WireError(f"heartbeat stats: an entry of '{key}': {e}") from None


class TallyObserver(Protocol):
    """Who hears of episodes and trainer stats as they are tallied."""

    def on_episodes(self, episodes: list[EpisodeRecord], evaluation: bool) -> None: ...
    def on_evaluation(self, mean_return: float | None, episodes: list[EpisodeRecord]) -> None:
        """Each time another ``evaluation.episodes`` greedy episodes have finished."""

    def on_train_stats(self, policy: str, stats: dict[str, float]) -> None: ...


def timing_role(plan: WorkerPlan) -> str:
    """The role a worker's timings are tallied under: evaluation actors apart from training
    ones (they are held to a pace, and wait for it by design)."""
    return "eval_actor" if getattr(plan, "evaluation", False) else str(plan.role)


def _policy_line(trainer: dict[str, float]) -> PolicyLine:
    return PolicyLine(int(trainer.get("version", 0)), trainer.get("version_lag"), trainer)


class Tally:
    def __init__(self, config: ExperimentConfig, observers: Iterable[TallyObserver] = ()):
        self.config = config
        self.observers = list(observers)
        self.env_frames = 0
        self.eval_env_frames = 0
        self.frames_per_step = 1
        """The actors' emulator frames a step: where more than 1, a record has
        ``emulator_frames`` (and the panel emulator frames a second) beside ``env_frames``."""
        self.returns: deque[float] = deque(maxlen=RETURNS_WINDOW)
        self.game_returns: deque[float] = deque(maxlen=RETURNS_WINDOW)
        """Whole games' unclipped scores, where the environment reports one at a game's end
        (``info["game_return"]``, as Atari-v0 does: its episodes are lives, rewards clipped)."""
        self.evaluation = EvaluationWindows(
            config.stop.eval_return,
            config.evaluation.episodes,
            config.stop.confirm_windows,
            policy=judged_policy(config),
            max_return=config.stop.max_return,
            envs=config.evaluation.workers * config.evaluation.envs_per_worker,
        )
        """The greedy windows the stop rule judges (:mod:`system.run.stopping`)."""
        self.train_window = EpisodeWindow(RETURNS_WINDOW)
        self.eval_window = EpisodeWindow(config.evaluation.episodes)
        self.eval_count = 0
        self.trainer_stats: dict[str, dict[str, float]] = {}
        """Each trained policy's newest trainer stats (``version``, ``steps``, losses...)."""
        self.exploration: dict[str, dict[str, float]] = {}
        """Each policy's exploration rate (epsilon) by the policy worker acting with it."""
        self.timing = timing.RoleTimes()
        """Where each role's wall time goes (system.timing), from every heartbeat."""
        self.episodes_ended = 0
        """Training and evaluation episodes ended since the controller started."""
        self.recovered = dict.fromkeys(RECOVERED, 0)
        """What the actors recovered from since the controller started, by record key."""
        self._frames_before = 0
        """The frames of a resumed run before this controller: counted from its records."""
        self._endless_said = False
        self._frames_at: deque[tuple[float, int]] = deque()
        """``(elapsed, env_frames)`` of the records of the last :data:`FPS_WINDOW_S`, and
        the one just before them."""

    def _check_episodes_end(self) -> None:
        """Say once that no episode has ended though every training environment has stepped
        :data:`ENDLESS_STEPS` times: the live panel's ``return -`` alone does not tell why."""
        envs = self.config.actors.workers * self.config.actors.envs_per_worker
        steps = self.env_frames - self._frames_before
        if self.episodes_ended or self._endless_said or steps < ENDLESS_STEPS * envs:
            return
        self._endless_said = True
        logger.warning(
            "no episode has ended in %d environment steps (%d per environment): does "
            "environment '%s' ever end one? Training goes on, but episode returns, evaluation "
            "and stop.eval_return need episodes that end: give it a time limit (gymnasium's "
            "max_episode_steps, or truncated=True)",
            steps, steps // max(envs, 1), self.config.environment.type,
        )  # fmt: skip

    def continue_from(self, last: dict[str, Any] | None) -> float:
        """A resumed run counts frames on from its last record (None: a new run), evaluation
        frames too (they went back to 0 on every resume); the wall-clock seconds it ran (0.0
        for a new run), from which the run's clock goes on."""
        if not last:
            return 0.0
        self.env_frames = self._frames_before = int(last.get("env_frames") or 0)
        self.eval_env_frames = int(last.get("eval_env_frames") or 0)
        return float(last.get("wall_s") or 0.0)

    def add(self, record: WorkerRecord, stats: WorkerStats) -> None:
        """One heartbeat's stats from the worker ``record``."""
        plan = record.plan
        policy = str(getattr(plan, "policy", ""))
        self.timing.add(timing_role(plan), plan.worker_id, stats.timing)
        if plan.role is Role.ACTOR:
            self._add_actor(stats)
        elif plan.role is Role.POLICY:
            if policy == self.evaluation.policy:
                self.evaluation.on_worker_stats({**stats.numbers, **stats.flags})  # its hold
            if stats.epsilon is not None:  # what the actors act with
                self.exploration.setdefault(policy, {})[plan.worker_id] = stats.epsilon
        elif plan.role is Role.TRAINER and stats.numbers:
            version = stats.numbers.get("version")
            if policy == self.evaluation.policy and type(version) is int:
                self.evaluation.on_trainer_version(version)  # what a hold order names
            numbers = {k: float(v) for k, v in stats.numbers.items()}
            self.trainer_stats.setdefault(policy, {}).update(numbers)
            for o in self.observers:
                o.on_train_stats(policy, numbers)
        if stats.numbers:  # a heartbeat sent during a long poll has none: keep the last ones
            record.stats = dict(stats.numbers)
        record.peak_rss_mb = max(record.peak_rss_mb, stats.peak_rss_mb)

    def _add_actor(self, stats: WorkerStats) -> None:
        self.env_frames += stats.env_frames
        self.frames_per_step = max(self.frames_per_step, stats.frames_per_step)
        for key, stat in RECOVERED.items():
            self.recovered[key] += int(stats.numbers.get(stat, 0))
        self.episodes_ended += len(stats.episodes) + len(stats.eval_episodes)
        self._check_episodes_end()
        self.eval_env_frames += stats.eval_env_frames
        # the judged policy's, as the evaluation return is: a zero-sum game's mean over every
        # agent is 0 whatever is learned, and was drawn beside the judged one's on one plot
        judged = (e.policy_return(self.config.evaluation.policy) for e in stats.episodes)
        self.returns.extend(r for r in judged if r is not None)
        self.game_returns.extend(e.game_return for e in stats.episodes if e.game_return is not None)
        self.train_window.extend(stats.episodes)
        for o in self.observers:
            o.on_episodes(stats.episodes, evaluation=False)
            o.on_episodes(stats.eval_episodes, evaluation=True)
        for e in stats.eval_episodes:
            # a mapping may leave the judged policy out of an episode: it does not count
            judged = e.policy_return(self.config.evaluation.policy)
            if judged is None:
                continue
            held = self.evaluation.policy  # None: no version is held, any may play
            self.evaluation.add(
                judged,
                None if held is None else e.versions.get(held),
                env=e.env,
                started_at=e.started_at,
            )
            self.eval_window.extend([e])
            self.eval_count += 1
            if self.eval_count % self.config.evaluation.episodes == 0:
                for o in self.observers:
                    o.on_evaluation(self.evaluation.mean(), list(self.eval_window.episodes))

    # ------------------------------------------------------------- what comes out
    def record(
        self, elapsed: float, workers: Iterable[WorkerRecord], custom: dict[str, float]
    ) -> tuple[dict[str, Any], dict[str, timing.RoleShares]]:
        """The metrics record for now (and the roles' time shares, for the bottleneck line);
        ``custom``: what the user's callbacks logged."""
        workers = list(workers)
        record: dict[str, Any] = {
            "wall_s": elapsed,
            "env_frames": self.env_frames,
            "fps": self.env_frames / max(elapsed, 1e-9),
            "fps_recent": self._recent_fps(elapsed),
            "eval_env_frames": self.eval_env_frames,
            **self._emulator_frames(),
            "episode_return": float(np.mean(self.returns)) if self.returns else None,
            "eval_return": self.evaluation.mean(),
            "game_return": float(np.mean(self.game_returns)) if self.game_returns else None,
            "worker_health/alive": sum(w.state is WorkerState.ALIVE for w in workers),
            "worker_health/restarts": sum(w.restarts for w in workers),
            **self.recovered,
        }
        # episode_length, policy/<name>/episode_return, episode_info/<key>: means of the window
        record.update({k: v for k, v in self.train_window.means().items() if k not in record})
        record.update(self.eval_window.means("eval/"))
        record.update(self.evaluation.figures())  # the version evaluation holds, if any
        record.update(custom)
        for name, by_worker in self.exploration.items():
            record[f"policy/{name}/epsilon"] = float(np.mean(list(by_worker.values())))
        for name, stats in self.trainer_stats.items():
            record[f"policy/{name}/version"] = stats.get("version")
            for k, v in stats.items():
                # a trainer callback's numbers (system.workers.trainer_hooks): the policy's own
                own = k.startswith(CUSTOM_STAT)
                record[f"policy/{name}/{k}" if own else f"trainer/{name}/{k}"] = v
        roles = self.timing.take()
        record.update(timing.record(roles))
        record.update({f"timing/{k}": v for k, v in self.timing.take_batches().items()})
        return record, roles

    def _emulator_frames(self) -> dict[str, int]:
        """``emulator_frames``, where a step covers several (Atari): ``env_frames`` counts
        agent steps, and a rate read as emulator frames (as Sample Factory's is) is 4x it."""
        if self.frames_per_step == 1:
            return {}
        return {"emulator_frames": self.env_frames * self.frames_per_step}

    def written_timing(self) -> dict[str, float]:
        """The ``timing/...`` keys of a record written to the run's file: over the time since
        the previous written record (a thinned file keeps one a minute after a day), where the
        record itself has its last second's, as the live panel shows them."""
        return self.timing.take_written()

    def _recent_fps(self, elapsed: float) -> float | None:
        """Frames a second over the last :data:`FPS_WINDOW_S` of records (fewer at the start
        of a run); None for the first record."""
        seen = self._frames_at
        seen.append((elapsed, self.env_frames))
        while len(seen) > 2 and elapsed - seen[1][0] >= FPS_WINDOW_S:
            seen.popleft()
        since, frames = seen[0]
        return (self.env_frames - frames) / (elapsed - since) if elapsed > since else None

    def snapshot(
        self,
        record: dict[str, Any],
        roles: dict[str, timing.RoleShares],
        workers: Iterable[WorkerRecord],
        now: float,
    ) -> Snapshot:
        """What the live panel shows (:mod:`system.run.display`), from the record just made."""
        return Snapshot(
            elapsed_s=record["wall_s"],
            env_frames=record["env_frames"],
            fps=record["fps"] if record["fps_recent"] is None else record["fps_recent"],
            frames_per_step=self.frames_per_step,
            episode_return=record["episode_return"],
            eval_return=record["eval_return"],
            game_return=record["game_return"],
            target=self.config.stop.eval_return,
            custom={
                _custom_label(k): float(v)
                for k, v in record.items()
                if is_custom(k) and not k.endswith(("/min", "/max"))
            },
            policies={name: _policy_line(s) for name, s in self.trainer_stats.items()},
            workers=tuple(
                WorkerLine(
                    id=w.plan.worker_id,
                    role=str(w.plan.role),
                    state=w.state,
                    restarts=w.restarts,
                    heartbeat_age_s=now - w.last_seen,
                )
                for w in workers
            ),
            bottleneck=timing.bottleneck(roles.values()),
        )

    def trainer_steps_reached(self, steps: int) -> bool:
        """Whether every trained policy's trainer has done ``steps`` steps."""
        return bool(self.trainer_stats) and all(
            s.get("steps", 0) >= steps for s in self.trainer_stats.values()
        )


def _custom_label(key: str) -> str:
    """How the panel names a logged number: ``name``, or ``policy:name`` for one policy's."""
    parts = key.split("/")
    return "/".join(parts[1:]) if parts[0] == "custom" else f"{parts[1]}:{'/'.join(parts[3:])}"
