"""Dict and Tuple action spaces acted in as one MultiDiscrete, one Box or one HybridBox
(``legacy/environment/flat_actions.py``): they were refused by every experiment."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from api.spaces import HybridBox
from legacy.environment.flat_actions import flat_actions
from legacy.environment.gym_adapter import GymnasiumEnvironment
from system.run.shape import space_from_wire, space_to_wire

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


def test_a_mix_of_discrete_and_box_parts_is_one_hybrid_box_choices_first():
    """A parameterised action (which move, how hard) was refused by every experiment."""
    mixed = gym.spaces.Dict({
        "power": gym.spaces.Box(0, 1, (2,), np.float32),
        "move": gym.spaces.Discrete(3, start=1),
        "fire": gym.spaces.MultiBinary(2),
    })  # fmt: skip
    flat = flat_actions(mixed)
    assert flat.space == HybridBox([2, 2, 3], [0, 0], [1, 1])
    assert flat.space.low.tolist() == [0, 0, 0, 0, 0] and flat.space.high.tolist() == [
        1,
        1,
        2,
        1,
        1,
    ]
    action = flat.unflatten(np.array([1, 0, 2, 0.25, 0.75], np.float32))
    assert action in mixed, action
    assert action["fire"].tolist() == [1, 0] and action["move"] == 3  # index 2 from 1
    assert action["power"].tolist() == [0.25, 0.75]
    flat.space.seed(0)
    for _ in range(50):  # every flat action drawn from the space is one of the environment's
        assert flat.unflatten(flat.space.sample()) in mixed
    assert space_from_wire(space_to_wire(flat.space)) == flat.space  # as workers receive it


def test_other_parts_are_refused_naming_them_and_plain_spaces_are_left_alone():
    text = gym.spaces.Dict({"move": gym.spaces.Discrete(3), "say": gym.spaces.Text(4)})
    with pytest.raises(ValueError, match=r"this one has others \(move: Discrete, say: Text\)"):
        flat_actions(text)
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


class _Aim(gym.Env):
    """A move and a push: a Dict of a Discrete and a Box part."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Dict(
        {"move": gym.spaces.Discrete(3), "push": gym.spaces.Box(-1, 1, (1,), np.float32)}
    )

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        assert action in self.action_space, action
        return np.zeros(2, np.float32), 0.0, False, False, {}


def test_the_environment_check_says_a_hybrid_action_space_is_one(monkeypatch):
    """``troupe test-env`` showed it as ``Box(shape=(2,), dtype=float32)``: not the user's Dict,
    nor which entry is the choice."""
    from api.env_check import test_environment

    monkeypatch.setitem(gym.registry, "TroupeTestAim-v0", gym.envs.registration.EnvSpec(
        "TroupeTestAim-v0", entry_point=_Aim))  # fmt: skip
    report = str(test_environment("TroupeTestAim-v0", steps=20))
    assert "HybridBox(choices [3], then Box(-1.0, 1.0, (1,), float32))" in report, report
