"""Synthetic-v0, the benchmark environment, and the synthetic-ppo experiment.

Nothing here times anything: the step cost is checked through the calibrated iteration count,
which is a number, not a clock reading.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from api import environment, testing
from api.config import make_experiment
from api.errors import UserError
from legacy.environment.synthetic import SyntheticEnvironment, iterations_per_us

CHEAP = dict(step_cost_us=5.0)


@pytest.mark.parametrize("agents", [1, 3])
def test_synthetic_keeps_the_environment_contract(agents):
    report = testing.test_environment(
        "Synthetic-v0", steps=250, env_kwargs=dict(CHEAP, agents=agents, episode_length=50)
    )
    assert report.agent_count == agents


def test_spaces_and_observations_have_the_asked_shapes():
    env = SyntheticEnvironment(obs_size=16, n_actions=3, agents=2, **CHEAP)
    assert env.agent_count == 2
    assert env.observation_spaces == [gym.spaces.Box(-np.inf, np.inf, (16,), np.float32)] * 2
    assert env.action_spaces == [gym.spaces.Discrete(3)] * 2
    for result in env.reset() + env.step([0, 1]):
        assert result.obs.shape == (16,) and result.obs.dtype == np.float32


def test_episodes_are_truncated_at_episode_length_and_never_terminate():
    env = SyntheticEnvironment(episode_length=5, **CHEAP)
    env.reset()
    flags = [(r.done, r.truncated) for r in (env.step([0])[0] for _ in range(5))]
    assert flags == [(False, False)] * 4 + [(False, True)]
    with pytest.raises(UserError, match=r"the episode is over \(or never began\); call reset\(\)"):
        env.step([0])


def test_reward_is_one_for_the_largest_of_the_first_n_actions_values():
    env = SyntheticEnvironment(n_actions=4, **CHEAP)
    env.seed(3)
    obs = env.reset()[0].obs
    best = int(np.argmax(obs[:4]))
    assert env.step([best])[0].reward == 1.0
    obs = env.reset()[0].obs
    wrong = (int(np.argmax(obs[:4])) + 1) % 4
    assert env.step([wrong])[0].reward == 0.0


def test_same_seed_replays_the_same_episode():
    def episode(seed: int) -> list[tuple[bytes, float]]:
        env = SyntheticEnvironment(episode_length=10, **CHEAP)
        env.seed(seed)
        out = [(env.reset()[0].obs.tobytes(), 0.0)]
        for a in range(10):
            r = env.step([a % 4])[0]
            out.append((r.obs.tobytes(), r.reward))
        return out

    assert episode(7) == episode(7)
    assert episode(7) != episode(8)


def test_busy_work_is_the_calibrated_iteration_count_for_the_step_cost():
    rate = iterations_per_us()
    assert rate > 0
    for cost in (0.0, 250.0, 1000.0, 4000.0):
        assert SyntheticEnvironment(step_cost_us=cost).spin_iterations == round(cost * rate)


def test_bad_arguments_are_all_reported_at_once():
    with pytest.raises(UserError) as info:
        SyntheticEnvironment(step_cost_us=-1, obs_size=2, n_actions=3, episode_length=0, agents=0)
    assert str(info.value) == (
        "Synthetic-v0: step_cost_us must be 0 or more, got -1; obs_size (2) must be at least "
        "n_actions (3); episode_length must be at least 1, got 0; agents must be at least 1, got 0"
    )


def test_registered_name_builds_it_with_arguments():
    env = environment.make("Synthetic-v0", obs_size=8, **CHEAP)
    assert isinstance(env, SyntheticEnvironment) and env.obs_size == 8


def test_synthetic_ppo_trains_in_one_process():
    config = make_experiment(
        "synthetic-ppo", ["environment.args.step_cost_us=0", "environment.args.episode_length=20"]
    )
    assert config.stop.env_frames is not None and config.evaluation.workers == 0
    report = testing.test_pipeline(experiment=config, trainer_steps=2, episodes=1)
    assert report.trainer_steps == {"default": 2}
    assert report.episodes >= 1
