import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

from algorithm.actor_critic_policies.policy import ActorCriticPolicy
from algorithm.ppo.trainer import PPOTrainer
from api.namedarray import NamedArray
from api.policy import RolloutRequest
from api.spaces import HybridBox

BOX_OBS = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
DICT_OBS = gym.spaces.Dict(
    {
        "position": gym.spaces.Box(0.0, 1.0, shape=(3,), dtype=np.float32),
        "action_mask": gym.spaces.MultiBinary(5),
    }
)


def _request(obs, policy, evaluation=False, on_reset=True, state=None):
    batch = len(obs)
    return RolloutRequest(
        obs=obs,
        policy_state=state,
        is_evaluation=np.full((batch, 1), evaluation),
        on_reset=np.full((batch, 1), on_reset),
    )


def _param_ids(*modules):
    return {id(p) for m in modules if m is not None for p in m.parameters()}


def test_separate_backbone_shares_no_parameter():
    policy = ActorCriticPolicy(observation_space=BOX_OBS, action_space=gym.spaces.Discrete(3))
    net = policy.module
    actor = _param_ids(net.actor_body, net.policy_head)
    critic = _param_ids(net.critic_body, net.value_head)
    assert actor and critic and not actor & critic
    assert actor | critic == {id(p) for p in net.parameters()}
    # and through the gradients: the value does not depend on any actor parameter
    _, value, _ = net(torch.randn(1, 8, 4), None, torch.zeros(1, 8, 1, dtype=torch.bool))
    value.sum().backward()
    assert all(p.grad is None for p in net.actor_body.parameters())


def test_shared_backbone_feeds_both_heads():
    policy = ActorCriticPolicy(
        observation_space=BOX_OBS, action_space=gym.spaces.Discrete(3), shared_backbone=True
    )
    assert policy.module.critic_body is None
    _, value, _ = policy.module(torch.randn(1, 8, 4), None, torch.zeros(1, 8, 1, dtype=torch.bool))
    value.sum().backward()
    assert all(p.grad is not None for p in policy.module.actor_body.parameters())


@pytest.mark.parametrize(
    ("action_space", "shape", "dtype"),
    [
        (gym.spaces.Discrete(3), (6,), np.int64),
        (gym.spaces.Discrete(3, start=-1), (6,), np.int64),
        (gym.spaces.MultiDiscrete([2, 3]), (6, 2), np.int64),
        (gym.spaces.MultiBinary(3), (6, 3), np.int64),  # two-way choices: Bernoullis
        (gym.spaces.MultiBinary([2, 2]), (6, 2, 2), np.int64),
        (gym.spaces.Box(-2.0, 2.0, shape=(2,), dtype=np.float32), (6, 2), np.float32),
        (HybridBox([3, 2], [-1.0], [1.0]), (6, 3), np.float32),  # 2 choices, then 1 value
    ],
)
def test_rollout_shapes_follow_the_action_space(action_space, shape, dtype):
    policy = ActorCriticPolicy(observation_space=BOX_OBS, action_space=action_space, seed=0)
    result = policy.rollout(_request(np.zeros((6, 4), np.float32), policy))
    assert result.action.shape == shape and result.action.dtype == dtype
    assert result.policy_output.log_prob.shape == (6, 1)
    assert result.policy_output.value.shape == (6, 1)
    assert result.policy_state is None
    if not isinstance(action_space, gym.spaces.Box):
        assert all(action_space.contains(a) for a in result.action)


def test_evaluation_rows_act_deterministically():
    policy = ActorCriticPolicy(
        observation_space=BOX_OBS, action_space=gym.spaces.Discrete(4), seed=1
    )
    obs = np.tile(np.array([[0.3, -0.2, 0.5, 0.1]], np.float32), (64, 1))
    greedy = policy.rollout(_request(obs, policy, evaluation=True)).action
    assert len(set(greedy.tolist())) == 1
    with torch.no_grad():
        logits, _, _ = policy.module(torch.as_tensor(obs[:1])[None], None, torch.zeros(1, 1, 1))
    assert greedy[0] == int(logits.argmax())


