import math

import numpy as np
import pytest
import torch

from algorithm.modules.gae import gae_advantages
from algorithm.modules.policy_lag import policy_lag_stats
from algorithm.modules.vtrace import vtrace_targets


def _random_segments(seed, steps=12, batch=6):
    rng = np.random.default_rng(seed)
    shape = (steps, batch, 1)
    reward = rng.normal(size=shape)
    value = rng.normal(size=shape)
    done = rng.random(shape) < 0.15
    truncated = ~done & (rng.random(shape) < 0.1)
    log_rho = rng.normal(scale=0.7, size=shape)
    return reward, value, done, truncated, log_rho


def _reference(reward, value, done, truncated, log_rho, gamma, rho_bar, c_bar, pg_rho_bar):
    """IMPALA's definition, written as its sum (not the recursion), one segment at a time:
    vs_s = V_s + sum_{t>=s} gamma^(t-s) (prod_{i=s}^{t-1} c_i) delta_t, summed while the episode
    goes on inside the segment."""
    steps, batch = reward.shape[:2]
    vs = value[..., 0].copy()
    adv = np.zeros((steps, batch))
    for b in range(batch):

        def trained(t, b=b):
            return t < steps - 1 and not done[t, b, 0] and not truncated[t, b, 0]

        def ratio(t, b=b):
            return math.exp(log_rho[t, b, 0])

        def delta(t, b=b):
            nxt = 0.0 if done[t + 1, b, 0] else value[t + 1, b, 0]
            return min(rho_bar, ratio(t)) * (reward[t + 1, b, 0] + gamma * nxt - value[t, b, 0])

        for s in range(steps):
            if not trained(s):
                continue
            total, weight, t = 0.0, 1.0, s
            while True:
                total += weight * delta(t)
                if not trained(t + 1):
                    break
                weight *= gamma * min(c_bar, ratio(t))
                t += 1
            vs[s, b] = value[s, b, 0] + total
        for s in range(steps):
            if trained(s):
                nxt = 0.0 if done[s + 1, b, 0] else vs[s + 1, b]
                q = reward[s + 1, b, 0] + gamma * nxt
                adv[s, b] = min(pg_rho_bar, ratio(s)) * (q - value[s, b, 0])
    return vs, adv


def _tensors(*arrays):
    return [torch.as_tensor(a) for a in arrays]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("rho_bar", "c_bar", "pg_rho_bar"), [(1.0, 1.0, 1.0), (2.0, 0.5, 1.5)])
def test_vtrace_matches_the_papers_definition(seed, rho_bar, c_bar, pg_rho_bar):
    reward, value, done, truncated, log_rho = _random_segments(seed)
    vs, adv, mask = vtrace_targets(
        *_tensors(reward.astype(np.float32), value.astype(np.float32), done, truncated, log_rho),
        gamma=0.9,
        rho_bar=rho_bar,
        c_bar=c_bar,
        pg_rho_bar=pg_rho_bar,
    )
    want_vs, want_adv = _reference(
        reward, value, done, truncated, log_rho, 0.9, rho_bar, c_bar, pg_rho_bar
    )
    np.testing.assert_allclose(vs[..., 0].numpy(), want_vs, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(adv[..., 0].numpy(), want_adv, rtol=1e-4, atol=1e-4)
    expect_mask = ~(done | truncated)[..., 0]
    expect_mask[-1] = False
    assert mask[..., 0].bool().numpy().tolist() == expect_mask.tolist()


def test_on_policy_vtrace_is_the_lambda_one_return():
    reward, value, done, truncated, _ = _random_segments(3)
    reward, value, done, truncated = _tensors(
        reward.astype(np.float32), value.astype(np.float32), done, truncated
    )
    on_policy = torch.zeros_like(value)
    vs, adv, _ = vtrace_targets(reward, value, done, truncated, on_policy, gamma=0.95)
    gae_adv, gae_ret, _ = gae_advantages(reward, value, done, truncated, 0.95, 1.0)
    assert torch.allclose(vs, gae_ret, atol=1e-5)
    # on-policy, the advantage r + gamma * vs' - V is the lambda=1 advantage
    assert torch.allclose(adv, gae_adv, atol=1e-5)


def test_on_policy_vtrace_is_the_discounted_return_to_the_segment_end():
    # one episode through the whole segment: sum of rewards, then gamma^n * V of the last step
    reward = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0]).reshape(-1, 1, 1)
    value = torch.tensor([0.5, -1.0, 2.0, 0.25, 10.0]).reshape(-1, 1, 1)
    never = torch.zeros_like(value, dtype=torch.bool)
    vs, _, _ = vtrace_targets(reward, value, never, never, torch.zeros_like(value), gamma=0.5)
    expected = [1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 4 + 0.0625 * 10, 2 + 0.5 * 3 + 0.25 * 4 + 1.25]
    assert vs[:2, 0, 0].tolist() == pytest.approx(expected)
    assert vs[-1, 0, 0].item() == 10.0  # the bootstrap step keeps its value


