"""StagedCartPole-v0: the built-in environment with curriculum stages."""

from __future__ import annotations

import pytest

from api.env_check import test_environment as check_environment
from api.environment import make
from api.errors import UserError


def play_out(env) -> tuple[int, bool, int]:
    """Steps, whether it was truncated, and the stage in the last info of one episode played
    by a controller that keeps the pole up (push towards where the pole leans)."""
    results = env.reset()
    steps = 0
    while not (results[0].done or results[0].truncated):
        obs = results[0].obs
        results = env.step([int(obs[2] + obs[3] > 0)])
        steps += 1
    return steps, results[0].truncated, results[0].info["curriculum_stage"]


def test_it_keeps_the_environment_contract():
    check_environment("StagedCartPole-v0")


def test_each_stage_has_its_time_limit_and_pole_from_the_next_reset():
    env = make("StagedCartPole-v0", time_limits=[50, 120], pole_lengths=[0.5, 0.3])
    env.seed(3)
    assert play_out(env) == (50, True, 0)
    env.set_curriculum_stage(1)
    assert env.gym_env.unwrapped.length == 0.5  # the running episode is not changed
    assert play_out(env) == (120, True, 1)
    assert env.gym_env.unwrapped.length == 0.3
    with pytest.raises(UserError, match=r"has stages 0\.\.1; got 2"):
        env.set_curriculum_stage(2)
