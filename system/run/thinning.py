"""Which of the controller's records a long run writes to its folder (``metrics.thin``).

The controller makes a record a second for the live panel, the Prometheus endpoint and the stop
rules. Written whole for days, that is hundreds of MB a day each of ``metrics.jsonl`` and
TensorBoard events, which reading the run back (the summary, the plots, TensorBoard, a notebook)
then pays for. A record is state, not an increment (means of the last episodes, counters, the
latest losses), so leaving some out samples the curves without losing a frame or an episode.
Stage times are the exception: a written record's are over the time since the record written
before it (:meth:`system.timing.RoleTimes.take_written`), not over its last second.

What the summary reads as a first or an extreme stays exact: each change of the evaluation
result (``best_eval_return``, ``first_eval_at_target``) is written, and the best training return
is kept here for the summary (a rising return makes a new best nearly every record, so writing
each would leave little thinned). The caller also forces the record that met a stop rule and the
last one.
"""

from __future__ import annotations

import math
from typing import Any


class Thinning:
    """Says of each record in turn whether it is written."""

    def __init__(self, steps: list[list[float]]):
        self.steps = sorted((float(after), float(every)) for after, every in steps)
        """``(after_s, every_s)``: from ``after_s`` seconds of the run, one record per
        ``every_s`` seconds."""
        self._slot: tuple[float, int] | None = None  # the time slot of the last record written
        self._eval: Any = None  # the last evaluation result shown
        self.best_return: float | None = None
        """The best ``episode_return`` of every record shown, written or not."""

    def every_s(self, wall_s: float) -> float | None:
        """The spacing of written records at ``wall_s``; None: every record."""
        every = None
        for after, step in self.steps:
            if wall_s >= after:
                every = step
        return every

    def keep(self, record: dict[str, Any]) -> bool:
        """Whether ``record`` (with its ``wall_s``) is written; every record must be shown, in
        order, as a change of the evaluation result is judged against the one before it."""
        result = record.get("eval_return")
        new_result = result is not None and result != self._eval
        self._eval = result
        ret = record.get("episode_return")
        if isinstance(ret, (int, float)) and (self.best_return is None or ret > self.best_return):
            self.best_return = float(ret)
        wall = float(record.get("wall_s") or 0.0)
        every = self.every_s(wall)
        slot = None if every is None else (every, math.floor(wall / every))
        if every is not None and slot == self._slot and not new_result:
            return False
        self._slot = slot
        return True
