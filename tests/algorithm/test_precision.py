"""A trainer's ``precision="bfloat16"``: the convolutions and matrix products of its forward and
backward passes take bfloat16 inputs, while weights, optimizer state, heads and losses stay
float32, and the update is close to the float32 one."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from algorithm.actor_critic_policies.policy import ActorCriticPolicy
from algorithm.impala.trainer import ImpalaTrainer
from algorithm.modules import actor_critic_trainer
from algorithm.ppo.trainer import PPOTrainer
from api.policy import RolloutRequest

FRAMES = gym.spaces.Box(0, 255, shape=(4, 36, 36), dtype=np.uint8)
"""The smallest frames the Nature CNN takes: its convolutions are most of the compute."""


def _policy():
    return ActorCriticPolicy(
        observation_space=FRAMES, action_space=gym.spaces.Discrete(6), seed=0, hidden_sizes=[]
    )


def _dtypes_seen(policy) -> dict[str, torch.dtype]:
    """Records the output dtype of the first convolution and the input dtype of the policy head
    (``seen``), through forward hooks."""
    seen: dict[str, torch.dtype] = {}
    net = policy.module
    conv = next(m for m in net.modules() if isinstance(m, torch.nn.Conv2d))
    conv.register_forward_hook(lambda m, i, o: seen.__setitem__("conv", o.dtype))
    net.policy_head.register_forward_hook(lambda m, i, o: seen.__setitem__("head_in", i[0].dtype))
    return seen


@pytest.mark.parametrize("trainer_class", [PPOTrainer, ImpalaTrainer])
def test_bfloat16_convolves_in_bfloat16_and_keeps_heads_weights_and_adam_float32(
    make_batch, trainer_class
):
    policy = _policy()
    seen = _dtypes_seen(policy)
    trainer = trainer_class(policy, lr=1e-3, precision="bfloat16")
    before = [p.detach().clone() for p in policy.parameters()]
    out = trainer._analyze(make_batch(policy, FRAMES, steps=5, segments=3).apply(torch.as_tensor))
    assert seen == {"conv": torch.bfloat16, "head_in": torch.float32}
    assert out.new_log_prob.dtype == out.value.dtype == out.entropy.dtype == torch.float32

    result = trainer.step(make_batch(policy, FRAMES, steps=5, segments=3))
    assert all(np.isfinite(v) for v in result.stats.values()), result.stats
    assert all(p.dtype == torch.float32 for p in policy.parameters())
    moments = [v for s in trainer.optimizer.state.values() for v in s.values() if v.dim() > 0]
    assert moments and all(m.dtype == torch.float32 for m in moments)
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))
    # the rollout (a policy worker's forward pass) is not under the trainer's autocast
    seen.clear()
    policy.eval_mode()
    policy.rollout(_request())
    assert seen["conv"] == torch.float32


def _request():
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, (2, *FRAMES.shape), dtype=np.uint8)
    return RolloutRequest(obs=obs, on_reset=np.ones((2, 1), dtype=bool))


def test_bfloat16_log_probs_values_and_gradient_are_close_to_float32(make_batch):
    """What makes bfloat16 safe for PPO: on the same batch and weights, log-probabilities move by
    far less than PPO's clip (0.1-0.2 of the ratio) and the gradient points the same way.

    The policy head is scaled up from its near-zero initialisation so that the logits, and so
    the log-probabilities, depend on the features. Measured: float32 heads change log-probs by
    at most 1.8e-3-1.9e-3; bfloat16 heads (autocast left on over them) by 7.8e-3-1.1e-2."""
    policy = _policy()
    with torch.no_grad():
        policy.module.policy_head.weight.mul_(100)
    batch = make_batch(policy, FRAMES, steps=9, segments=4).apply(torch.as_tensor)
    outputs, grads = {}, {}
    for precision in ("float32", "bfloat16"):
        trainer = PPOTrainer(policy, precision=precision)
        for p in policy.parameters():
            p.grad = None
        out = trainer._analyze(batch)
        (out.new_log_prob.sum() + out.value.sum() + out.entropy.sum()).backward()
        outputs[precision] = out
        grads[precision] = torch.cat([p.grad.flatten() for p in policy.parameters()])
    full, half = outputs["float32"], outputs["bfloat16"]
    # the rollout's log-probs are float32: the first minibatch of a step starts at ratio ~1
    assert (full.new_log_prob - full.old_log_prob).abs().max() < 1e-4
    log_prob_change = (half.new_log_prob - full.new_log_prob).abs().max()
    assert 0 < log_prob_change < 5e-3  # changed (it ran in bfloat16), far inside the clip
    assert (half.value - full.value).abs().max() < 0.02
    cosine = torch.nn.functional.cosine_similarity(grads["float32"], grads["bfloat16"], dim=0)
    assert cosine > 0.99


@pytest.mark.parametrize("trainer_class", [PPOTrainer, ImpalaTrainer])
def test_an_unknown_precision_is_refused_naming_the_two(trainer_class):
    with pytest.raises(ValueError, match="precision must be 'float32' or 'bfloat16', got 'fp16'"):
        trainer_class(_policy(), precision="fp16")


def test_bfloat16_on_a_cpu_without_bfloat16_units_warns_that_it_is_slower(monkeypatch, caplog):
    monkeypatch.setattr(actor_critic_trainer, "_cpu_has_bf16", lambda: False)
    PPOTrainer(_policy(), precision="float32")
    assert not caplog.records
    PPOTrainer(_policy(), precision="bfloat16")
    assert "on a CPU without bfloat16 units: training will be slower" in caplog.text
