"""An environment whose return is its episode's length, drawn at random at each reset (1 to
60 steps, one point a step, whatever the actions): the mean return an evaluation reports is
biased low exactly when it keeps short episodes over long ones (tests/system/
test_unbiased_evaluation.py)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from api.environment import Environment, StepResult

MAX_LENGTH = 60
TRUE_MEAN = (1 + MAX_LENGTH) / 2


class LengthReturnEnv(Environment):
    def __init__(self):
        self._rng = np.random.default_rng()
        self._left = 0

    @property
    def agent_count(self) -> int:
        return 1

    @property
    def observation_spaces(self) -> list[gym.Space]:
        return [gym.spaces.Box(0.0, 1.0, (2,), np.float32)]

    @property
    def action_spaces(self) -> list[gym.Space]:
        return [gym.spaces.Discrete(2)]

    def seed(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def reset(self) -> list[StepResult | None]:
        self._left = int(self._rng.integers(1, MAX_LENGTH + 1))
        return [StepResult(self._obs())]

    def step(self, actions: list[Any]) -> list[StepResult | None]:
        self._left -= 1
        return [StepResult(self._obs(), 1.0, self._left <= 0, False, {})]

    def _obs(self) -> np.ndarray:
        return np.array([self._left / MAX_LENGTH, 1.0], np.float32)
