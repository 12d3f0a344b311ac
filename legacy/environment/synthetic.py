"""A synthetic environment whose step costs a chosen amount of CPU time, for benchmarks.

``Synthetic-v0`` lets ``troupe bench`` ask how much of the machine the runtime leaves to the
environment: each ``step`` burns about ``step_cost_us`` microseconds of real CPU work (a pure-Python
loop, not a sleep, so it competes for cores like a real simulator does), then returns a float32
observation of ``obs_size`` values. The task is learnable but trivial: the reward is 1 when the
action names the largest of the first ``n_actions`` observation values.

The loop's speed is measured once per process, on first use, so the step cost holds on any
machine. Calibration counts this thread's CPU time (not wall-clock), and keeps the best of a few
short timings, so other processes busy on the same cores during calibration do not make every
later step cheaper than asked.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import gymnasium as gym
import numpy as np

from api.environment import Environment, StepResult
from api.errors import UserError

_CALIBRATION_ITERATIONS = 20_000
_CALIBRATION_TRIALS = 5


def _spin(iterations: int) -> int:
    """Busy work: a linear congruential generator, so every iteration depends on the last."""
    x = 1
    for _ in range(iterations):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
    return x


@functools.cache
def iterations_per_us() -> float:
    """How many ``_spin`` iterations this process runs per microsecond (measured once)."""
    best = float("inf")
    for _ in range(_CALIBRATION_TRIALS):
        started = time.thread_time()
        _spin(_CALIBRATION_ITERATIONS)
        best = min(best, time.thread_time() - started)
    return _CALIBRATION_ITERATIONS / max(best * 1e6, 1e-3)


class SyntheticEnvironment(Environment):
    """Every agent sees ``obs_size`` float32 values and picks one of ``n_actions`` actions.

    Episodes never terminate; they are truncated after ``episode_length`` steps. All agents act
    on every step; the CPU cost is per environment step, whatever the number of agents.
    """

    def __init__(
        self,
        step_cost_us: float = 1000.0,
        obs_size: int = 64,
        n_actions: int = 4,
        episode_length: int = 200,
        agents: int = 1,
    ):
        errors = []
        if step_cost_us < 0:
            errors.append(f"step_cost_us must be 0 or more, got {step_cost_us}")
        if n_actions < 1:
            errors.append(f"n_actions must be at least 1, got {n_actions}")
        if obs_size < n_actions:
            errors.append(f"obs_size ({obs_size}) must be at least n_actions ({n_actions})")
        if episode_length < 1:
            errors.append(f"episode_length must be at least 1, got {episode_length}")
        if agents < 1:
            errors.append(f"agents must be at least 1, got {agents}")
        if errors:
            raise UserError("Synthetic-v0: " + "; ".join(errors))
        self.step_cost_us = float(step_cost_us)
        self.obs_size = int(obs_size)
        self.n_actions = int(n_actions)
        self.episode_length = int(episode_length)
        self.agents = int(agents)
        self.spin_iterations = round(self.step_cost_us * iterations_per_us())
        self._observation_space = gym.spaces.Box(-np.inf, np.inf, (self.obs_size,), np.float32)
        self._action_space = gym.spaces.Discrete(self.n_actions)
        self._rng = np.random.default_rng()
        self._obs = np.zeros((self.agents, self.obs_size), dtype=np.float32)
        self._t = 0
        self._running = False

    @property
    def agent_count(self) -> int:
        return self.agents

    @property
    def observation_spaces(self) -> list[gym.Space]:
        return [self._observation_space] * self.agents

    @property
    def action_spaces(self) -> list[gym.Space]:
        return [self._action_space] * self.agents

    def seed(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self._action_space.seed(int(seed))

    def reset(self) -> list[StepResult | None]:
        self._t = 0
        self._running = True
        self._draw()
        return [StepResult(self._obs[a].copy()) for a in range(self.agents)]

    def step(self, actions: list[Any]) -> list[StepResult | None]:
        if len(actions) != self.agents:
            raise ValueError(
                f"Synthetic-v0 has {self.agents} agents, so step() takes {self.agents} actions; "
                f"got {len(actions)}"
            )
        if not self._running:
            raise UserError("Synthetic-v0: the episode is over (or never began); call reset()")
        _spin(self.spin_iterations)
        best = self._obs[:, : self.n_actions].argmax(axis=1)
        rewards = [1.0 if int(actions[a]) == int(best[a]) else 0.0 for a in range(self.agents)]
        self._t += 1
        truncated = self._t >= self.episode_length
        self._running = not truncated
        self._draw()
        return [
            StepResult(self._obs[a].copy(), rewards[a], False, truncated)
            for a in range(self.agents)
        ]

    def _draw(self) -> None:
        self._obs[:] = self._rng.standard_normal(self._obs.shape, dtype=np.float32)
