"""Dict and Tuple action spaces acted in as one MultiDiscrete or one Box
(``legacy/environment/flat_actions.py``): they were refused by every experiment."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from legacy.environment.flat_actions import flat_actions
from legacy.environment.gym_adapter import GymnasiumEnvironment

DISCRETE_PARTS = gym.spaces.Dict({
    "move": gym.spaces.Discrete(3),
    "fire": gym.spaces.MultiBinary(2),
    "pad": gym.spaces.Tuple((gym.spaces.Discrete(2, start=5),
                             gym.spaces.MultiDiscrete([[2, 3]], start=[[1, 1]]))),
})  # fmt: skip
BOX_PARTS = gym.spaces.Tuple((gym.spaces.Box(-1, 1, (2,), np.float32),
                              gym.spaces.Box(0, 5, (1, 2), np.float32)))  # fmt: skip


def test_discrete_parts_are_one_multidiscrete_and_come_back_in_their_own_shape():
    flat = flat_actions(DISCRETE_PARTS)
    # a Dict's parts in the space's own (sorted) order: fire, move, pad
    assert flat.space == gym.spaces.MultiDiscrete([2, 2, 3, 2, 2, 3])
    action = flat.unflatten(np.array([1, 0, 2, 1, 0, 2]))
    assert action in DISCRETE_PARTS, action
    assert action["fire"].tolist() == [1, 0] and action["move"] == 2
    assert action["pad"][0] == 6  # index 1 of a Discrete that starts at 5
    assert action["pad"][1].tolist() == [[1, 3]]  # and a MultiDiscrete's start
    for _ in range(50):  # every flat action is one of the environment's
        assert flat.unflatten(flat.space.sample()) in DISCRETE_PARTS


def test_box_parts_are_one_box_side_by_side():
    flat = flat_actions(BOX_PARTS)
    assert flat.space == gym.spaces.Box(
        np.array([-1, -1, 0, 0], np.float32), np.array([1, 1, 5, 5], np.float32)
    )
    first, second = flat.unflatten(np.array([0.5, -0.5, 4.0, 1.0]))
    assert first.tolist() == [0.5, -0.5] and second.tolist() == [[4.0, 1.0]]
    assert first.dtype == np.float32 and (first, second) in BOX_PARTS


def test_a_mix_of_kinds_is_refused_naming_the_parts_and_plain_spaces_are_left_alone():
    mixed = gym.spaces.Dict({"move": gym.spaces.Discrete(3), "power": gym.spaces.Box(0, 1, (1,))})
    with pytest.raises(ValueError, match=r"mixes them \(move: Discrete, power: Box\)"):
        flat_actions(mixed)
    assert flat_actions(gym.spaces.Discrete(3)) is None
    assert flat_actions(gym.spaces.Box(0, 1, (2,))) is None


class _Parts(gym.Env):
    """Takes only actions of its own space (asserted), and says what it got."""

    observation_space = gym.spaces.Discrete(2)
    action_space = DISCRETE_PARTS

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return 0, {}

    def step(self, action):
        assert action in self.action_space, action
        return 0, float(action["move"]), False, False, {"got": action}


def test_the_adapter_shows_the_flat_space_and_steps_the_environment_with_its_own(monkeypatch):
    monkeypatch.setitem(gym.registry, "TroupeTestParts-v0", gym.envs.registration.EnvSpec(
        "TroupeTestParts-v0", entry_point=_Parts))  # fmt: skip
    env = GymnasiumEnvironment("TroupeTestParts-v0")
    (space,) = env.action_spaces
    assert space == gym.spaces.MultiDiscrete([2, 2, 3, 2, 2, 3])
    env.seed(0)
    env.reset()
    (step,) = env.step([np.array([0, 1, 1, 0, 1, 0])])
    assert step.reward == 1.0 and step.info["got"]["pad"][0] == 5
