"""The SAC policy (tanh-squashed Gaussian, twin critics) and trainer, on transitions from real
Pendulum episodes replayed through ``system.replay``."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from replay_loop import SegmentCollector

from algorithm.sac.policy import SACPolicy
from algorithm.sac.trainer import SACAnalyzedResult, SACTrainer
from api.policy import RolloutRequest
from system.replay.buffer import ReplayBuffer, ReplayConfig
from system.replay.rate_limiter import RateLimiterConfig

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 10.0], np.float32))


def _policy(**kwargs):
    kwargs.setdefault("seed", 0)
    kwargs.setdefault("hidden_sizes", (32, 32))
    return SACPolicy(OBS, ACT, **kwargs)


def _request(n, evaluation=False, seed=0):
    obs = np.random.default_rng(seed).uniform(-1, 1, size=(n, 3)).astype(np.float32)
    return RolloutRequest(obs=obs, is_evaluation=np.full((n, 1), evaluation))


def _pendulum_transitions(policy, frames=1200, batch=256):
    buffer = ReplayBuffer(
        ReplayConfig(capacity_frames=10_000, seed=0, rate_limit=RateLimiterConfig(min_size=1))
    )
    collector = SegmentCollector("Pendulum-v1", policy, envs=2, segment_length=32)
    while collector.frames < frames:
        buffer.insert(collector.segment())
    return buffer


def test_actions_stay_inside_the_box_and_evaluation_uses_the_mean():
    policy = _policy()
    with torch.no_grad():  # push the mean far out: tanh must still keep actions in bounds
        policy.module.mean.bias.fill_(50.0)
    action = policy.rollout(_request(500)).action
    assert action.shape == (500, 2) and action.dtype == np.float32
    assert np.all(action >= ACT.low) and np.all(action <= ACT.high)
    fresh = _policy()
    request = _request(8, evaluation=True)
    with torch.no_grad():
        mean = torch.tanh(fresh.module(torch.as_tensor(request.obs))[0])
    expected = fresh.to_env(mean).numpy()
    np.testing.assert_allclose(fresh.rollout(request).action, expected, rtol=1e-6)
    np.testing.assert_allclose(fresh.rollout(request).action, expected, rtol=1e-6)


def test_log_prob_is_a_density_on_the_box():
    # p integrates to 1 over the Box (in its own units): E[p(a)] * volume = 1 for uniform a.
    policy = _policy()
    with torch.no_grad():
        policy.module.log_std.bias.fill_(0.46)  # std about 1: mass spread over the whole Box
        rng = np.random.default_rng(0)
        action = torch.as_tensor(
            rng.uniform(ACT.low, ACT.high, size=(50_000, 2)), dtype=torch.float32
        )
        obs = torch.as_tensor(_request(1).obs).repeat(len(action), 1)
        density = policy.log_prob_of(obs, action).double().exp()
        assert float(density.mean()) * 40.0 == pytest.approx(1.0, abs=0.05)
        # and sample() reports the density of the action it returns
        sampled, log_prob = policy.sample(obs[:100], torch.Generator().manual_seed(0))
        again = policy.log_prob_of(obs[:100], policy.to_env(sampled))
    torch.testing.assert_close(log_prob, again, rtol=1e-4, atol=1e-4)


def test_log_prob_matches_torchs_transformed_distribution():
    policy = _policy()
    obs = torch.as_tensor(_request(64).obs)
    with torch.no_grad():
        action, log_prob = policy.sample(obs, torch.Generator().manual_seed(1))
        mean, log_std = policy.module(obs)
    d = torch.distributions
    squashed = d.TransformedDistribution(
        d.Normal(mean, log_std.exp()),
        [d.TanhTransform(cache_size=1), d.AffineTransform(policy._center, policy._scale)],
    )
    expected = squashed.log_prob(policy.to_env(action).clamp(-1.999999, 9.99999)).sum(-1)
    np.testing.assert_allclose(log_prob[:, 0].numpy(), expected.numpy(), rtol=1e-3, atol=1e-3)


def test_warmup_acts_uniformly_then_the_actor_takes_over():
    policy = _policy(warmup_frames=1000)
    with torch.no_grad():
        policy.module.log_std.bias.fill_(-20.0)  # a near-deterministic actor
    warm = policy.rollout(_request(1000)).action
    assert warm[:, 1].std() > 2.0  # uniform over [0, 10]: std 2.9
    assert policy.explore_frames == 1000
    assert policy.rollout(_request(1000)).action[:, 1].std() < 2.0
    other = _policy(seed=3)
    other.load_checkpoint(policy.get_checkpoint())
    assert other.explore_frames == 2000


def test_warmup_actions_are_held_per_client_for_warmup_hold_steps():
    policy = _policy(warmup_frames=1000, warmup_hold=4)
    clients = np.array([[7], [8]])
    steps = []
    for step in range(8):
        request = _request(2, seed=step)
        request.client_id = clients
        steps.append(policy.rollout(request).action)
    actions = np.stack(steps)  # [step, client, dim]
    for client in (0, 1):  # the same action for 4 steps, then a new one for the next 4
        assert (actions[:4, client] == actions[0, client]).all()
        assert (actions[4:, client] == actions[4, client]).all()
        assert (actions[0, client] != actions[4, client]).all()
    assert (actions[0, 0] != actions[0, 1]).all()  # each client its own


def test_analyze_routes_each_gradient_to_its_own_parameters():
    pendulum = _pendulum_policy()
    out = pendulum.analyze(_pendulum_transitions(pendulum, frames=100).sample(16))
    assert isinstance(out, SACAnalyzedResult)
    actor, critics = list(pendulum.actor_parameters()), list(pendulum.critic_parameters())
    actor_grads = torch.autograd.grad(out.q_new.sum(), actor + critics, allow_unused=True)
    assert all(g is None for g in actor_grads[len(actor) :])  # q_new does not move the critics
    assert any(g is not None and g.abs().sum() > 0 for g in actor_grads[: len(actor)])
    critic_grads = torch.autograd.grad(out.q1.sum(), actor + critics, allow_unused=True)
    assert all(g is None for g in critic_grads[: len(actor)])
    assert not out.next_q_target.requires_grad and not out.next_log_prob.requires_grad


def _pendulum_policy(**kwargs):
    env = gym.make("Pendulum-v1")
    kwargs.setdefault("hidden_sizes", (64, 64))
    return SACPolicy(env.observation_space, env.action_space, seed=0, **kwargs)


def test_trainer_fits_the_soft_target_and_tunes_the_temperature():
    policy = _pendulum_policy(warmup_frames=10**6)
    buffer = _pendulum_transitions(policy)
    trainer = SACTrainer(policy, tau=1.0)  # targets equal the critics after each step
    assert trainer.target_entropy == pytest.approx(-1.0 + math.log(2.0))  # -1 on [-1, 1]
    first = trainer.step(buffer.sample(128)).stats
    for a, b in zip(
        policy.critic_parameters(),
        [*policy.module.q1_target.parameters(), *policy.module.q2_target.parameters()],
    ):
        torch.testing.assert_close(a, b)
    trainer.tau = 0.005
    for _ in range(150):
        last = trainer.step(buffer.sample(128)).stats
    assert policy.version == 151
    # Pendulum rewards are -16..0 a step: values fall well below zero, and the critics keep up
    assert last["q_mean"] < first["q_mean"] - 5.0
    assert last["critic_loss"] < 0.2 * abs(last["q_mean"]) ** 2
    # entropy above the target: the temperature falls
    assert first["entropy"] > trainer.target_entropy and last["alpha"] < first["alpha"]
    assert trainer.priorities.shape == (128,)


def test_a_fixed_temperature_stays_and_a_bad_policy_is_refused():
    policy = _pendulum_policy()
    trainer = SACTrainer(policy, learn_alpha=False, initial_alpha=0.2)
    buffer = _pendulum_transitions(policy, frames=300)
    for _ in range(3):
        stats = trainer.step(buffer.sample(32)).stats
    assert stats["alpha"] == pytest.approx(0.2) and trainer.alpha == pytest.approx(0.2)
    checkpoint = trainer.get_checkpoint()
    other = SACTrainer(_pendulum_policy())
    other.load_checkpoint(checkpoint)
    assert other.alpha == pytest.approx(0.2) and other._steps == 3
    with pytest.raises(TypeError, match=r"actor_parameters\(\)"):
        SACTrainer(object())
    with pytest.raises(TypeError, match="Box action space"):
        SACPolicy(OBS, gym.spaces.Discrete(3))
    with pytest.raises(ValueError, match="must be finite"):
        SACPolicy(OBS, gym.spaces.Box(-math.inf, math.inf, (2,)))


def test_a_dict_observation_is_read_key_by_key_as_its_flat_box_would_be():
    """sac-policy took a Box observation alone: a goal-conditioned task's Dict (position, goal,
    a mode) was refused, though DQN and PPO read it. Its keys, side by side in key order (a
    Discrete one-hot), give the networks and the answers of the equivalent flat Box."""
    from api.namedarray import NamedArray
    from api.replay import TransitionBatch

    box = gym.spaces.Box(-1, 1, (2,), np.float32)
    nested = gym.spaces.Dict({"goal": box, "mode": gym.spaces.Discrete(3), "pos": box})
    flat = gym.spaces.Box(-1, 1, (7,), np.float32)
    action = gym.spaces.Box(-2, 2, (2,), np.float32)
    by_dict = SACPolicy(nested, action, hidden_sizes=(16, 16), seed=3)
    by_box = SACPolicy(flat, action, hidden_sizes=(16, 16), seed=3)
    rng = np.random.default_rng(0)
    rows = 8

    def both():
        goal, pos = (rng.uniform(-1, 1, (rows, 2)).astype(np.float32) for _ in range(2))
        mode = rng.integers(3, size=(rows, 1))
        one_hot = np.eye(3, dtype=np.float32)[mode[:, 0]]
        return NamedArray(goal=goal, mode=mode, pos=pos), np.concatenate([goal, one_hot, pos], 1)

    obs, flat_obs = both()
    evaluation = np.ones((rows, 1), bool)
    greedy = by_dict.rollout(RolloutRequest(obs=obs, is_evaluation=evaluation)).action
    expected = by_box.rollout(RolloutRequest(obs=flat_obs, is_evaluation=evaluation)).action
    np.testing.assert_allclose(greedy, expected, rtol=1e-6)
    next_obs, next_flat = both()
    taken = rng.uniform(-2, 2, (rows, 2)).astype(np.float32)
    common = dict(action=taken, reward=np.ones((rows, 1), np.float32),
                  discount=np.full((rows, 1), 0.99, np.float32))  # fmt: skip
    torch.manual_seed(5)
    out = by_dict.analyze(TransitionBatch(obs=obs, next_obs=next_obs, **common))
    torch.manual_seed(5)
    reference = by_box.analyze(TransitionBatch(obs=flat_obs, next_obs=next_flat, **common))
    torch.testing.assert_close(out.q1, reference.q1)
    torch.testing.assert_close(out.next_q_target, reference.next_q_target)


def test_the_target_entropy_of_a_narrow_box_is_one_it_can_reach():
    """The default target was ``-action_dim`` in the Box's units: on ``[-0.1, 0.1]^2`` no
    distribution reaches -2 (the uniform's entropy is ``2 log 0.2``, -3.2), so the temperature
    rose without end and the policy stayed random (a reach task learned nothing in 20k frames).
    It is ``-action_dim`` on ``[-1, 1]``, as other SAC implementations set it."""
    observation = gym.spaces.Box(-1, 1, (4,), np.float32)
    narrow = SACPolicy(observation, gym.spaces.Box(-0.1, 0.1, (2,), np.float32), seed=0)
    trainer = SACTrainer(narrow)
    assert trainer.target_entropy == pytest.approx(-2.0 + 2 * math.log(0.1))
    assert trainer.target_entropy < 2 * math.log(0.2)  # below the most a policy can have
    assert SACTrainer(narrow, target_entropy=-5.0).target_entropy == -5.0
