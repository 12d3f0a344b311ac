"""Every example experiment's policy and trainer pass ``test_pipeline`` (a few trainer steps in the
runtime's serial mode): Discrete, Box, GRU memory, and two policies on dict observations with
action masks."""

import pytest

from api import testing


@pytest.mark.parametrize(
    "experiment",
    [
        "cartpole-ppo",
        "pendulum-ppo",
        "memory-gru-ppo",
        "gather-2p-ppo",
        "cartpole-impala",
        "cartpole-dqn",
        "pendulum-sac",
    ],
)
def test_example_experiment_passes_the_pipeline_check(experiment):
    report = testing.test_pipeline(experiment=experiment, trainer_steps=2, envs=2)
    assert all(steps >= 2 for steps in report.trainer_steps.values()), report
    for stats in report.last_stats.values():
        assert stats.get("approx_kl", 0.0) >= -1e-6  # PPO's; IMPALA has none
        assert stats["policy_lag_max"] >= stats["policy_lag_mean"] >= 0.0
