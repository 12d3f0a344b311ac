"""How often a trainer may replay each inserted frame: a samples-per-insert ratio with slack.

An off-policy learner that samples much faster than actors insert overfits a small, stale buffer;
one that samples much slower wastes the actors' frames. The limiter keeps the number of sampled
transitions near ``samples_per_insert`` times the number of inserted frames, as DeepMind Reverb's
``SampleToInsertRatio`` does: with ``diff = inserted * samples_per_insert - sampled``, sampling
``n`` is allowed while ``diff - n >= offset - tolerance`` and inserting ``k`` frames while
``diff + k * samples_per_insert <= offset + tolerance``, where ``offset = samples_per_insert *
min_size``. Nothing is sampled before ``min_size`` frames are in. Whoever is refused waits for
the other side (the buffer worker holds back a trainer's request, or stops taking segments from
the sample stream, which back-pressures the actors).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)


@dataclass
class RateLimiterConfig:
    """When a replay buffer may be sampled and written."""

    min_size: int = 1000
    """Frames that must be in the buffer before the first sample."""
    samples_per_insert: float | None = None
    """Target of sampled transitions per inserted frame (None: no ratio, only ``min_size``)."""
    tolerance: float = 1000.0
    """How far (in sampled transitions) the count may run ahead of or behind the ratio. It must
    be at least one sampled message and one inserted chunk times ``samples_per_insert``, or the
    two sides can wait for each other forever."""
    fitted: bool = False
    """The tolerance is a default, not the user's: an insert or sample it cannot fit (an
    environment with more agents than the default counted) widens it to fit, once, instead of
    failing the replay worker."""

    def errors(self) -> list[str]:
        problems = []
        if self.min_size < 1:
            problems.append(f"min_size must be at least 1, got {self.min_size}")
        if self.samples_per_insert is not None and self.samples_per_insert <= 0:
            problems.append(
                f"samples_per_insert must be positive (or None), got {self.samples_per_insert}"
            )
        if self.tolerance <= 0:
            problems.append(f"tolerance must be positive, got {self.tolerance}")
        return problems


class RateLimiter:
    """Counts inserted frames and sampled transitions; says whether the next one may go."""

    def __init__(self, config: RateLimiterConfig):
        problems = config.errors()
        if problems:
            raise ValueError("RateLimiterConfig: " + "; ".join(problems))
        self.config = config
        self.inserted = 0
        self.sampled = 0

    @property
    def _diff(self) -> float:
        return self.inserted * (self.config.samples_per_insert or 0.0) - self.sampled

    @property
    def _offset(self) -> float:
        return (self.config.samples_per_insert or 0.0) * self.config.min_size

    def can_sample(self, count: int, size: int) -> bool:
        """May ``count`` transitions be sampled from a buffer holding ``size`` frames?"""
        if size < self.config.min_size or size == 0:
            return False
        if self.config.samples_per_insert is None:
            return True
        self._check_fits(count, "sample")
        return self._diff - count >= self._offset - self.config.tolerance

    def can_insert(self, frames: int) -> bool:
        """May ``frames`` more frames be inserted?"""
        spi = self.config.samples_per_insert
        if spi is None:
            return True
        self._check_fits(frames * spi, "insert")
        return self._diff + frames * spi <= self._offset + self.config.tolerance

    def _check_fits(self, amount: float, what: str) -> None:
        """One insert and one sample must fit the window of ``2 * tolerance`` together, or
        each side can wait for the other forever: before ``min_size`` (inserts stop short of
        it, so nothing is sampled) or later. A tolerance of at least each of them makes sure.
        A default tolerance counts one agent per environment: two agents sharing a policy
        bring chunks twice as large, and SAC on such a game stopped inserting at 992 frames,
        short of its min_size of 1,000, for good."""
        if amount <= self.config.tolerance:
            return
        if self.config.fitted:
            logger.info("replay rate limiter: tolerance %g widened to %g to fit one %s",
                        self.config.tolerance, amount, what)  # fmt: skip
            self.config = dataclasses.replace(self.config, tolerance=float(amount))
            return
        raise ValueError(
            f"one {what} of {amount:g} sampled-transition units exceeds the rate limiter's "
            f"tolerance of {self.config.tolerance:g}: the trainer and the actors could wait for "
            f"each other forever. Raise policies.<policy>.replay.tolerance to at least "
            f"{amount:g} (or leave it unset, to fit itself), or use smaller batches / segments."
        )

    def record_insert(self, frames: int) -> None:
        self.inserted += int(frames)

    def record_sample(self, count: int) -> None:
        self.sampled += int(count)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"inserted": np.array(self.inserted), "sampled": np.array(self.sampled)}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.inserted, self.sampled = int(state["inserted"]), int(state["sampled"])
