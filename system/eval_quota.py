"""Evaluation without a bias for short episodes: a quota of episodes per environment.

Several environments step at once, and keeping the first N episodes to *finish* keeps the short
ones: on Acrobot one version scored -75.6 that way and -86.7 played one episode at a time, and
a run stopped "solved" at -100 with a version that scored -123 alone. Which episodes count must
be decided before any of them ends. So each environment contributes its first ``per_env``
episodes (started after the window opened) and the window is complete when every environment
has played its quota to the end: a long episode delays the window, it is never left out.

Each evaluation episode also starts from a seed of its own (:func:`episode_seed`: from the
environment's seed and the episode's number), so an evaluation replays exactly.

Used by the in-run windows (:mod:`system.run.stopping`) and by ``troupe eval`` /
``troupe.evaluate`` (:mod:`system.run.evaluation`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z_95 = 1.959964
"""The normal quantile of a two-sided 95% interval."""
_T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
          2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
          2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip
"""Student's t quantile of a two-sided 95% interval, for 1 to 30 degrees of freedom."""


def t_95(df: int) -> float:
    """Student's t quantile of a two-sided 95% interval with ``df`` degrees of freedom: the
    normal one (1.96) made intervals of a few episodes far too narrow (3 episodes: +-0.33
    where +-0.72 is right). Beyond the table, the Cornish-Fisher expansion (4 digits)."""
    if df <= len(_T_975):
        return _T_975[df - 1]
    z = Z_95
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def episode_seed(env_seed: int, index: int) -> int:
    """The seed of episode ``index`` of the environment seeded ``env_seed``: deterministic,
    and unrelated between neighbouring environments and episodes."""
    return int(np.random.SeedSequence([env_seed & 0xFFFFFFFF, index]).generate_state(1)[0])


def per_env_quota(episodes: int, envs: int) -> int:
    """Episodes each of ``envs`` environments plays so that at least ``episodes`` are counted."""
    return max(1, math.ceil(episodes / max(1, envs)))


def exact_quotas(names: list[object], episodes: int) -> dict[object, int]:
    """Quotas that add up to ``episodes`` over the environments ``names``, decided by name
    (the first ones play one more), never by which finishes first."""
    base, extra = divmod(episodes, len(names))
    return {name: base + (i < extra) for i, name in enumerate(names)}


@dataclass(frozen=True)
class ReturnSummary:
    """Mean, standard deviation and a 95% interval of the mean (Student's t); one episode
    has no interval (None)."""

    episodes: int
    mean: float
    std: float
    ci95_low: float | None
    ci95_high: float | None

    @classmethod
    def of(cls, values: list[float]) -> ReturnSummary:
        data = np.asarray(values, dtype=np.float64)
        if len(data) == 0:
            raise ValueError("no episode to summarise")
        mean = float(data.mean())
        if len(data) == 1:
            return cls(1, mean, 0.0, None, None)
        std = float(data.std(ddof=1))
        half = t_95(len(data) - 1) * std / math.sqrt(len(data))
        return cls(len(data), mean, std, mean - half, mean + half)

    def describe(self) -> str:
        return f"{self.mean:.2f} ± {self.std:.2f} ({interval_words(self.ci95_low, self.ci95_high)})"


def interval_words(low: float | None, high: float | None) -> str:
    """``95% interval of the mean 1.00 to 2.00``, or why there is none."""
    if low is None or high is None:
        return "one episode: no interval of the mean"
    return f"95% interval of the mean {low:.2f} to {high:.2f}"


class QuotaWindow:
    """One window: the first ``per_env`` episodes of each of ``envs`` environments.

    ``add(env, value)`` offers an episode of environment ``env`` (any hashable name, e.g.
    ``"eval/0/3"``) in the order that environment finished them; ``value`` None: the episode
    takes its place in the quota but has nothing to count (the judged policy did not play it).
    Environments beyond ``envs`` distinct names are ignored (a window is sized for the run's).
    ``quotas``: instead, each named environment's own quota (for exactly N episodes from
    environments known in advance: :func:`exact_quotas`); others are ignored.
    """

    def __init__(self, envs: int, per_env: int, quotas: dict[object, int] | None = None):
        self.envs = max(1, envs) if quotas is None else len(quotas)
        self.per_env = per_env
        self.quotas = quotas
        self.taken: dict[object, list[float | None]] = {}
        self.opened_at = 0.0
        """When the window opened (Unix time): episodes begun before are not its own."""

    @property
    def size(self) -> int:
        """Episodes the complete window counts."""
        return self.envs * self.per_env if self.quotas is None else sum(self.quotas.values())

    def add(self, env: object, value: float | None) -> bool:
        """Whether the episode is one of the window's."""
        quota = self.per_env if self.quotas is None else self.quotas.get(env, 0)
        mine = self.taken.get(env)
        if mine is None:
            if quota == 0 or len(self.taken) >= self.envs:
                return False
            mine = self.taken[env] = []
        if len(mine) >= quota:
            return False
        mine.append(value)
        return True

    @property
    def played(self) -> int:
        """Episodes of the window played so far."""
        return sum(len(v) for v in self.taken.values())

    @property
    def complete(self) -> bool:
        return self.played >= self.size

    def values(self) -> list[float]:
        return [v for vs in self.taken.values() for v in vs if v is not None]

    def best_mean(self, max_return: float) -> float | None:
        """The window's mean if every episode still to come returned ``max_return`` (None
        while nothing counts)."""
        values = self.values()
        to_come = self.size - self.played
        if not values and not to_come:
            return None
        return (sum(values) + to_come * max_return) / (len(values) + to_come)
