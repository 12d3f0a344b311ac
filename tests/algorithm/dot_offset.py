"""DotOffset-v0: a small task that is learned from pixels or not at all, for SAC from pixels.

Each step draws a red and a green dot on a 20x20 image; the action (one number in [-1, 1]) is
how far right of the red dot the green one is, as a share of the span the dots are drawn in,
and the reward is minus the error. Ten steps an episode. The best constant action scores about
-3.6 an episode; one that reads the dots exactly, 0. The dots stay 4 pixels clear of the edges, so
DrQ's shifts of up to 4 pixels move them without smearing them into the border. Registered on
import (``--import tests/algorithm/dot_offset.py``).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

SIZE, MARGIN = 20, 4


class DotOffset(gym.Env):
    def __init__(self) -> None:
        self.observation_space = spaces.Box(0, 255, (SIZE, SIZE, 3), np.uint8)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.offset, self.steps = 0.0, 0

    def _draw(self) -> np.ndarray:
        low, high = MARGIN, SIZE - MARGIN
        (red_x, green_x), (red_y, green_y) = self.np_random.integers(low, high, (2, 2))
        self.offset = float(green_x - red_x) / (high - low - 1)
        image = np.zeros((SIZE, SIZE, 3), np.uint8)
        image[red_y, red_x, 0] = 255
        image[green_y, green_x, 1] = 255
        return image

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self._draw(), {}

    def step(self, action):
        reward = -abs(float(np.asarray(action).reshape(-1)[0]) - self.offset)
        self.steps += 1
        return self._draw(), reward, False, self.steps >= 10, {}


gym.register("DotOffset-v0", entry_point=DotOffset)
