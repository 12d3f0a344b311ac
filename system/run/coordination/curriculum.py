"""The curriculum: the controller moves the run to the next stage when a metric crosses its
threshold; every actor follows the stage through the global state.

:class:`CurriculumDriver` runs in the controller. It reads each metrics record, and when the
watched metric reaches the current stage's threshold (after ``min_episodes`` training episodes
in that stage), it writes ``{"index": k, "stage": stages[k]}`` under the configured key.
:class:`CurriculumFollower` runs in every actor, on its heartbeat: when the key's version
changes, it calls ``set_curriculum_stage`` on each of the actor's environments. The stage is in
the global state, so an actor restarted mid-run, or a resumed run, starts in the stage reached.
"""

from __future__ import annotations

import difflib
import logging
import weakref
from typing import Any

from api.config.league import CurriculumConfig
from api.global_state import GlobalState
from system.errors import EnvironmentFailure
from system.logs import NOTICE

logger = logging.getLogger(__name__)

ABSENT_AFTER_EPISODES = 100
"""Training episodes after which a watched metric in no record is said to be missing."""


class CurriculumDriver:
    """Decides the stage from the run's metrics (in the controller)."""

    def __init__(self, config: CurriculumConfig, state: GlobalState):
        self.config = config
        self.state = state
        self.stages = list(config.stages) or list(range(len(config.thresholds) + 1))
        current, _ = state.get(config.key)
        self.index = int(current["index"]) if isinstance(current, dict) else 0
        if current is None:
            state.set(config.key, {"index": 0, "stage": self.stages[0]})
        self.episodes_in_stage = 0
        self.episodes_seen = 0
        self._absent_said = False

    def on_episodes(self, count: int) -> None:
        self.episodes_in_stage += count
        self.episodes_seen += count

    def on_record(self, record: dict[str, Any]) -> dict[str, Any]:
        """Advance if the metric reached the threshold; the stage, for the metrics record."""
        value = record.get(self.config.metric)
        if self.config.metric not in record:
            self._say_absent(record)
        if (
            self.index < len(self.config.thresholds)
            and isinstance(value, (int, float))
            and value >= self.config.thresholds[self.index]
            and self.episodes_in_stage >= self.config.min_episodes
        ):
            self.index += 1
            self.episodes_in_stage = 0
            self.state.set(self.config.key, {"index": self.index, "stage": self.stages[self.index]})
            logger.log(
                NOTICE,
                "curriculum: %s reached %g; moving to stage %d (%r)",
                *(self.config.metric, value, self.index, self.stages[self.index]),
            )
        return {"curriculum/stage": self.index}

    def _say_absent(self, record: dict[str, Any]) -> None:
        """Once :data:`ABSENT_AFTER_EPISODES` episodes have ended with the watched metric in no
        record, say so: a misspelt one (``episode_retrun``) left the run in stage 0 in silence.
        (A key of episodes' info or of a callback comes with the first episode that has it.)"""
        if self._absent_said or self.episodes_seen < ABSENT_AFTER_EPISODES:
            return
        self._absent_said = True
        close = difflib.get_close_matches(self.config.metric, list(record), n=1, cutoff=0.6)
        logger.warning(
            "curriculum.metric '%s' is in no metrics record after %d episodes, so the "
            "curriculum stays in stage %d%s",
            self.config.metric, self.episodes_seen, self.index,
            f"; did you mean '{close[0]}'?" if close else
            " (metrics.jsonl has every key a record holds)",
        )  # fmt: skip


class CurriculumFollower:
    """Keeps an actor's environments in the run's stage (on the actor's heartbeat).

    An environment the actor rebuilt after an error is found on the next heartbeat and moved
    to the stage then."""

    def __init__(self, state: GlobalState, worker: Any, key: str):
        self.state = state
        self.worker = worker
        self.key = key
        self.seen = 0
        """The version of the key last applied."""
        self.stage: Any = None
        self.staged: weakref.WeakSet = weakref.WeakSet()
        """The environments already told ``stage``."""

    def __call__(self) -> None:
        value, version = self.state.get(self.key)
        if version != self.seen and isinstance(value, dict) and "stage" in value:
            self.seen, self.stage = version, value["stage"]
            self.staged = weakref.WeakSet()
        if self.seen == 0:
            return
        for e, env in enumerate(self.worker.envs):
            if env not in self.staged:
                self._tell(e, env)

    def _tell(self, e: int, env: Any) -> None:
        try:
            env.set_curriculum_stage(self.stage)
        except Exception as err:
            raise EnvironmentFailure(
                f"environment {e} of {self.worker.worker_id} raised in "
                f"set_curriculum_stage({self.stage!r}): {err!r}"
            ) from err
        self.staged.add(env)
