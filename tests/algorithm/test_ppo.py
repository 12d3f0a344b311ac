import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from algorithm.actor_critic_policies.policy import ActorCriticOutput, ActorCriticPolicy
from algorithm.modules.distributions import Categorical
from algorithm.modules.gae import gae_advantages
from algorithm.policy import SingleModelPytorchPolicy
from algorithm.ppo.trainer import PPOTrainer
from api import registry, testing
from api.policy import RolloutResult

OBS = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
STATS = {
    "policy_loss",
    "value_loss",
    "entropy",
    "approx_kl",
    "clip_fraction",
    "explained_variance",
    "grad_norm",
    "lr",
}


def _policy(**kwargs):
    return ActorCriticPolicy(
        observation_space=OBS, action_space=gym.spaces.Discrete(3), seed=0, **kwargs
    )


@pytest.mark.parametrize("rnn_hidden", [0, 8])
def test_one_step_updates_parameters_and_version(make_batch, rnn_hidden):
    policy = _policy(rnn_hidden=rnn_hidden)
    trainer = PPOTrainer(policy, lr=1e-3, value_clip=0.2)
    before = [p.detach().clone() for p in policy.parameters()]
    result = trainer.step(make_batch(policy, OBS, steps=9, segments=8))
    assert result.step == 1 and policy.version == 1
    assert set(result.stats) >= STATS
    assert all(np.isfinite(v) for v in result.stats.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))


def test_actions_that_are_never_executed_are_not_trained_on(make_batch):
    policy = _policy()
    batch = make_batch(policy, OBS, steps=9, segments=4, seed=1)
    ended = (batch.done | batch.truncated)[..., 0]
    ended[-1] = True  # the bootstrap step
    # an out-of-range action would make log_prob fail if any of these steps reached the loss
    batch.action[ended] = 99
    PPOTrainer(policy).step(batch)


def _gae_inputs(batch):
    t = lambda x: torch.as_tensor(x)  # noqa: E731
    advantages, returns, mask = gae_advantages(
        t(batch.reward), t(batch.policy_output.value), t(batch.done), t(batch.truncated), 0.99, 0.95
    )
    return batch.apply(t), advantages, returns, mask


def test_minibatches_cover_valid_transitions_once_per_epoch(make_batch):
    policy = _policy()
    trainer = PPOTrainer(policy, minibatches=3)
    batch, advantages, returns, mask = _gae_inputs(make_batch(policy, OBS, steps=9, segments=4))
    pool, pool_adv, _, pool_mask = trainer._training_pool(batch, advantages, returns, mask)
    valid = mask[..., 0].bool()
    # feed-forward: the valid transitions, [1, N], and no mask (each of them is trained on)
    assert pool_mask is None and pool_adv.shape == (1, int(valid.sum()), 1)
    assert torch.equal(pool.obs[0], batch.obs[valid]) and torch.equal(
        pool_adv[0], advantages[valid]
    )
    chunks = trainer._minibatch_indices(pool_adv.shape[1], pool_adv.device)
    assert len(chunks) == 3
    assert sorted(i for c in chunks for i in c.tolist()) == list(range(int(valid.sum())))


def test_a_steps_minibatches_reach_the_device_in_one_copy_as_the_same_shuffles(monkeypatch):
    """All epochs' minibatch indices are uploaded at once (a blocking copy to a GPU drains its
    stream), and they are the shuffles that one upload per minibatch gave: the same generator
    draws, epoch after epoch, split the same way."""
    trainer = PPOTrainer(_policy(), minibatches=3, seed=5)
    want = []
    rng = np.random.default_rng(5)
    for _ in range(4):
        want += [c.tolist() for c in np.array_split(rng.permutation(10), 3)]
    uploads = []
    as_tensor = torch.as_tensor
    monkeypatch.setattr(torch, "as_tensor", lambda *a, **k: uploads.append(1) or as_tensor(*a, **k))
    chunks = trainer._minibatch_indices(10, torch.device("cpu"), passes=4)
    assert len(uploads) == 1
    assert [c.tolist() for c in chunks] == want


def test_linear_schedule_decays_to_zero(make_batch):
    policy = _policy()
    trainer = PPOTrainer(policy, lr=1e-3, lr_schedule="linear", total_steps=4, epochs=1)
    lrs = [trainer.step(make_batch(policy, OBS, 5, 2)).stats["lr"] for _ in range(4)]
    assert lrs == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])
    with pytest.raises(ValueError, match="needs total_steps"):
        PPOTrainer(policy, lr_schedule="linear")


