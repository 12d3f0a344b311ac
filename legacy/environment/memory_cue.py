"""MemoryCue-v0: a one-agent task that cannot be solved without memory.

An episode has ``delay + 2`` decisions. The first observation shows a cue, 0 or 1 (one-hot in the
first two entries); the next ``delay`` observations are blank; the last one raises the query flag
(third entry). The action taken at the query is scored: +1 when it equals the cue, -1 otherwise,
and the episode terminates. Actions before the query do nothing.

The query observation is the same whatever the cue, so a memoryless policy can do no better than
a coin flip: its expected return is **0**. A policy that remembers the cue (a GRU, say) earns
**+1** every episode. The cue is drawn uniformly from a generator seeded by :meth:`seed`.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from api.environment import Environment, StepResult

_QUERY = 2  # index of the query flag in the observation


class MemoryCueEnvironment(Environment):
    """A cue at step 0, ``delay`` blank steps, then a query scored +1 / -1.

    Args:
        delay: blank observations between the cue and the query (0 or more).
        seed: seeds the cue generator (None: fresh entropy); :meth:`seed` reseeds it.
    """

    def __init__(self, delay: int = 4, seed: int | None = None):
        if delay < 0:
            raise ValueError(f"delay must be 0 or more, got {delay}")
        self.delay = delay
        self._rng = np.random.default_rng(seed)
        self._observation_space = gym.spaces.Box(0.0, 1.0, shape=(3,), dtype=np.float32)
        self._action_space = gym.spaces.Discrete(2)
        self._cue = 0
        self._t = 0

    @property
    def agent_count(self) -> int:
        return 1

    @property
    def observation_spaces(self) -> list[gym.Space]:
        return [self._observation_space]

    @property
    def action_spaces(self) -> list[gym.Space]:
        return [self._action_space]

    def seed(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def reset(self) -> list[StepResult]:
        self._cue = int(self._rng.integers(2))
        self._t = 0
        obs = np.zeros(3, dtype=np.float32)
        obs[self._cue] = 1.0
        return [StepResult(obs=obs, reward=0.0, done=False, truncated=False, info={})]

    def step(self, actions: list) -> list[StepResult]:
        action = int(np.asarray(actions[0]).reshape(-1)[0])
        obs = np.zeros(3, dtype=np.float32)
        if self._t <= self.delay:  # the cue and blank steps: the action does nothing
            self._t += 1
            if self._t == self.delay + 1:
                obs[_QUERY] = 1.0
            return [StepResult(obs=obs, reward=0.0, done=False, truncated=False, info={})]
        correct = action == self._cue
        info = {"correct": float(correct)}
        return [StepResult(obs=obs, reward=1.0 if correct else -1.0, done=True, info=info)]
