import numpy as np
import pytest
import torch

from algorithm.modules.gae import gae_advantages


def _column(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype).reshape(-1, 1, 1)


def test_gae_with_truncation_and_termination_inside_a_segment():
    # t: 0 reset, 1, 2 truncated, 3 reset, 4 done, 5 reset (bootstrap step of the segment)
    reward = _column([0.0, 1.0, 2.0, 0.0, 3.0, 0.0])
    value = _column([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    done = _column([0, 0, 0, 0, 1, 0], torch.bool)
    truncated = _column([0, 0, 1, 0, 0, 0], torch.bool)
    adv, ret, mask = gae_advantages(reward, value, done, truncated, gamma=0.9, gae_lambda=0.5)
    # t3: 3 + 0 (terminal) - 4 = -1. t1: 2 + 0.9 * 3 (exact bootstrap of the truncated obs) - 2.
    # t0: (1 + 0.9 * 2 - 1) + 0.9 * 0.5 * A1.
    expected = [1.8 + 0.45 * 2.7, 2.7, 0.0, -1.0, 0.0, 0.0]
    assert adv[:, 0, 0].tolist() == pytest.approx(expected)
    assert mask[:, 0, 0].tolist() == [1.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    assert torch.allclose(ret - adv, value)


def test_gae_bootstraps_through_the_last_value_at_the_segment_end():
    steps = 6
    reward = torch.ones(steps, 1, 1)
    value = torch.full((steps, 1, 1), 0.5)
    never = torch.zeros(steps, 1, 1, dtype=torch.bool)
    adv, _, mask = gae_advantages(reward, value, never, never, gamma=0.9, gae_lambda=0.5)
    delta = 1.0 + 0.9 * 0.5 - 0.5
    expected = [0.0] * steps
    for t in range(steps - 2, -1, -1):
        expected[t] = delta + 0.45 * expected[t + 1]
    assert adv[:, 0, 0].tolist() == pytest.approx(expected)
    assert mask[:, 0, 0].tolist() == [1.0] * (steps - 1) + [0.0]


def test_gae_is_vectorised_over_segments():
    rng = np.random.default_rng(0)
    shape = (9, 5, 1)
    reward = torch.tensor(rng.normal(size=shape), dtype=torch.float32)
    value = torch.tensor(rng.normal(size=shape), dtype=torch.float32)
    done = torch.tensor(rng.random(shape) < 0.2)
    truncated = torch.tensor(rng.random(shape) < 0.1)
    adv, _, _ = gae_advantages(reward, value, done, truncated, 0.99, 0.95)
    for b in range(shape[1]):
        one, _, _ = gae_advantages(
            reward[:, b : b + 1],
            value[:, b : b + 1],
            done[:, b : b + 1],
            truncated[:, b : b + 1],
            0.99,
            0.95,
        )
        assert torch.allclose(adv[:, b : b + 1], one)
