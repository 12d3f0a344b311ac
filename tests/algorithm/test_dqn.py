"""The Q-network policy and the DQN trainer, on transitions from real CartPole episodes replayed
through ``system.replay``."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from replay_loop import SegmentCollector, greedy_returns, train_off_policy

from algorithm.dqn.trainer import DQNAnalyzedResult, DQNTrainer
from algorithm.q_policies.policy import EpsilonSchedule, QPolicy
from api.namedarray import NamedArray
from api.policy import RolloutRequest
from api.replay import TransitionBatch
from system.replay.buffer import ReplayBuffer, ReplayConfig
from system.replay.rate_limiter import RateLimiterConfig

ENV = gym.make("CartPole-v1")


def _policy(**kwargs):
    kwargs.setdefault("seed", 0)
    kwargs.setdefault("hidden_sizes", (32, 32))
    return QPolicy(ENV.observation_space, ENV.action_space, **kwargs)


def _request(n, evaluation=False):
    obs = np.random.default_rng(0).normal(size=(n, 4)).astype(np.float32)
    return RolloutRequest(obs=obs, is_evaluation=np.full((n, 1), evaluation))


def _filled_buffer(policy, frames=2000, n_step=1, prioritized=False, seed=0):
    buffer = ReplayBuffer(
        ReplayConfig(
            capacity_frames=10_000,
            n_step=n_step,
            gamma=0.99,
            prioritized=prioritized,
            seed=seed,
            rate_limit=RateLimiterConfig(min_size=1),
        )
    )
    collector = SegmentCollector("CartPole-v1", policy, envs=4, segment_length=16, seed=seed)
    while collector.frames < frames:
        buffer.insert(collector.segment())
    return buffer


def test_epsilon_schedule_decays_linearly_and_checks_its_fields():
    schedule = EpsilonSchedule(start=1.0, end=0.1, decay_frames=100)
    assert [schedule.value(f) for f in (0, 50, 100, 500)] == pytest.approx([1.0, 0.55, 0.1, 0.1])
    with pytest.raises(ValueError, match=r"epsilon\.end must be in \[0, 1\]"):
        EpsilonSchedule(end=1.5)
    with pytest.raises(ValueError, match="start, end, decay_frames"):
        _policy(epsilon=dict(begin=1.0))
    with pytest.raises(TypeError, match="Discrete action space"):
        QPolicy(ENV.observation_space, gym.spaces.Box(-1, 1, (2,)))


def test_exploration_follows_the_schedule_and_evaluation_is_greedy():
    policy = _policy(epsilon=dict(start=1.0, end=0.0, decay_frames=1000))
    request = _request(2000)
    with torch.no_grad():
        greedy = policy.module.online(torch.as_tensor(request.obs)).argmax(-1).numpy()
    random = policy.rollout(request).action  # epsilon 1: uniformly random
    assert 0.4 < np.mean(random == greedy) < 0.6
    assert policy.explore_frames == 2000 and policy.current_epsilon == 0.0
    assert np.array_equal(policy.rollout(request).action, greedy)  # epsilon 0 now
    fresh = _policy(epsilon=dict(start=1.0, end=1.0, decay_frames=1))
    assert np.array_equal(fresh.rollout(_request(2000, evaluation=True)).action, greedy)
    assert fresh.explore_frames == 0  # evaluation rows are not counted


def test_held_exploration_repeats_each_clients_random_action_for_explore_hold_steps():
    policy = _policy(epsilon=dict(start=1.0, end=1.0, decay_frames=1), explore_hold=5)
    clients = np.arange(64)[:, None]  # as actors send them: [rows, 1]
    request = _request(64)
    request.client_id = clients
    steps = []
    for _ in range(10):
        steps.append(policy.rollout(request).action)
    steps = np.stack(steps)  # [step, client]
    # every client holds one action over steps 0-4 and another (drawn afresh) over 5-9
    assert (steps[:5] == steps[0]).all() and (steps[5:] == steps[5]).all()
    assert 0.4 < np.mean(steps[0] == steps[5]) < 0.9  # a new draw, not the old action
    assert policy.explore_frames == 640
    # the clients are told apart: a client's hold does not leak to another
    assert len(set(steps[0].tolist())) == 2
    # evaluation rows stay greedy and neither use nor move a hold
    evaluation = _request(64, evaluation=True)
    evaluation.client_id = clients
    with torch.no_grad():
        greedy = policy.module.online(torch.as_tensor(evaluation.obs)).argmax(-1).numpy()
    assert np.array_equal(policy.rollout(evaluation).action, greedy)
    # epsilon 0: no hold is started, so play is greedy
    still = _policy(epsilon=dict(start=0.0, end=0.0, decay_frames=1), explore_hold=5)
    with torch.no_grad():
        own = still.module.online(torch.as_tensor(request.obs)).argmax(-1).numpy()
    assert np.array_equal(still.rollout(request).action, own)
    with pytest.raises(ValueError, match="explore_hold must be 1 or more"):
        _policy(explore_hold=0)


def test_dueling_head_centres_advantages():
    policy = _policy(dueling=True)
    net = policy.module.online
    obs = torch.as_tensor(_request(5).obs)
    features = net.encoder(obs)
    q = net(obs)
    torch.testing.assert_close(q.mean(-1, keepdim=True), net.value(features))


def test_checkpoints_carry_the_target_network_and_exploration_count():
    policy = _policy()
    policy.rollout(_request(30))
    other = _policy(seed=1)
    other.load_checkpoint(policy.get_checkpoint())
    assert other.explore_frames == 30
    for a, b in zip(policy.module.target.parameters(), other.module.target.parameters()):
        torch.testing.assert_close(a, b)
    policy.observe_frames(10)  # never backwards
    assert policy.explore_frames == 30


def test_double_dqn_target_from_n_step_transitions():
    policy = _policy()
    buffer = _filled_buffer(policy, n_step=3)
    trainer = DQNTrainer(policy, lr=0.0, target_update_every=10**6)
    with torch.no_grad():  # make the target network differ from the online one
        for p in policy.module.target.parameters():
            p.add_(0.1 * torch.randn_like(p))
    batch = buffer.sample(64)
    t = batch.apply(torch.as_tensor)
    with torch.no_grad():
        online, target = policy.module.online, policy.module.target
        best = online(t.next_obs).argmax(-1, keepdim=True)
        y = t.reward + t.discount * target(t.next_obs).gather(-1, best)
        q = online(t.obs).gather(-1, t.action[:, None])
    policy._version = 5  # the transitions were collected by version 0
    stats = trainer.step(batch).stats
    np.testing.assert_allclose(trainer.priorities, (q - y).abs()[:, 0].numpy(), rtol=1e-5)
    assert stats["target_mean"] == pytest.approx(float(y.mean()), rel=1e-5)
    # replayed samples are old by design: their age is the trainer worker's stat, not a lag
    assert policy.version == 6 and "policy_lag_max" not in stats
    assert set(trainer.required_fields()) == {"q", "action", "next_q_online", "next_q_target"}
    assert isinstance(policy.analyze(batch), DQNAnalyzedResult)


def test_target_network_updates_by_copy_or_polyak():
    policy = _policy()
    batch = _filled_buffer(policy, frames=300).sample(32)
    copy = DQNTrainer(policy, lr=1e-2, target_update_every=2, tau=1.0)
    copy.step(batch)
    online = [p.detach().clone() for p in policy.module.online.parameters()]
    target = [p.detach().clone() for p in policy.module.target.parameters()]
    assert not all(torch.equal(a, b) for a, b in zip(online, target))  # not yet
    copy.step(batch)
    for a, b in zip(policy.module.online.parameters(), policy.module.target.parameters()):
        torch.testing.assert_close(a, b)
    polyak = DQNTrainer(policy, lr=1e-2, target_update_every=1, tau=0.25)
    before = [p.detach().clone() for p in policy.module.target.parameters()]
    polyak.step(batch)
    for old, new, o in zip(
        before, policy.module.target.parameters(), policy.module.online.parameters()
    ):
        torch.testing.assert_close(new, 0.75 * old + 0.25 * o)


def test_importance_weights_scale_each_transitions_gradient():
    policy = _policy()
    batch = _filled_buffer(policy, frames=300, prioritized=True).sample(16)
    batch.weight = np.zeros_like(batch.weight)
    before = [p.detach().clone() for p in policy.parameters()]
    DQNTrainer(policy, lr=1e-2).step(batch)
    for a, b in zip(before, policy.parameters()):
        torch.testing.assert_close(a, b)  # all weights zero: no update at all


def test_loss_falls_towards_fixed_targets_and_values_grow_with_updates():
    # Random-policy CartPole data. With the target network held still, DQN is a regression: the
    # loss must fall. With target updates, the value of staying alive (1 a step) must propagate.
    policy = _policy(epsilon=dict(start=1.0, end=1.0, decay_frames=1))
    buffer = _filled_buffer(policy, frames=3000)
    fixed = DQNTrainer(policy, lr=1e-3, target_update_every=10**6)
    losses = [fixed.step(buffer.sample(128)).stats["loss"] for _ in range(300)]
    assert np.mean(losses[-20:]) < 0.2 * np.mean(losses[:20])
    moving = DQNTrainer(policy, lr=1e-3, target_update_every=50)
    stats = [moving.step(buffer.sample(128)).stats for _ in range(300)]
    assert stats[-1]["q_mean"] > stats[0]["q_mean"] + 3.0
    assert all(np.isfinite(s["loss"]) for s in stats)


def test_dqn_improves_cartpole_in_an_in_process_replay_loop():
    policy = _policy(hidden_sizes=(64, 64), dueling=True, epsilon=dict(decay_frames=4000))
    before = np.mean(greedy_returns("CartPole-v1", policy, 5))
    buffer = ReplayBuffer(
        ReplayConfig(
            capacity_frames=20_000,
            n_step=3,
            prioritized=True,
            seed=0,
            rate_limit=RateLimiterConfig(min_size=1000),
        )
    )
    collector = SegmentCollector("CartPole-v1", policy, envs=4, segment_length=8)
    trainer = DQNTrainer(policy, lr=1e-3, target_update_every=100)
    train_off_policy(collector, buffer, trainer, 6000, updates_per_segment=8, batch=64)
    after = np.mean(greedy_returns("CartPole-v1", policy, 5))
    print(f"DQN CartPole greedy return {before:.1f} -> {after:.1f} after 6000 frames")
    assert before < 30 and after >= 100


def test_registered_names_build_and_segments_are_refused_with_a_clear_error(make_batch):
    from api import policy as policy_api
    from api import trainer as trainer_api
    from api.errors import ConfigError

    policy = policy_api.make(
        "q-network",
        observation_space=ENV.observation_space,
        action_space=ENV.action_space,
        epsilon=dict(start=0.5, end=0.1, decay_frames=100),
    )
    trainer = trainer_api.make("dqn", policy, target_update_every=10)
    assert isinstance(trainer, DQNTrainer) and policy.current_epsilon == 0.5
    segments = make_batch(policy, ENV.observation_space, steps=5, segments=2)
    with pytest.raises(ConfigError, match="put a replay buffer between actors and trainer"):
        trainer.step(segments)


@pytest.mark.parametrize("space", ["box", "dict"])
def test_one_online_pass_over_obs_and_next_obs_matches_two(space):
    """analyze runs the online network once over obs and next_obs together: the Q-values and
    the gradient must be those of two separate passes (Dict observations included)."""
    rng = np.random.default_rng(0)
    if space == "box":
        obs_space = ENV.observation_space
        obs, next_obs = (rng.normal(size=(8, 4)).astype(np.float32) for _ in range(2))
    else:
        obs_space = gym.spaces.Dict(
            {"a": gym.spaces.Box(-1, 1, (3,)), "b": gym.spaces.Box(-1, 1, (2,))}
        )
        obs, next_obs = (
            NamedArray(
                **{k: rng.normal(size=(8, n)).astype(np.float32) for k, n in [("a", 3), ("b", 2)]}
            )
            for _ in range(2)
        )
    policy = QPolicy(obs_space, ENV.action_space, hidden_sizes=(16,), seed=0)
    batch = TransitionBatch(
        obs=obs,
        action=rng.integers(0, 2, size=(8, 1)),
        reward=np.ones((8, 1), np.float32),
        discount=np.full((8, 1), 0.99, np.float32),
        next_obs=next_obs,
    )
    out = policy.analyze(batch)
    out.q.sum().backward()
    one_pass = [p.grad.clone() for p in policy.parameters()]
    for p in policy.parameters():
        p.grad = None
    online = policy.module.online
    q = online(policy.to_tensor(obs))
    q.sum().backward()
    torch.testing.assert_close(out.q, q)
    torch.testing.assert_close(out.next_q_online, online(policy.to_tensor(next_obs)).detach())
    assert not out.next_q_online.requires_grad
    for a, p in zip(one_pass, policy.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad)


MASKED = gym.spaces.Dict(
    {"observation": gym.spaces.Box(-1, 1, (4,)), "action_mask": gym.spaces.MultiBinary(5)}
)


def _masked_obs(rows, legal, seed=0):
    """Observations whose mask allows the actions in ``legal`` (the first row allows none)."""
    mask = np.zeros((rows, 5), np.int8)
    mask[:, legal] = 1
    mask[0] = 0
    features = np.random.default_rng(seed).uniform(-1, 1, (rows, 4)).astype(np.float32)
    return NamedArray(observation=features, action_mask=mask)


@pytest.mark.parametrize("evaluation", [False, True])
def test_an_action_mask_restricts_greedy_and_exploratory_actions(evaluation):
    """The Q policy ignored ``action_mask``: on TicTacToe-v3 DQN played illegal moves (a
    PettingZoo board game ends on one), greedy or exploring."""
    explore = {"start": 1.0, "end": 1.0, "decay_frames": 1}
    for hold in (1, 3):
        policy = QPolicy(MASKED, gym.spaces.Discrete(5), seed=0, epsilon=explore, explore_hold=hold)
        for step in range(3):
            obs = _masked_obs(500, [1, 3] if step < 2 else [0, 4], seed=step)
            request = RolloutRequest(
                obs=obs,
                is_evaluation=np.full((500, 1), evaluation),
                client_id=np.arange(500),
            )
            chosen = policy.rollout(request).action
            assert set(chosen[1:].tolist()) <= ({1, 3} if step < 2 else {0, 4})
            if not evaluation and step == 0:  # uniform over the legal ones
                assert min(np.bincount(chosen[1:], minlength=5)[[1, 3]]) > 200


def test_the_bootstrap_maximises_over_the_next_states_legal_actions():
    policy = QPolicy(MASKED, gym.spaces.Discrete(5), seed=0, hidden_sizes=(16,))
    rows = 64
    batch = TransitionBatch(
        obs=_masked_obs(rows, [0, 1, 2, 3, 4], seed=1),
        action=np.zeros(rows, np.int64),
        reward=np.zeros((rows, 1), np.float32),
        discount=np.full((rows, 1), 0.9, np.float32),
        next_obs=_masked_obs(rows, [2], seed=2),
    )
    out = policy.analyze(batch.apply(torch.as_tensor))
    assert out.next_q_online[1:].argmax(-1).eq(2).all()
    assert out.next_q_target[1:].argmax(-1).eq(2).all()
    unmasked = policy.module.target(batch.apply(torch.as_tensor).next_obs)
    torch.testing.assert_close(out.next_q_target[0], unmasked[0])  # none legal: all of them
    trainer = DQNTrainer(policy, lr=0.0)
    stats = trainer.step(batch).stats
    expected = 0.9 * float(unmasked[1:, 2].mean() * (rows - 1) + unmasked[0].max()) / rows
    assert stats["target_mean"] == pytest.approx(expected, rel=1e-4)
