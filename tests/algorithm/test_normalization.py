"""Observation and return normalisation of the actor-critic policy: the running statistics
match numpy on the same data, and a checkpoint carries them."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from algorithm.actor_critic_policies.policy import ActorCriticPolicy
from algorithm.modules.normalization import RunningMeanStd, discounted_returns
from api.policy import RolloutRequest, SampleBatch

OBS = gym.spaces.Box(-np.inf, np.inf, shape=(3,), dtype=np.float32)
GAMMA = 0.9


def _numpy_returns(reward: np.ndarray, ended: np.ndarray, gamma: float) -> np.ndarray:
    """The same quantity as ``discounted_returns``, written independently over numpy."""
    out = np.zeros_like(reward, dtype=np.float64)
    for b in range(reward.shape[1]):
        running = 0.0
        for t in range(reward.shape[0]):
            running = running * gamma + float(reward[t, b, 0])
            out[t, b, 0] = running
            if ended[t, b, 0]:
                running = 0.0
    return out


def _batch(rng: np.random.Generator, steps: int = 12, envs: int = 5) -> SampleBatch:
    """Observations far from zero mean/unit std, so normalisation visibly changes them."""
    obs = rng.normal([5.0, -3.0, 100.0], [2.0, 0.5, 30.0], size=(steps, envs, 3))
    return SampleBatch(
        obs=torch.as_tensor(obs, dtype=torch.float32),
        reward=torch.as_tensor(rng.normal(2.0, 3.0, size=(steps, envs, 1)), dtype=torch.float32),
        done=torch.as_tensor(rng.random((steps, envs, 1)) < 0.15),
        truncated=torch.as_tensor(rng.random((steps, envs, 1)) < 0.05),
    )


def _policy(**kwargs) -> ActorCriticPolicy:
    return ActorCriticPolicy(
        observation_space=OBS, action_space=gym.spaces.Discrete(2), seed=0, **kwargs
    )


def test_running_mean_std_matches_numpy_over_several_batches():
    rng = np.random.default_rng(1)
    batches = [rng.normal(4.0, 2.5, size=(n, 3)) for n in (7, 1, 30, 12)]
    stats = RunningMeanStd((3,))
    for b in batches:
        stats.update(torch.as_tensor(b))
    every = np.concatenate(batches)
    # the initial count (1e-4 of a zero-mean, unit-variance prior) moves things by ~1e-5
    np.testing.assert_allclose(stats.mean.numpy(), every.mean(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(stats.var.numpy(), every.var(0), rtol=1e-4, atol=1e-4)
    assert stats.count.item() == pytest.approx(len(every), abs=1e-3)
    x = rng.normal(size=(4, 3))
    expected = np.clip((x - every.mean(0)) / np.sqrt(every.var(0) + 1e-8), -10, 10)
    got = stats.normalize(torch.as_tensor(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)


def test_discounted_returns_match_numpy():
    batch = _batch(np.random.default_rng(2))
    ended = (batch.done | batch.truncated).numpy()
    got = discounted_returns(batch.reward, batch.done | batch.truncated, GAMMA).numpy()
    np.testing.assert_allclose(got, _numpy_returns(batch.reward.numpy(), ended, GAMMA), rtol=1e-6)


def test_policy_statistics_follow_training_batches_as_numpy_does():
    rng = np.random.default_rng(3)
    policy = _policy(normalize_obs=True, normalize_returns=True)
    batches = [_batch(rng) for _ in range(3)]
    scaled = [policy.normalize_batch(b, GAMMA) for b in batches]
    obs = np.concatenate([b.obs.numpy().reshape(-1, 3) for b in batches]).astype(np.float64)
    returns = np.concatenate(
        [
            _numpy_returns(b.reward.numpy(), (b.done | b.truncated).numpy(), GAMMA).reshape(-1)
            for b in batches
        ]
    )
    net = policy.module
    np.testing.assert_allclose(net.obs_norm.mean.numpy(), obs.mean(0), rtol=1e-4)
    np.testing.assert_allclose(net.obs_norm.var.numpy(), obs.var(0), rtol=1e-4)
    np.testing.assert_allclose(net.return_norm.var.numpy(), returns.var(), rtol=1e-4)
    # the last batch's rewards are divided by the std of every return seen so far
    std = np.sqrt(returns.var() + 1e-8)
    np.testing.assert_allclose(scaled[-1].numpy(), batches[-1].reward.numpy() / std, rtol=1e-4)


def test_normalisation_off_leaves_rewards_and_has_no_statistics():
    policy = _policy()
    batch = _batch(np.random.default_rng(4))
    assert policy.module.obs_norm is None and policy.module.return_norm is None
    assert torch.equal(policy.normalize_batch(batch, GAMMA), batch.reward)


def _values(policy: ActorCriticPolicy, obs: np.ndarray) -> np.ndarray:
    n = len(obs)
    request = RolloutRequest(
        obs=obs.astype(np.float32),
        is_evaluation=np.ones((n, 1), dtype=bool),
        on_reset=np.ones((n, 1), dtype=bool),
    )
    return np.asarray(policy.rollout(request).policy_output.value)


@pytest.mark.parametrize("numpy_inference", [True, False])
def test_checkpoint_keeps_the_statistics(numpy_inference):
    """Save after statistics moved, load into a fresh policy: the same normalised inputs (and
    so the same values); a policy that did not load them answers differently."""
    rng = np.random.default_rng(5)
    trained = _policy(normalize_obs=True, normalize_returns=True, numpy_inference=numpy_inference)
    for _ in range(2):
        trained.normalize_batch(_batch(rng), GAMMA)
    checkpoint = trained.get_checkpoint()
    assert {"obs_norm.mean", "obs_norm.var", "obs_norm.count"} <= set(checkpoint["model"])
    assert {"return_norm.mean", "return_norm.var", "return_norm.count"} <= set(checkpoint["model"])
    # as it crosses a socket or the disk: numpy arrays
    loaded = _policy(normalize_obs=True, normalize_returns=True, numpy_inference=numpy_inference)
    unloaded = _policy(normalize_obs=True, normalize_returns=True, numpy_inference=numpy_inference)
    as_numpy = {k: v.numpy() for k, v in checkpoint["model"].items()}
    loaded.load_checkpoint({**checkpoint, "model": as_numpy})
    for name in ("obs_norm", "return_norm"):
        for buf in ("mean", "var", "count"):
            assert torch.equal(
                getattr(getattr(loaded.module, name), buf),
                getattr(getattr(trained.module, name), buf),
            )
    x = torch.as_tensor(_batch(rng).obs[0])
    assert torch.equal(loaded.module.obs_norm.normalize(x), trained.module.obs_norm.normalize(x))
    obs = x.numpy()
    np.testing.assert_allclose(_values(loaded, obs), _values(trained, obs), rtol=1e-6)
    # same weights (same seed, statistics are not trained by gradients), other statistics:
    assert not np.allclose(_values(unloaded, obs), _values(trained, obs), rtol=1e-3)
