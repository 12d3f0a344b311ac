"""Population-based training's decisions: who is ranked, who exploits whom, how to explore.

Pure functions of the members' scores and hyper-parameters and a random generator, so they are
tested on their own; :mod:`system.run.coordination.pbt` applies them to a run.

A member is *ready* after ``interval_steps`` trainer steps since its last decision, once it has
a score (the mean of its last ``eval_episodes`` evaluation returns, played by its current
weights). Ranked among the members that have a score, a ready member in the bottom
``truncation`` share copies a member of the top share (exploit) chosen at random, which must
score higher, and continues with that member's hyper-parameters, each multiplied by one of
``perturb_factors`` or, with ``resample_probability``, drawn afresh from its range (explore).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from api.config.league import PBTConfig


@dataclass
class Member:
    """What the driver knows of one member."""

    name: str
    hyperparameters: dict[str, float]
    returns: deque[float] = field(default_factory=lambda: deque(maxlen=1000))
    """Evaluation returns since its weights last changed (newest last)."""
    steps: int = 0
    """Trainer steps, as its trainer last reported."""
    version: int = 0
    last_decision_step: int = 0
    generation: int = 0
    """Exploit orders given to its trainer."""
    applied: int = 0
    """Orders its trainer has carried out."""
    inherited: float | None = None
    """The score of the member it was last ordered to copy: its standing while the weights it
    took have too few episodes of their own (:meth:`standing`)."""

    def score(self, episodes: int) -> float | None:
        if len(self.returns) < episodes:
            return None
        return float(np.mean(list(self.returns)[-episodes:]))

    def standing(self, episodes: int) -> float | None:
        """Where it ranks: its score, or, while the weights it copied have too few episodes
        of their own, the score of the member it copied them from."""
        score = self.score(episodes)
        return self.inherited if score is None else score

    def ready(self, config: PBTConfig) -> bool:
        return (
            self.applied >= self.generation
            and self.steps - self.last_decision_step >= config.interval_steps
            and self.score(config.eval_episodes) is not None
        )


def choose_source(
    member: str, scores: dict[str, float], truncation: float, rng: np.random.Generator
) -> str | None:
    """The member ``member`` should copy, or None (it is not in the bottom share, or nobody in
    the top share scores higher)."""
    if member not in scores or len(scores) < 2:
        return None
    ranked = sorted(scores, key=lambda m: (scores[m], m))  # worst first; names break ties
    share = max(1, math.floor(truncation * len(ranked)))
    if member not in ranked[:share]:
        return None
    better = [m for m in ranked[-share:] if scores[m] > scores[member]]
    if not better:
        return None
    return str(better[int(rng.integers(len(better)))])


def explore(
    hyperparameters: dict[str, float],
    config: PBTConfig,
    rng: np.random.Generator,
    whole: frozenset[str] = frozenset(),
) -> dict[str, float]:
    """Perturbed copies of ``hyperparameters`` (each kept inside its range). Those in ``whole``
    (a trainer's ``int`` arguments: PPO's ``epochs``) stay whole numbers: 4.8 epochs crashed
    every trainer of a member in ``range()``, and ``minibatches=1.6`` was logged and cut to 1."""
    out: dict[str, float] = {}
    for name, value in hyperparameters.items():
        low, high = config.hyperparameters[name]
        factor = None
        if rng.random() < config.resample_probability:
            new = _draw(low, high, rng)
        else:
            factors = config.perturb_factors
            factor = float(factors[int(rng.integers(len(factors)))])
            new = value * factor
        if name in whole:
            out[name] = _whole(value, new, factor, low, high)
        else:
            out[name] = float(min(max(new, low), high))
    return out


def _whole(value: float, new: float, factor: float | None, low: float, high: float) -> int:
    """``new`` rounded into ``[low, high]``; a perturbation that rounding would undo (1.2 x 3
    epochs) moves one step its way, so a small whole number is not stuck where it is."""
    rounded = round(new)
    if factor is not None and rounded == round(value) and factor != 1.0:
        rounded += 1 if factor > 1.0 else -1
    return int(min(max(rounded, math.ceil(low)), math.floor(high)))


def _draw(low: float, high: float, rng: np.random.Generator) -> float:
    """Log-uniform over a positive range spanning a factor of 10 or more, else uniform."""
    if low > 0 and high / low >= 10:
        return float(math.exp(rng.uniform(math.log(low), math.log(high))))
    return float(rng.uniform(low, high))
