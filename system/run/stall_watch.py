"""Telling a run that has stopped moving from one that is slow.

Each worker's own liveness is watched elsewhere (heartbeats, a poll's bound: see
:mod:`system.run.busy_heartbeat`). What that cannot see is a run whose workers are all alive
and all waiting for one another: a trainer waiting for a replay buffer that never reaches its
``min_size``, rate-limited actors waiting for that trainer. Such a run showed ``frames 2,486
(0/s)`` for as long as it was left, and on a cluster would hold its machines for ever.

So the controller watches progress: training frames, and the steps of every trainer.
Evaluation episodes are not progress (evaluation actors play on with old versions). The clock
runs only while every worker is up: a worker starting, restarting or being scheduled explains a
pause, and its own liveness rules deal with it. After :data:`WARN_AFTER_S` without progress
the controller warns, saying what each role on the frames' path does: busy at what, or waiting
for what (:func:`system.timing.every_role`; not the panel's bottleneck line, which names one
waiter where several wait fully). After ``stop.stall_seconds`` the run fails (exit 1) with the
same words, rather than run on idle.

Frames without trainer steps are progress of a kind, and a run of them went unremarked until its
end (every episode dropped for a NaN: 179k frames, version 0). After :data:`WARN_AFTER_S` of
frames with no trainer step, every worker up, the controller warns too (a warning only: a replay
buffer may take that long to reach its ``min_size``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)

WARN_AFTER_S = 120.0
"""Seconds without progress, every worker up, before the controller warns (once a stall)."""


@dataclass
class StallWatch:
    """Progress of a run, seen once a report (about a second apart).

    ``fail_after_s``: seconds without progress after which :meth:`see` returns the failure
    message (None: never; a warning only)."""

    fail_after_s: float | None
    warn_after_s: float = WARN_AFTER_S
    trains: bool = True
    """Whether the run has a trainer: without one, frames never come with trainer steps."""
    _progress: tuple[int, float] | None = None
    _since: float | None = None
    _warned: bool = False
    _untrained: tuple[float, int, float] | None = None
    """Frames without steps: (since when, frames then, steps then)."""
    _untrained_warned: bool = False

    def see(self, now: float, progress: tuple[int, float], all_up: bool, waits: str) -> str:
        """``progress``: training frames and the trainers' summed steps; ``all_up``: whether
        every worker is up; ``waits``: what each role does (:func:`system.timing.every_role`).
        Returns why the run must fail, or an empty string."""
        self._watch_steps(now, progress, all_up, waits)
        if not all_up or progress != self._progress:
            self._progress, self._since, self._warned = progress, (now if all_up else None), False
            return ""
        if self._since is None:  # every worker has just come up: the clock starts now
            self._since = now
        idle = now - self._since
        frames, steps = progress
        what = (f"no training frames (still {frames:,}) and no trainer steps (still "
                f"{steps:g}) for {idle:.0f} s with every worker up")  # fmt: skip
        why = f"{what} ({waits})" if waits else what
        if self.fail_after_s is not None and idle >= self.fail_after_s:
            return (
                f"the run is stalled: {why}; it stops. Raise stop.stall_seconds if this run "
                "may pause that long (None: never stop for it)"
            )
        if idle >= self.warn_after_s and not self._warned:
            self._warned = True
            until = ("" if self.fail_after_s is None
                     else f"; the run fails after {self.fail_after_s:g} s of this")  # fmt: skip
            logger.warning("the run has made no progress: %s%s", why, until)
        return ""

    def _watch_steps(self, now: float, progress: tuple[int, float], all_up: bool, waits: str):
        """Warn, once a spell, when frames go on and no trainer steps for ``warn_after_s``."""
        frames, steps = progress
        start = self._untrained
        if not self.trains or not all_up or start is None or steps != start[2]:
            self._untrained = (now, frames, steps) if all_up else None
            self._untrained_warned = False
            return
        made = frames - start[1]
        if now - start[0] < self.warn_after_s or made <= 0 or self._untrained_warned:
            return
        self._untrained_warned = True
        logger.warning(
            "no trainer step for %.0f s while the actors made %s training frames with every "
            "worker up: do samples reach the trainers? (%s). Episodes dropped for a non-finite "
            "value or environments rebuilt send none (worker_health/ in metrics.jsonl); a "
            "replay buffer trains from its min_size",
            now - start[0], f"{made:,}", waits or "no timings yet",
        )  # fmt: skip
