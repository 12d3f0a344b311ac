"""``troupe.load_policy(run).act``: what it hands back is what the run's actors hand their
environments."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from algorithm.actor_critic_policies.policy import ActorCriticPolicy
from api.resolve import load_experiment
from distributed.api import LoadedPolicy

OBSERVATIONS = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)


@pytest.mark.parametrize("greedy", [True, False])
def test_a_box_action_is_clipped_into_its_bounds_as_actors_clip_it(greedy):
    """``act`` returned the Gaussian's raw mean or sample (-1.55 in a [-1, 1] Box, from a
    trained run's policy), where the run's actors clip into the Box before the environment
    gets it: an environment of one's own, or a robot, got an action outside its space."""
    narrow = gym.spaces.Box(-1e-3, 1e-3, (2,), np.float32)  # an untrained mean lies past it
    policy = ActorCriticPolicy(OBSERVATIONS, narrow, seed=0)
    loaded = LoadedPolicy(policy, load_experiment("pendulum-ppo"), "default", 0)
    OBSERVATIONS.seed(0)
    actions = [loaded.act(OBSERVATIONS.sample(), greedy=greedy)[0] for _ in range(20)]
    assert all(narrow.contains(action) for action in actions), actions
    assert any(np.abs(action).max() == 1e-3 for action in actions)  # clipped, not all inside


def test_a_discrete_action_is_handed_back_as_drawn():
    policy = ActorCriticPolicy(OBSERVATIONS, gym.spaces.Discrete(3), seed=0)
    loaded = LoadedPolicy(policy, load_experiment("pendulum-ppo"), "default", 0)
    action, state = loaded.act(OBSERVATIONS.sample())
    assert int(action) in range(3) and state is None