def test_a_hybrid_action_draws_each_choice_and_the_values_and_plays_their_modes():
    """Discrete choices then continuous values (a HybridBox): the choices are whole indices
    within their counts, and greedy rows play the most likely choice and the mean."""
    space = HybridBox([3, 2], [-1.0], [1.0])
    policy = ActorCriticPolicy(observation_space=BOX_OBS, action_space=space, seed=0)
    obs = np.random.default_rng(0).uniform(-1, 1, (64, 4)).astype(np.float32)
    drawn = policy.rollout(_request(obs, policy)).action
    assert np.array_equal(drawn[:, :2], np.rint(drawn[:, :2]))
    assert set(drawn[:, 0].tolist()) == {0.0, 1.0, 2.0} and set(drawn[:, 1].tolist()) == {0.0, 1.0}
    greedy = [policy.rollout(_request(obs, policy, evaluation=True)).action for _ in range(2)]
    assert np.array_equal(*greedy)
    with torch.no_grad():
        params, _, _ = policy.module(torch.as_tensor(obs)[None], None, torch.zeros(1, 64, 1))
    params = params[0].numpy()
    assert np.array_equal(greedy[0][:, 0], params[:, :3].argmax(-1))
    assert np.array_equal(greedy[0][:, 1], params[:, 3:5].argmax(-1))
    assert np.allclose(greedy[0][:, 2], params[:, 5])


def test_gaussian_evaluation_returns_the_mean():
    space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
    policy = ActorCriticPolicy(observation_space=BOX_OBS, action_space=space)
    obs = np.zeros((3, 4), np.float32)
    a, b = (policy.rollout(_request(obs, policy, evaluation=True)).action for _ in range(2))
    assert np.array_equal(a, b)


def test_masks_never_choose_illegal_actions():
    policy = ActorCriticPolicy(
        observation_space=DICT_OBS, action_space=gym.spaces.Discrete(5), seed=0
    )
    mask = np.zeros((256, 5), np.int8)
    mask[:, [1, 3]] = 1
    obs = NamedArray(position=np.random.rand(256, 3).astype(np.float32), action_mask=mask)
    sampled = policy.rollout(_request(obs, policy)).action
    greedy = policy.rollout(_request(obs, policy, evaluation=True)).action
    assert set(sampled.tolist()) <= {1, 3} and set(greedy.tolist()) <= {1, 3}


def test_image_observations_go_through_the_cnn(make_batch):
    space = gym.spaces.Box(0, 255, shape=(10, 10, 3), dtype=np.uint8)
    policy = ActorCriticPolicy(observation_space=space, action_space=gym.spaces.Discrete(2))
    batch = make_batch(policy, space, steps=4, segments=2)
    out = policy.analyze(batch)
    assert out.value.shape == (4, 2, 1)


def _gru_policy(**kwargs):
    return ActorCriticPolicy(
        observation_space=BOX_OBS,
        action_space=gym.spaces.Discrete(3),
        rnn_hidden=8,
        seed=0,
        **kwargs,
    )


@pytest.mark.parametrize("shared", [False, True])
def test_gru_state_shape_and_reset(shared):
    policy = _gru_policy(shared_backbone=shared)
    default = policy.default_policy_state
    assert default.hx.shape == (1, 1 if shared else 2, 8)
    obs = np.random.rand(2, 4).astype(np.float32)
    state = policy.rollout(_request(obs, policy)).policy_state
    assert state.hx.shape == (2, 1 if shared else 2, 8) and np.abs(state.hx).sum() > 0
    state = NamedArray(hx=np.random.rand(2, *default.hx.shape[1:]).astype(np.float32) + 1.0)
    fresh = policy.rollout(_request(obs, policy, evaluation=True, on_reset=True)).policy_state
    reset = policy.rollout(_request(obs, policy, evaluation=True, on_reset=True, state=state))
    kept = policy.rollout(_request(obs, policy, evaluation=True, on_reset=False, state=state))
    assert np.allclose(reset.policy_state.hx, fresh.hx)
    assert not np.allclose(kept.policy_state.hx, fresh.hx)