def test_truncation_bootstraps_and_termination_does_not():
    # t: 0, 1 truncated, 2 reset, 3 done, 4 reset
    reward = torch.tensor([0.0, 1.0, 0.0, 3.0, 0.0]).reshape(-1, 1, 1)
    value = torch.tensor([1.0, 5.0, 2.0, 7.0, 4.0]).reshape(-1, 1, 1)
    done = torch.tensor([0, 0, 0, 1, 0], dtype=torch.bool).reshape(-1, 1, 1)
    truncated = torch.tensor([0, 1, 0, 0, 0], dtype=torch.bool).reshape(-1, 1, 1)
    big = torch.full_like(value, 5.0)  # ratios far above the clip: rho = 1
    vs, adv, mask = vtrace_targets(reward, value, done, truncated, big, gamma=0.9)
    assert vs[:, 0, 0].tolist() == pytest.approx([1 + 0.9 * 5, 5.0, 3.0, 7.0, 4.0])
    assert adv[:, 0, 0].tolist() == pytest.approx([1 + 4.5 - 1, 0.0, 1.0, 0.0, 0.0])
    assert mask[:, 0, 0].tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]


def test_untrained_steps_may_hold_any_log_ratio():
    reward, value, done, truncated, log_rho = _random_segments(4)
    untrained = done | truncated
    untrained[-1] = True
    poisoned = np.where(untrained, np.nan, log_rho)
    args = _tensors(reward.astype(np.float32), value.astype(np.float32), done, truncated)
    clean = vtrace_targets(*args, torch.as_tensor(log_rho), gamma=0.99)
    dirty = vtrace_targets(*args, torch.as_tensor(poisoned), gamma=0.99)
    for a, b in zip(clean, dirty, strict=True):
        assert torch.equal(a, b)


def test_clipping_bounds_the_correction():
    # far off-policy: a huge ratio is clipped at rho_bar, a tiny one shrinks the correction
    reward = torch.tensor([0.0, 1.0, 0.0]).reshape(-1, 1, 1)
    value = torch.zeros(3, 1, 1)
    never = torch.zeros_like(value, dtype=torch.bool)
    high, _, _ = vtrace_targets(reward, value, never, never, torch.full_like(value, 9.0), 0.9)
    low, _, _ = vtrace_targets(reward, value, never, never, torch.full_like(value, -9.0), 0.9)
    assert high[0, 0, 0].item() == pytest.approx(1.0)
    assert 0.0 < low[0, 0, 0].item() < 1e-3


def test_policy_lag_counts_trained_steps_only():
    versions = torch.tensor([[3], [5], [9], [0]]).reshape(4, 1, 1)
    mask = torch.tensor([1.0, 1.0, 0.0, 0.0]).reshape(4, 1, 1)
    assert policy_lag_stats(7, versions, mask) == {"policy_lag_mean": 3.0, "policy_lag_max": 4.0}
    assert policy_lag_stats(7, versions, torch.zeros_like(mask))["policy_lag_max"] == 0.0
