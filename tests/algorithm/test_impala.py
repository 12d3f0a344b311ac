"""IMPALA's trainer, the V-trace option of PPO, and the actor-critic policy's analyze for both."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from algorithm.actor_critic_policies.policy import ActorCriticPolicy
from algorithm.impala.trainer import ImpalaAnalyzedResult, ImpalaTrainer
from algorithm.modules.vtrace import vtrace_targets
from algorithm.ppo.trainer import PPOTrainer
from api import testing

OBS = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)


def _policy(seed=0, **kwargs):
    return ActorCriticPolicy(OBS, gym.spaces.Discrete(3), seed=seed, **kwargs)


def _parameters(policy):
    return [p.detach().clone() for p in policy.parameters()]


@pytest.mark.parametrize("rnn_hidden", [0, 8])
def test_impala_step_updates_parameters_version_and_reports_lag(make_batch, rnn_hidden):
    policy = _policy(rnn_hidden=rnn_hidden)
    batch = make_batch(policy, OBS, steps=9, segments=6)
    policy._version = 4  # the samples were chosen by version 0: four versions ago
    trainer = ImpalaTrainer(policy, lr=1e-3, minibatches=2)
    before = _parameters(policy)
    result = trainer.step(batch)
    assert result.step == 1 and policy.version == 5
    assert result.stats["policy_lag_mean"] == 4.0 and result.stats["policy_lag_max"] == 4.0
    assert {"policy_loss", "value_loss", "entropy", "rho_mean", "rho_clip_fraction"} <= set(
        result.stats
    )
    assert all(np.isfinite(v) for v in result.stats.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))


def test_actor_critic_analyzes_for_impala(make_batch):
    policy = _policy()
    batch = make_batch(policy, OBS, steps=5, segments=3)
    out = policy.analyze(batch, target="impala")
    assert isinstance(out, ImpalaAnalyzedResult)
    for name in ImpalaTrainer.required_fields():
        assert getattr(out, name).shape == (5, 3, 1)
    # the behaviour log-probs are the ones recorded at rollout
    np.testing.assert_allclose(out.old_log_prob.numpy(), batch.policy_output.log_prob)
    with pytest.raises(ValueError, match="'ppo' and 'impala'"):
        policy.analyze(batch, target="dqn")


def test_impala_value_targets_are_vtrace_on_the_current_values(make_batch):
    policy = _policy()
    batch = make_batch(policy, OBS, steps=9, segments=4)
    trainer = ImpalaTrainer(policy, lr=0.0, gamma=0.9, value_coef=1.0, entropy_coef=0.0)
    t = batch.apply(torch.as_tensor)
    with torch.no_grad():
        out = policy.analyze(batch, target="impala")
        vs, _, mask = vtrace_targets(
            t.reward, out.value, t.done, t.truncated, out.new_log_prob - out.old_log_prob, 0.9
        )
        want = 0.5 * ((out.value - vs).pow(2) * mask).sum() / mask.sum()
    stats = trainer.step(batch).stats
    assert stats["value_loss"] == pytest.approx(float(want), rel=1e-5)


def test_c_bar_above_rho_bar_is_refused():
    with pytest.raises(ValueError, match="c_bar"):
        ImpalaTrainer(_policy(), rho_bar=1.0, c_bar=2.0)
    with pytest.raises(ValueError, match="c_bar"):
        PPOTrainer(_policy(), vtrace=True, rho_bar=1.0, c_bar=2.0)


def test_ppo_vtrace_on_policy_makes_the_same_update_as_gae(make_batch):
    gae, vtrace = (_policy(), _policy())
    batch = make_batch(gae, OBS, steps=9, segments=4)
    a = PPOTrainer(gae, lr=1e-3, seed=0, gae_lambda=1.0).step(batch).stats
    b = PPOTrainer(vtrace, lr=1e-3, seed=0, gae_lambda=1.0, vtrace=True).step(batch).stats
    # rho = c = 1 on-policy: V-trace is the lambda-return, and at lambda = 1 its advantages
    # r + gamma * vs' - V are GAE's too
    assert b["advantage_mean"] == pytest.approx(a["advantage_mean"], rel=1e-4, abs=1e-5)
    for x, y in zip(gae.parameters(), vtrace.parameters()):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


def test_ppo_vtrace_corrects_stale_samples(make_batch):
    behaviour, learner = _policy(seed=1), _policy(seed=2)
    batch = make_batch(behaviour, OBS, steps=9, segments=4)
    gae = PPOTrainer(learner, seed=0)
    vtrace = PPOTrainer(learner, seed=0, vtrace=True)
    t = batch.apply(torch.as_tensor)
    gae_adv, _, mask = gae._targets(t, t.policy_output.value.float())
    vtrace_adv, vtrace_ret, vtrace_mask = vtrace._targets(t, t.policy_output.value.float())
    assert torch.equal(mask, vtrace_mask)
    assert not torch.allclose(gae_adv, vtrace_adv)  # other values, ratios far from 1
    with torch.no_grad():
        value = learner.analyze(batch).value
    # the learner's own values, not the behaviour policy's, anchor V-trace's returns
    np.testing.assert_allclose(vtrace_ret[-1].numpy(), value[-1].numpy(), rtol=1e-6)
    learner._version = 2
    stats = vtrace.step(batch).stats
    assert stats["policy_lag_mean"] == 2.0 and np.isfinite(stats["loss"])


def test_impala_passes_the_pipeline_check():
    report = testing.test_pipeline("CartPole-v1", "actor-critic", "impala", trainer_steps=3)
    assert report.trainer_steps["default"] >= 3
    assert report.last_stats["default"]["policy_lag_max"] >= 0.0


def test_impala_shares_ppos_learning_rate_schedule_and_argument_checks(make_batch):
    policy = _policy()
    trainer = ImpalaTrainer(policy, lr=1e-3, lr_schedule="linear", total_steps=4)
    lrs = [trainer.step(make_batch(policy, OBS, 5, 2)).stats["lr"] for _ in range(4)]
    assert lrs == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])
    with pytest.raises(ValueError, match="needs total_steps"):
        ImpalaTrainer(policy, lr_schedule="linear")
    with pytest.raises(ValueError, match="minibatches must be at least 1, got 0"):
        ImpalaTrainer(policy, minibatches=0)
    with pytest.raises(TypeError, match=r"^ImpalaTrainer needs a policy with parameters"):
        ImpalaTrainer(object())