def test_recurrent_analyze_reproduces_the_rollout(make_batch):
    policy = _gru_policy()
    batch = make_batch(policy, BOX_OBS, steps=12, segments=3, seed=4)
    assert batch.on_reset[1:].any()  # episodes restart inside the segments
    out = policy.analyze(batch)
    assert torch.allclose(out.new_log_prob, out.old_log_prob, atol=1e-5)
    assert torch.allclose(out.value, out.old_value, atol=1e-5)


@pytest.mark.parametrize("rnn_hidden", [0, 8])
def test_analyze_returns_exactly_the_declared_fields(make_batch, rnn_hidden):
    policy = ActorCriticPolicy(
        observation_space=DICT_OBS, action_space=gym.spaces.Discrete(5), rnn_hidden=rnn_hidden
    )
    batch = make_batch(policy, DICT_OBS, steps=5, segments=4)
    out = policy.analyze(batch, target=PPOTrainer.analyze_target)
    assert isinstance(out, PPOTrainer.AnalyzedResult)
    assert [f.name for f in dataclasses.fields(out)] == PPOTrainer.required_fields()
    for name in PPOTrainer.required_fields():
        assert getattr(out, name).shape == (5, 4, 1), name
    assert torch.allclose(out.new_log_prob, out.old_log_prob, atol=1e-5)
    assert out.new_log_prob.requires_grad and out.value.requires_grad
    with pytest.raises(ValueError, match="targets 'ppo' and 'impala'"):
        policy.analyze(batch, target="dqn")


def test_checkpoint_round_trip_and_version():
    a = ActorCriticPolicy(observation_space=BOX_OBS, action_space=gym.spaces.Discrete(2), seed=0)
    b = ActorCriticPolicy(observation_space=BOX_OBS, action_space=gym.spaces.Discrete(2), seed=1)
    a.inc_version()
    a.inc_version()
    checkpoint = a.get_checkpoint()
    assert checkpoint["version"] == 2 and set(checkpoint) == {"version", "model"}
    b.load_checkpoint(checkpoint)
    assert b.version == 2
    for pa, pb in zip(a.module.parameters(), b.module.parameters()):
        assert torch.equal(pa, pb)
    assert a.parameter_count == sum(p.numel() for p in a.module.parameters())


def test_seed_makes_initialisation_reproducible():
    make = lambda: ActorCriticPolicy(  # noqa: E731
        observation_space=BOX_OBS, action_space=gym.spaces.Discrete(2), seed=3
    )
    for pa, pb in zip(make().module.parameters(), make().module.parameters()):
        assert torch.equal(pa, pb)


@pytest.mark.parametrize(
    "action_space",
    [
        gym.spaces.Discrete(3, start=-1),
        gym.spaces.MultiDiscrete([2, 3]),
        gym.spaces.MultiBinary(3),
        gym.spaces.MultiBinary([2, 2]),
        gym.spaces.MultiDiscrete([[2, 3], [3, 2]], start=[[1, 0], [0, -1]]),
        gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
        HybridBox([3, 2], [-1.0, 0.0], [1.0, 5.0]),
    ],
)
def test_analyze_agrees_with_rollout_for_every_action_space(make_batch, action_space):
    policy = ActorCriticPolicy(observation_space=BOX_OBS, action_space=action_space, seed=0)
    out = policy.analyze(make_batch(policy, BOX_OBS, steps=4, segments=3))
    assert torch.allclose(out.new_log_prob, out.old_log_prob, atol=1e-5)
