import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from algorithm.actor_critic_policies.policy import ActorCriticOutput, ActorCriticPolicy
from algorithm.modules.distributions import Categorical
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


def test_minibatches_cover_valid_transitions_once_per_epoch(make_batch):
    policy = _policy()
    trainer = PPOTrainer(policy, minibatches=3)
    batch = make_batch(policy, OBS, steps=9, segments=4, seed=2)
    from algorithm.modules.gae import gae_advantages

    t = lambda x: torch.as_tensor(x)  # noqa: E731
    _, _, mask = gae_advantages(
        t(batch.reward), t(batch.policy_output.value), t(batch.done), t(batch.truncated), 0.99, 0.95
    )
    chunks = trainer._minibatch_indices(mask)
    seen = sorted((int(a), int(b)) for ti, bi in chunks for a, b in zip(ti[0], bi[0]))
    assert len(chunks) == 3
    assert seen == sorted(map(tuple, mask[..., 0].nonzero().tolist()))


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


def test_data_parallel_setup_in_a_single_process_group(make_batch, tmp_path):
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        policy = _policy()
        policy.distributed_setup()
        assert isinstance(policy.net, nn.parallel.DistributedDataParallel)
        assert policy.module is policy.net.module
        assert PPOTrainer(policy).step(make_batch(policy, OBS, 5, 4)).step == 1
    finally:
        dist.destroy_process_group()


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
    mask = torch.ones(9, 5, 1)
    chunks = trainer._minibatch_indices(mask)
    assert all(time_index == slice(None) for time_index, _ in chunks)
    assert sorted(int(b) for _, segments in chunks for b in segments) == list(range(5))
