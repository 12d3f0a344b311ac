import math

import torch

from algorithm.modules.distributions import Categorical, DiagGaussian, Hybrid, MultiDiscrete


def test_categorical_matches_torch_without_mask():
    logits = torch.randn(7, 4)
    dist, ref = Categorical(logits), torch.distributions.Categorical(logits=logits)
    action = ref.sample()
    assert torch.allclose(dist.log_prob(action)[:, 0], ref.log_prob(action), atol=1e-6)
    assert torch.allclose(dist.entropy()[:, 0], ref.entropy(), atol=1e-6)
    assert dist.log_prob(action).shape == (7, 1)


def test_masked_categorical_never_chooses_an_illegal_action():
    logits = torch.tensor([[5.0, 0.0, 9.0, 1.0]]).repeat(500, 1)
    mask = torch.tensor([[True, True, False, False]]).repeat(500, 1)
    dist = Categorical(logits, mask)
    generator = torch.Generator().manual_seed(0)
    assert set(dist.sample(generator).tolist()) <= {0, 1}
    assert dist.mode().tolist() == [0] * 500
    assert torch.isfinite(dist.entropy()).all()
    assert torch.allclose(
        dist.log_prob(torch.zeros(500)).exp() + dist.log_prob(torch.ones(500)).exp(),
        torch.ones(500, 1),
    )


def test_a_row_without_legal_actions_falls_back_to_all_legal():
    dist = Categorical(torch.zeros(1, 3), torch.zeros(1, 3, dtype=torch.bool))
    assert torch.allclose(dist.entropy(), torch.tensor([[math.log(3)]]))


def test_multidiscrete_is_the_sum_of_its_parts():
    logits = torch.randn(5, 2 + 3)
    dist = MultiDiscrete(logits, [2, 3])
    action = dist.sample()
    assert action.shape == (5, 2) and action.dtype == torch.int64
    a, b = Categorical(logits[:, :2]), Categorical(logits[:, 2:])
    expected = a.log_prob(action[:, 0]) + b.log_prob(action[:, 1])
    assert torch.allclose(dist.log_prob(action), expected)
    assert torch.allclose(dist.entropy(), a.entropy() + b.entropy())


def test_multidiscrete_masks_each_component():
    mask = torch.tensor([[False, True, True, False, False]]).repeat(200, 1)
    dist = MultiDiscrete(torch.zeros(200, 5), [2, 3], mask)
    action = dist.sample()
    assert (action[:, 0] == 1).all() and (action[:, 1] == 0).all()


def test_diag_gaussian_matches_torch_normal():
    mean, log_std = torch.randn(6, 3), torch.randn(3)
    dist = DiagGaussian(mean, log_std)
    ref = torch.distributions.Normal(mean, log_std.exp())
    action = dist.sample()
    assert torch.allclose(dist.log_prob(action)[:, 0], ref.log_prob(action).sum(-1), atol=1e-5)
    assert torch.allclose(dist.entropy()[:, 0], ref.entropy().sum(-1), atol=1e-5)
    assert torch.equal(dist.mode(), mean)


def test_hybrid_is_its_choices_and_its_values_together():
    params, log_std = torch.randn(9, 2 + 3 + 2), torch.randn(2)
    dist = Hybrid.of(params, [2, 3], log_std)
    choices, values = MultiDiscrete(params[:, :5], [2, 3]), DiagGaussian(params[:, 5:], log_std)
    action = dist.sample()
    assert action.shape == (9, 4) and action.dtype == torch.float32
    expected = choices.log_prob(action[:, :2].long()) + values.log_prob(action[:, 2:])
    assert torch.allclose(dist.log_prob(action), expected)
    assert torch.allclose(dist.entropy(), choices.entropy() + values.entropy())
    mode = dist.mode()
    assert torch.equal(mode[:, :2].long(), choices.mode()) and torch.equal(
        mode[:, 2:], params[:, 5:]
    )
