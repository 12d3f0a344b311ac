"""Every example experiment's policy and trainer pass ``test_pipeline`` (a few trainer steps in the
runtime's serial mode): Discrete, Box, GRU memory, and two policies on dict observations with
action masks."""

import math

import pytest

from api import testing

TRAINER_STATS = {
    "cartpole-ppo": "approx_kl",
    "pendulum-ppo": "approx_kl",
    "memory-gru-ppo": "approx_kl",
    "gather-2p-ppo": "approx_kl",
    "cartpole-impala": "rho_mean",  # importance weights: positive
    "cartpole-dqn": "td_abs_mean",  # the TD errors it learned from: not all zero
    "pendulum-sac": "alpha",  # the entropy temperature: positive
}
"""Per experiment, a stat only its trainer reports and what it must be after two steps."""


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
        assert all(math.isfinite(v) for v in stats.values() if isinstance(v, float)), stats
        # each trainer's own measure of its update, present and of the right sign
        kind = TRAINER_STATS[experiment]
        assert kind in stats, (experiment, sorted(stats))
        assert stats[kind] >= -1e-6 if kind == "approx_kl" else stats[kind] > 0.0, stats
        if experiment in ("cartpole-dqn", "pendulum-sac"):  # replayed: old by design, no lag
            assert stats["sample_age_versions"] >= 0.0 and "policy_lag_mean" not in stats
        else:
            assert stats["policy_lag_max"] >= stats["policy_lag_mean"] >= 0.0


def test_an_environment_alone_or_its_id_as_experiment_is_checked_as_troupe_train_runs_it():
    """``test_pipeline("Acrobot-v1")`` said it "needs a policy", and ``experiment=`` took only a
    registered experiment; ``troupe test-pipeline ENV`` and ``troupe.train(ENV)`` take an id."""
    for report in (
        testing.test_pipeline("Acrobot-v1", trainer_steps=1, envs=2),
        testing.test_pipeline(experiment="Acrobot-v1", trainer_steps=1, envs=2),
    ):
        assert report.experiment == "acrobot-v1-ppo"
        assert report.trainers == {"default": "ppo"}
        assert report.trainer_steps["default"] >= 1
