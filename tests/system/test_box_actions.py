"""A Gaussian policy samples past a Box's bounds; an environment of one's own gets its actions
clipped into them, as a gymnasium one always did (the sample itself is what is trained on)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from api import registry
from api.environment import Environment, StepResult, register
from api.testing import test_pipeline
from system.streams.validation import action_bounds, fit_actions

NAME = "StrictBox-v0"


class StrictBox(Environment):
    """Refuses any action outside [-1, 1]; counts the steps it was given."""

    def __init__(self):
        self.t = 0

    @property
    def agent_count(self):
        return 1

    @property
    def observation_spaces(self):
        return [gym.spaces.Box(-1.0, 1.0, (2,), np.float32)]

    @property
    def action_spaces(self):
        return [gym.spaces.Box(-1.0, 1.0, (2,), np.float32)]

    def seed(self, seed):
        pass

    def reset(self):
        self.t = 0
        return [StepResult(np.zeros(2, np.float32))]

    def step(self, actions):
        action = actions[0]
        if not (np.all(action >= -1.0) and np.all(action <= 1.0)):
            raise AssertionError(f"action {action} is outside the box")
        self.t += 1
        return [StepResult(np.zeros(2, np.float32), float(-np.sum(action**2)), self.t >= 20)]


@pytest.fixture
def strict_box():
    register(NAME, StrictBox)
    yield NAME
    registry.environments.unregister(NAME)


def test_a_gaussian_policys_actions_reach_an_environment_inside_its_box(strict_box):
    """PPO's first actions are N(0, 1) samples: about a third of them fall outside [-1, 1],
    which this environment refuses; 3 trainer steps of 128-step segments see hundreds."""
    report = test_pipeline(strict_box, "actor-critic", "ppo")
    assert report.env_frames > 100


def test_fit_actions_clips_box_actions_only():
    spaces = [gym.spaces.Box(-1.0, 2.0, (2,), np.float32), gym.spaces.Discrete(3)]
    bounds = action_bounds(spaces)
    fitted = fit_actions([np.array([-3.0, 5.0]), 2], bounds)
    assert fitted[0].tolist() == [-1.0, 2.0] and fitted[0].dtype == np.float32
    assert fitted[1] == 2
    assert action_bounds([gym.spaces.Discrete(2)]) is None  # nothing to fit: no copy made