def test_trainer_checkpoint_round_trip(make_batch):
    policy = _policy()
    trainer = PPOTrainer(policy)
    trainer.step(make_batch(policy, OBS, 5, 2))
    other = PPOTrainer(policy)
    other.load_checkpoint(trainer.get_checkpoint())
    assert other.get_checkpoint()["steps"] == 1
    assert (
        other.optimizer.state_dict()["state"].keys()
        == trainer.optimizer.state_dict()["state"].keys()
    )


# A policy written the way SingleModelPytorchPolicy's docstring teaches.
class TinyNet(nn.Module):
    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.pi = nn.Linear(obs_dim, n_actions)
        self.v = nn.Linear(obs_dim, 1)

    def forward(self, obs):
        return self.pi(obs), self.v(obs)


class TinyPolicy(SingleModelPytorchPolicy):
    def __init__(self, observation_space, action_space, device="cpu"):
        super().__init__(TinyNet(observation_space.shape[0], action_space.n), device=device)

    def rollout(self, request, **kwargs):
        with torch.no_grad():
            logits, value = self.module(self.to_tensor(request.obs))
            dist = Categorical(logits)
            greedy = self.to_tensor(request.is_evaluation).reshape(-1)
            action = torch.where(greedy, dist.mode(), dist.sample())
            out = ActorCriticOutput(log_prob=dist.log_prob(action), value=value)
        return RolloutResult(action=self.to_numpy(action), policy_output=self.to_numpy(out))

    def analyze(self, sample, target="ppo", **kwargs):
        obs = self.to_tensor(sample.obs)
        steps, batch = obs.shape[:2]
        logits, value = self.net(obs.flatten(0, 1))
        dist = Categorical(logits)
        old = self.to_tensor(sample.policy_output)
        return PPOTrainer.AnalyzedResult(
            new_log_prob=dist.log_prob(self.to_tensor(sample.action).flatten()).view(
                steps, batch, 1
            ),
            old_log_prob=old.log_prob,
            entropy=dist.entropy().view(steps, batch, 1),
            value=value.view(steps, batch, 1),
            old_value=old.value,
        )


def test_a_user_policy_written_from_the_docstring_trains_with_ppo(make_batch):
    policy = TinyPolicy(OBS, gym.spaces.Discrete(2))
    assert policy.default_policy_state is None and policy.version == 0
    result = PPOTrainer(policy).step(make_batch(policy, OBS, steps=9, segments=4))
    assert result.step == 1 and policy.version == 1
    assert np.isfinite(result.stats["policy_loss"])


@pytest.mark.timeout(300, method="thread")  # a hang in gloo's C++ ends the test, not CI
def test_data_parallel_setup_in_a_single_process_group(make_batch, gloo_group):
    policy = _policy()
    policy.distributed_setup()
    assert isinstance(policy.net, nn.parallel.DistributedDataParallel)
    assert policy.module is policy.net.module
    assert PPOTrainer(policy).step(make_batch(policy, OBS, 5, 4)).step == 1


def test_a_user_policy_passes_the_pipeline_check():
    registry.register_policy("tiny-user-policy", TinyPolicy, override=True)
    try:
        report = testing.test_pipeline("CartPole-v1", "tiny-user-policy", "ppo", trainer_steps=2)
    finally:
        registry.policies.unregister("tiny-user-policy")
    assert report.trainer_steps["default"] >= 2


def test_recurrent_policies_train_on_whole_segments(make_batch):
    policy = _policy(rnn_hidden=8)
    trainer = PPOTrainer(policy, minibatches=2)
    batch, advantages, returns, mask = _gae_inputs(make_batch(policy, OBS, steps=9, segments=5))
    pool = trainer._training_pool(batch, advantages, returns, mask)
    assert pool[0] is batch and pool[3] is mask  # [T, B] segments with their mask
    chunks = trainer._minibatch_indices(mask.shape[1], mask.device)
    assert sorted(b for segments in chunks for b in segments.tolist()) == list(range(5))


def _twin_trainers(**kwargs):
    """Two trainers on two identical policies."""
    return [PPOTrainer(_policy(**kwargs), lr=1e-3, seed=0) for _ in range(2)]


