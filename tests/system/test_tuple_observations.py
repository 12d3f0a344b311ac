"""An environment of one's own whose observation is a Tuple is seen as a Dict keyed by position,
as a gymnasium one is: it was refused, told to wrap it in a gymnasium wrapper that cannot."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from api import environment, registry
from api.environment import Environment, StepResult, register
from api.resolve import load_experiment
from api.testing import test_environment, test_pipeline

NAME = "TupleCoin-v0"


class TupleCoin(Environment):
    """Observation (a counter, a 2-vector); pick action 1 for a reward, 10 steps."""

    def __init__(self):
        self.t = 0
        self.probe = "kept"  # an attribute of its own, reached through the view

    @property
    def agent_count(self):
        return 1

    @property
    def observation_spaces(self):
        return [gym.spaces.Tuple((gym.spaces.Discrete(11), gym.spaces.Box(0, 1, (2,), np.float32)))]

    @property
    def action_spaces(self):
        return [gym.spaces.Discrete(2)]

    def _obs(self):
        return (self.t, np.full(2, self.t / 10, np.float32))

    def reset(self):
        self.t = 0
        return [StepResult(self._obs())]

    def step(self, actions):
        self.t += 1
        return [StepResult(self._obs(), float(actions[0]), self.t >= 10)]


@pytest.fixture
def tuple_coin():
    register(NAME, TupleCoin)
    yield NAME
    registry.environments.unregister(NAME)


def test_a_tuple_observation_is_seen_as_a_dict_keyed_by_position(tuple_coin):
    env = environment.make(tuple_coin)
    (space,) = env.observation_spaces
    assert isinstance(space, gym.spaces.Dict) and list(space.spaces) == ["item0", "item1"]
    (first,) = env.reset()
    assert first.obs["item0"] == 0 and first.obs["item1"].shape == (2,)
    assert space.contains(env.step([1])[0].obs) and env.probe == "kept"
    test_environment(tuple_coin, steps=50)


def test_a_tuple_observation_trains_through_the_pipeline_and_the_auto_experiment(tuple_coin):
    config = load_experiment(tuple_coin)  # was refused: "a Tuple space, which no policy reads"
    assert config.environment.type == tuple_coin
    report = test_pipeline(tuple_coin)
    assert report.env_frames > 0
