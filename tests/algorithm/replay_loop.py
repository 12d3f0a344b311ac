"""A small in-process off-policy loop for the tests: real gymnasium environments stepped with a
policy's own ``rollout``, recorded as overlapping segments exactly as an actor worker records them
(``api.policy.SampleBatch``), fed to a replay buffer, sampled for a trainer. It is what the replay
worker role will do over sockets, in one process and one thread."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from api.namedarray import stack
from api.policy import RolloutRequest, SampleBatch


class SegmentCollector:
    """Steps ``envs`` copies of ``env_id`` with ``policy.rollout``; :meth:`segment` returns the
    next ``[segment_length + 1, envs]`` segments (each starts with the last step of the previous
    one). Finished training episodes' returns accumulate in :attr:`returns`."""

    def __init__(self, env_id: str, policy, envs: int, segment_length: int, seed: int = 0):
        self.policy, self.length = policy, segment_length + 1
        self.envs = [gym.make(env_id) for _ in range(envs)]
        self.obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)])
        self.reward = np.zeros((envs, 1), dtype=np.float32)
        self.done = np.zeros((envs, 1), dtype=bool)
        self.truncated = np.zeros((envs, 1), dtype=bool)
        self.on_reset = np.ones((envs, 1), dtype=bool)
        self.running_return = np.zeros(envs)
        self.returns: list[float] = []
        self.frames = 0
        self._last: SampleBatch | None = None

    def segment(self) -> SampleBatch:
        steps = [] if self._last is None else [self._last]
        while len(steps) < self.length:
            steps.append(self._step())
        self._last = steps[-1]
        return stack(steps)

    def _step(self) -> SampleBatch:
        n = len(self.envs)
        result = self.policy.rollout(
            RolloutRequest(
                obs=self.obs, is_evaluation=np.zeros((n, 1), dtype=bool), on_reset=self.on_reset
            )
        )
        record = SampleBatch(
            obs=self.obs,
            action=result.action,
            policy_output=result.policy_output,
            reward=self.reward.copy(),
            done=self.done.copy(),
            truncated=self.truncated.copy(),
            on_reset=self.on_reset.copy(),
            policy_version=np.full((n, 1), self.policy.version, dtype=np.int64),
        )
        obs = self.obs.copy()
        for i, env in enumerate(self.envs):
            if self.done[i, 0] or self.truncated[i, 0]:  # the action at an end is not executed
                obs[i], _ = env.reset()
                self.reward[i], self.done[i], self.truncated[i], self.on_reset[i] = 0, 0, 0, 1
                continue
            obs[i], reward, terminated, truncated, _ = env.step(result.action[i])
            self.reward[i], self.done[i], self.truncated[i] = reward, terminated, truncated
            self.on_reset[i] = False
            self.running_return[i] += reward
            self.frames += 1
            if terminated or truncated:
                self.returns.append(float(self.running_return[i]))
                self.running_return[i] = 0.0
        self.obs = obs
        return record


def greedy_returns(env_id: str, policy, episodes: int, seed: int = 1000) -> list[float]:
    """Returns of ``episodes`` greedy episodes (``is_evaluation`` set), one environment."""
    env = gym.make(env_id)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, over = 0.0, False
        while not over:
            request = RolloutRequest(
                obs=obs[None], is_evaluation=np.ones((1, 1), dtype=bool), on_reset=None
            )
            obs, reward, terminated, truncated, _ = env.step(policy.rollout(request).action[0])
            total += float(reward)
            over = terminated or truncated
        returns.append(total)
    return returns


def train_off_policy(collector, buffer, trainer, frames: int, updates_per_segment: int, batch):
    """Collect segments into ``buffer`` and take trainer steps on its samples until ``frames``
    environment frames; new priorities go back to the buffer."""
    while collector.frames < frames:
        buffer.insert(collector.segment())
        for _ in range(updates_per_segment):
            if not buffer.can_sample(batch):
                break
            transitions = buffer.sample(batch)
            trainer.step(transitions)
            priorities = getattr(trainer, "priorities", None)
            if priorities is not None:
                buffer.update_priorities(transitions.key, priorities)