def _parameters(trainer):
    return [p.detach().clone() for p in trainer.policy.parameters()]


@pytest.mark.parametrize("fused", [False, True])
def test_fast_adam_makes_the_same_update_as_the_per_parameter_loop(make_batch, fused):
    fast, plain = (PPOTrainer(_policy(), lr=1e-3, seed=0, fused_adam=fused) for _ in range(2))
    group = fast.optimizer.param_groups[0]
    assert group["foreach"] != group["fused"]
    assert group["fused"] or not fused  # fused where this torch has it
    for g in plain.optimizer.param_groups:
        g.update(fused=False, foreach=False)
    for seed in range(3):
        batch = make_batch(fast.policy, OBS, steps=9, segments=4, seed=seed)
        fast_stats, plain_stats = fast.step(batch).stats, plain.step(batch).stats
        assert fast_stats == pytest.approx(plain_stats, rel=1e-4, abs=1e-6)
    for a, b in zip(_parameters(fast), _parameters(plain)):
        torch.testing.assert_close(a, b)


def test_feed_forward_minibatches_skip_the_mask_without_changing_the_update(make_batch):
    unmasked, masked = _twin_trainers()
    batch, advantages, returns, mask = _gae_inputs(make_batch(unmasked.policy, OBS, 9, 4))
    pool, adv, ret, _ = unmasked._training_pool(batch, advantages, returns, mask)
    stats = unmasked._update(pool, adv, ret, None)
    masked_stats = masked._update(pool, adv, ret, torch.ones_like(adv))
    torch.testing.assert_close(stats, masked_stats)
    for a, b in zip(_parameters(unmasked), _parameters(masked)):
        torch.testing.assert_close(a, b)


def test_checkpoint_of_a_per_parameter_adam_loads_into_the_fast_one(make_batch):
    trainer, other = _twin_trainers()
    for g in other.optimizer.param_groups:
        g.update(fused=False, foreach=False)
    other.step(make_batch(other.policy, OBS, 5, 2))
    trainer.load_checkpoint(other.get_checkpoint())
    group = trainer.optimizer.param_groups[0]
    assert (group["fused"], group["foreach"]) in ((True, False), (False, True))
    result = trainer.step(make_batch(trainer.policy, OBS, 5, 2))
    assert result.step == 2 and np.isfinite(result.stats["loss"])


def test_a_batch_whose_returns_do_not_vary_leaves_explained_variance_out(make_batch):
    """Every reward 0 and the values equal (one observation everywhere, a zero value): the
    explained variance is undefined. It used to be reported as NaN, and the trainer worker
    ended the run on it as on a diverged loss."""
    policy = _policy()
    batch = make_batch(policy, OBS, steps=9, segments=8)
    batch.obs[:] = 0.0
    batch.reward[:] = 0.0
    batch.policy_output.value[:] = 0.0
    with torch.no_grad():
        for p in policy.parameters():
            p.zero_()  # the value of every observation is 0, as the returns are
    result = PPOTrainer(policy, lr=1e-3).step(batch)
    assert "explained_variance" not in result.stats
    assert all(np.isfinite(v) for v in result.stats.values()), result.stats
    varied = PPOTrainer(_policy(), lr=1e-3).step(make_batch(_policy(), OBS, steps=9, segments=8))
    assert np.isfinite(varied.stats["explained_variance"])


def test_minibatches_of_one_transition_are_warned_of_once(make_batch, caplog):
    """Normalised within a minibatch of one, an advantage is 0: ``minibatches=100000`` trained
    for minutes at ``policy_loss=0`` without a word."""
    policy = _policy()
    batch = make_batch(policy, OBS, steps=5, segments=2)  # at most 8 valid transitions
    PPOTrainer(policy, minibatches=2).step(batch)
    assert "minibatches of one" not in caplog.text
    trainer = PPOTrainer(policy, minibatches=64)
    for _ in range(2):
        trainer.step(batch)
    warned = [r.getMessage() for r in caplog.records if "minibatches of one" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("minibatches=64 over a batch of "), warned
    PPOTrainer(policy, minibatches=64, normalize_advantages=False).step(batch)
    assert len([r for r in caplog.records if "minibatches of one" in r.getMessage()]) == 1
