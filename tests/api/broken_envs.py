"""Environments that each break one rule of the Environment contract, for test_environment.

``CoinFlipEnv`` keeps every rule; each subclass breaks exactly one, so a test can assert that
``test_environment`` names that rule, the agent and the field.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from api.environment import Environment, StepResult


class CoinFlipEnv(Environment):
    """One agent guesses seeded coin flips for five steps; a correct guess earns +1."""

    episode_length = 5

    def __init__(self, episode_length: int = 5):
        self.episode_length = episode_length
        self._rng = np.random.default_rng()
        self._coin = 0
        self._t = 0
        self._running = False

    @property
    def agent_count(self) -> int:
        return 1

    @property
    def observation_spaces(self) -> list[gym.Space]:
        return [gym.spaces.Box(0.0, 1.0, (3,), np.float32)]

    @property
    def action_spaces(self) -> list[gym.Space]:
        return [gym.spaces.Discrete(2)]

    def seed(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def reset(self) -> list[StepResult | None]:
        self._t = 0
        self._running = True
        return [StepResult(self._observe())]

    def step(self, actions: list[Any]) -> list[StepResult | None]:
        if not self._running:
            raise RuntimeError("the episode is over; call reset()")
        reward = 1.0 if int(actions[0]) == self._coin else 0.0
        self._t += 1
        done = self._t >= self.episode_length
        self._running = not done
        return [StepResult(self._observe(), reward, done, False, {})]

    def _observe(self) -> np.ndarray:
        self._coin = int(self._rng.integers(2))
        hint = self._rng.random(2).astype(np.float32)
        return np.array([self._coin, *hint], dtype=np.float32)


class WrongObsShape(CoinFlipEnv):
    def _observe(self) -> np.ndarray:
        return np.zeros(4, dtype=np.float32)


class WrongObsDtype(CoinFlipEnv):
    def _observe(self) -> np.ndarray:
        return super()._observe().astype(np.float64)


class ObsOutOfBounds(CoinFlipEnv):
    def _observe(self) -> np.ndarray:
        return np.full(3, 2.0, dtype=np.float32)


class ObsNotAnArray(CoinFlipEnv):
    def _observe(self) -> Any:
        return [0.0, 0.5, 0.5]


class WrongAgentCount(CoinFlipEnv):
    """Declares two agents but only one space each."""

    @property
    def agent_count(self) -> int:
        return 2


class WrongResultCount(CoinFlipEnv):
    """Declares one agent but step returns two results."""

    def step(self, actions):
        return super().step(actions) * 2


class NonScalarReward(CoinFlipEnv):
    def step(self, actions):
        [result] = super().step(actions)
        result.reward = np.array([result.reward, 0.0])
        return [result]


class NanReward(CoinFlipEnv):
    def step(self, actions):
        [result] = super().step(actions)
        result.reward = float("nan")
        return [result]


class IntDone(CoinFlipEnv):
    def step(self, actions):
        [result] = super().step(actions)
        result.done = int(result.done)
        return [result]


class InfoNotDict(CoinFlipEnv):
    def step(self, actions):
        [result] = super().step(actions)
        result.info = None
        return [result]


class ResetGivesNothing(CoinFlipEnv):
    def reset(self):
        super().reset()
        return [None]


class ResultNotStepResult(CoinFlipEnv):
    def step(self, actions):
        [result] = super().step(actions)
        return [(result.obs, result.reward, result.done, result.truncated, result.info)]


class StepsAfterDone(CoinFlipEnv):
    """Forgets that the episode ended and starts a fresh one on the next step."""

    def step(self, actions):
        if not self._running:
            self._t = 0
            self._running = True
        return super().step(actions)


class StaysDoneAfterEnd(CoinFlipEnv):
    """Correct too: after the end it keeps answering done instead of raising."""

    def step(self, actions):
        if not self._running:
            return [StepResult(self._observe(), 0.0, True, False, {})]
        return super().step(actions)


class NonDeterministic(CoinFlipEnv):
    """Ignores the seed: every run draws fresh randomness."""

    def seed(self, seed: int) -> None:
        pass


class StepRaises(CoinFlipEnv):
    def step(self, actions):
        if self._t == 2:
            raise ValueError("boom at step 3")
        return super().step(actions)


class SeedRaises(CoinFlipEnv):
    def seed(self, seed: int) -> None:
        raise NotImplementedError("no seeding here")


class DictObs(CoinFlipEnv):
    """A Dict observation space with a mask, like GridGather's."""

    @property
    def observation_spaces(self) -> list[gym.Space]:
        return [
            gym.spaces.Dict(
                {
                    "hint": gym.spaces.Box(0.0, 1.0, (3,), np.float32),
                    "action_mask": gym.spaces.MultiBinary(2),
                }
            )
        ]

    def _observe(self) -> Any:
        return {"hint": super()._observe(), "action_mask": np.ones(2, dtype=np.int8)}


class DictObsMissingKey(DictObs):
    def _observe(self) -> Any:
        obs = super()._observe()
        del obs["action_mask"]
        return obs


class DictObsWrongLeafShape(DictObs):
    def _observe(self) -> Any:
        obs = super()._observe()
        obs["action_mask"] = np.ones(3, dtype=np.int8)
        return obs


class DictObsKeyNotAName(DictObs):
    """A Dict key that cannot name a NamedArray field: the wire refuses it in every request."""

    @property
    def observation_spaces(self) -> list[gym.Space]:
        space = super().observation_spaces[0]
        return [gym.spaces.Dict({"coin-hint": space["hint"], "action_mask": space["action_mask"]})]

    def _observe(self) -> Any:
        obs = super()._observe()
        return {"coin-hint": obs["hint"], "action_mask": obs["action_mask"]}


class TwoAgentsRevived(Environment):
    """Two agents; agent 0 finishes at step 1 but then gets not-done results again."""

    def __init__(self):
        self._t = 0

    @property
    def agent_count(self) -> int:
        return 2

    @property
    def observation_spaces(self) -> list[gym.Space]:
        return [gym.spaces.Discrete(3)] * 2

    @property
    def action_spaces(self) -> list[gym.Space]:
        return [gym.spaces.Discrete(2)] * 2

    def reset(self):
        self._t = 0
        return [StepResult(0), StepResult(0)]

    def step(self, actions):
        self._t += 1
        if self._t == 1:
            return [StepResult(1, done=True), StepResult(1)]
        return [StepResult(2), StepResult(2, done=self._t >= 3)]


class RandomReward(CoinFlipEnv):
    """Observations follow the seed, but the reward comes from an unseeded generator."""

    def step(self, actions):
        [result] = super().step(actions)
        result.reward = float(np.random.default_rng().random())  # two runs never agree
        return [result]


class ConstructorRaises(CoinFlipEnv):
    def __init__(self, path: str = "missing.cfg"):
        raise FileNotFoundError(f"no such file: {path}")


class NoFramesPerStep(CoinFlipEnv):
    """Says a step covers no frame of its simulator (``frames_per_step`` below 1)."""

    frames_per_step = 0
