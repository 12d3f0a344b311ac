"""When is a run solved: the greedy evaluation mean, confirmed on fresh episodes.

One window of ``evaluation.episodes`` greedy episodes can reach a target by luck (a run marked
solved once re-evaluated at 365.7 of 475). So the first window that reaches the target only makes
the run a candidate; it is solved once ``stop.confirm_windows`` consecutive windows did, each one
made of episodes that finished after the previous window. A window that falls short drops the
candidate, and the next window to reach the target starts over.
"""

from __future__ import annotations

import logging
from collections import deque

import numpy as np

logger = logging.getLogger(__name__)


class EvaluationWindows:
    """Greedy evaluation returns as they arrive, and the confirmation of a target."""

    def __init__(self, target: float | None, episodes: int, windows: int = 1):
        self.target = target
        self.episodes = episodes
        self.windows = windows
        self.returns: deque[float] = deque(maxlen=episodes)
        self.count = 0
        self.confirmed: list[float] = []
        """Means of the consecutive windows that reached the target so far."""
        self._window_end = 0

    def add(self, episode_return: float) -> None:
        self.returns.append(float(episode_return))
        self.count += 1

    def mean(self) -> float | None:
        """The mean of the last ``episodes`` returns, once that many arrived."""
        if len(self.returns) < self.episodes:
            return None
        return float(np.mean(self.returns))

    def solved(self) -> bool:
        """Whether ``windows`` consecutive windows reached the target (call after adding)."""
        mean = self.mean()
        if self.target is None or mean is None:
            return False
        if not self.confirmed:
            if mean >= self.target:
                self._next_window(mean)
        elif self.count >= self._window_end:
            if mean >= self.target:
                self._next_window(mean)
            else:
                logger.info("evaluation mean %.1f did not confirm %s", mean, self.confirmed)
                self.confirmed = []
        return len(self.confirmed) >= self.windows

    def _next_window(self, mean: float) -> None:
        self.confirmed.append(mean)
        self._window_end = self.count + self.episodes

    def describe(self) -> str:
        """How a solved run was confirmed, for its summary."""
        n = len(self.confirmed)
        means = ", ".join(f"{m:.1f}" for m in self.confirmed)
        return (
            f"greedy mean return reached {self.target:g} in {n} consecutive "
            f"window{'s' if n > 1 else ''} of {self.episodes} fresh episodes: {means}"
        )
