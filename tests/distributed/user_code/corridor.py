import gymnasium as gym
import numpy as np

import troupe
from api.environment import Environment, StepResult, register
from api.testing import test_environment


class Corridor(Environment):
    """Walk right along a corridor to reach the exit; the start cell is random."""

    def __init__(self, length: int = 8, max_steps: int = 30):
        self.length, self.max_steps = length, max_steps
        self.rng = np.random.default_rng()
        self.pos, self.t, self.running = 0, 0, False

    @property
    def agent_count(self):
        return 1

    @property
    def observation_spaces(self):
        return [gym.spaces.Box(0.0, 1.0, (1,), np.float32)]

    @property
    def action_spaces(self):
        return [gym.spaces.Discrete(2)]  # 0: left, 1: right

    def seed(self, seed):
        self.rng = np.random.default_rng(seed)

    def reset(self):
        self.pos, self.t, self.running = int(self.rng.integers(self.length - 1)), 0, True
        return [StepResult(self._obs())]

    def step(self, actions):
        if not self.running:
            raise RuntimeError("the episode is over: call reset()")
        self.pos = max(0, self.pos + (1 if actions[0] == 1 else -1))
        self.t += 1
        done = self.pos == self.length - 1
        truncated = not done and self.t >= self.max_steps
        self.running = not (done or truncated)
        info = {"steps_to_exit": self.t} if done else {}
        return [StepResult(self._obs(), 1.0 if done else 0.0, done, truncated, info)]

    def _obs(self):
        return np.array([self.pos / (self.length - 1)], dtype=np.float32)


if __name__ == "__main__":
    register("Corridor-v0", Corridor, length=6)
    print(test_environment("Corridor-v0", steps=300))
    result = troupe.train("Corridor-v0", ["target=1.0", "frames=100000"])
    print(result.summary["stop_reason"], result.summary["best_eval_return"], result.run_dir)
