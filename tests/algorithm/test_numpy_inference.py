"""The numpy acting path of ActorCriticPolicy gives what the torch path gives."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from algorithm.actor_critic_policies.policy import ActorCriticPolicy
from api.namedarray import NamedArray
from api.policy import RolloutRequest

BOX_OBS = gym.spaces.Box(-1.0, 1.0, shape=(2, 3), dtype=np.float32)
SPACES = {
    "discrete": gym.spaces.Discrete(3, start=-1),
    "multidiscrete": gym.spaces.MultiDiscrete([2, 4], start=[1, 0]),
    "multibinary": gym.spaces.MultiBinary(3),
    "box": gym.spaces.Box(-2.0, 2.0, shape=(2,), dtype=np.float32),
}


def pair(action_space, **kwargs):
    """Two identical policies (same seed), one acting through numpy, one through torch."""
    fast = ActorCriticPolicy(BOX_OBS, action_space, seed=3, **kwargs)
    slow = ActorCriticPolicy(BOX_OBS, action_space, seed=3, numpy_inference=False, **kwargs)
    assert fast._numpy is not None and slow._numpy is None
    return fast, slow


def request(rows: int, greedy: bool = False) -> RolloutRequest:
    obs = np.random.default_rng(0).uniform(-1, 1, (rows, 2, 3)).astype(np.float32)
    return RolloutRequest(
        obs=obs, is_evaluation=np.full((rows, 1), greedy), on_reset=np.ones((rows, 1), bool)
    )


def torch_log_prob(policy: ActorCriticPolicy, req: RolloutRequest, action: np.ndarray):
    """The torch path's log-probability of given environment actions."""
    with torch.no_grad():
        params, _, _ = policy.module(
            torch.as_tensor(req.obs)[None], None, torch.zeros(1, len(req.obs), 1, dtype=bool)
        )
        dist = policy._distribution(params[0], None)
        action = torch.as_tensor(action)
        if policy._action_offset is not None:
            action = action - policy._action_offset
        return dist.log_prob(action).numpy()


@pytest.mark.parametrize("kind", sorted(SPACES))
@pytest.mark.parametrize("shared", [False, True])
def test_numpy_and_torch_paths_agree(kind, shared):
    fast, slow = pair(SPACES[kind], shared_backbone=shared, activation="relu")
    req = request(16)
    got, ref = fast.rollout(req), slow.rollout(req)
    assert got.action.shape == ref.action.shape and got.action.dtype == ref.action.dtype
    assert all(SPACES[kind].contains(a) for a in got.action) or kind == "box"
    np.testing.assert_allclose(got.policy_output.value, ref.policy_output.value, atol=1e-5)
    np.testing.assert_allclose(
        got.policy_output.log_prob, torch_log_prob(slow, req, got.action), atol=1e-5
    )
    greedy = request(16, greedy=True)
    got, ref = fast.rollout(greedy).action, slow.rollout(greedy).action
    if kind == "box":  # the mean, up to float rounding
        np.testing.assert_allclose(got, ref, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, ref)


def test_samples_follow_the_policy_distribution():
    fast, _ = pair(gym.spaces.Discrete(3))
    req = request(1)
    req.obs = np.repeat(req.obs, 20_000, axis=0)
    req.is_evaluation = np.zeros((20_000, 1), bool)
    out = fast.rollout(req)
    probs = np.exp(out.policy_output.log_prob[:, 0])
    expected = {int(a): p for a, p in zip(out.action, probs)}
    counts = np.bincount(out.action + 1, minlength=3) / len(out.action)
    for action, p in expected.items():
        assert abs(counts[action + 1] - p) < 0.015


def test_new_weights_are_used_at_once():
    fast, slow = pair(gym.spaces.Discrete(3))
    req = request(8, greedy=True)
    before = fast.rollout(req).policy_output.value.copy()
    with torch.no_grad():
        for p in slow.module.parameters():
            p.add_(0.5)
    fast.load_checkpoint(slow.get_checkpoint())
    after = fast.rollout(req).policy_output.value
    assert not np.allclose(before, after)
    np.testing.assert_allclose(after, slow.rollout(req).policy_output.value, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs",
    [dict(rnn_hidden=8), dict(activation="gelu"), dict(numpy_inference=False)],
)
def test_torch_acts_where_numpy_does_not_apply(kwargs):
    policy = ActorCriticPolicy(BOX_OBS, gym.spaces.Discrete(3), **kwargs)
    assert policy._numpy is None
    assert policy.rollout(request(4)).action.shape == (4,)


def test_images_act_through_torch():
    space = gym.spaces.Dict({"x": gym.spaces.Box(0, 255, (3, 16, 16), np.uint8)})
    assert ActorCriticPolicy(space, gym.spaces.Discrete(3))._numpy is None


BOARD = gym.spaces.Box(0, 1, (6, 7, 2), np.int8)
BOARDS = {
    "a board, channels last": gym.spaces.Dict(
        {"observation": BOARD, "action_mask": gym.spaces.Box(0, 1, (7,), np.int8)}
    ),
    "a board, channels first": gym.spaces.Dict(
        {"observation": gym.spaces.Box(0, 1, (2, 6, 7), np.int8),
         "action_mask": gym.spaces.Box(0, 1, (7,), np.int8)}
    ),
    "a board beside a vector and a discrete": gym.spaces.Dict(
        {"board": BOARD, "turn": gym.spaces.Discrete(2, start=1), "v": BOX_OBS,
         "action_mask": gym.spaces.Box(0, 1, (7,), np.int8)}
    ),
}  # fmt: skip


def board_request(space: gym.spaces.Dict, rows: int, greedy: bool) -> RolloutRequest:
    rng = np.random.default_rng(1)
    obs = {k: np.stack([s.sample() for _ in range(rows)]) for k, s in space.spaces.items()}
    obs["action_mask"][0] = 0  # a row with no legal action: every action is legal again
    obs["action_mask"][1] = [0, 0, 0, 1, 0, 0, 0]  # one legal action: always that one
    obs["action_mask"][2:] = rng.integers(0, 2, (rows - 2, 7))
    return RolloutRequest(
        obs=NamedArray(**obs),
        is_evaluation=np.full((rows, 1), greedy),
        on_reset=np.zeros((rows, 1), bool),
    )


NETWORKS = {
    "convolutions": dict(grid_channels=[8, 4]),
    "convolutions, mirrored, shared": dict(
        grid_channels=[8], mirror_actions=[6, 5, 4, 3, 2, 1, 0], shared_backbone=True
    ),
    "mirrored": dict(mirror_actions=[6, 5, 4, 3, 2, 1, 0]),
    "flattened": dict(),
}
CASES = [
    (case, network)
    for case in sorted(BOARDS)
    for network in sorted(NETWORKS)
    # a vector key has no reflection: such a space refuses mirror_actions
    if not ("mirror" in network and "vector" in case)
]


@pytest.mark.parametrize("case, network", CASES)
def test_boards_act_through_numpy_as_through_torch(case, network):
    """Dict observations of boards (convolved or flattened, mirrored or not) with action masks:
    the same values, log-probabilities and greedy moves, and never an illegal move."""
    space = BOARDS[case]
    kwargs = dict(NETWORKS[network], hidden_sizes=[32], activation="relu", seed=5)
    fast = ActorCriticPolicy(space, gym.spaces.Discrete(7), **kwargs)
    slow = ActorCriticPolicy(space, gym.spaces.Discrete(7), numpy_inference=False, **kwargs)
    assert fast._numpy is not None
    with torch.no_grad():  # weights of a trained network, not of a fresh one (heads near 0)
        for p, q in zip(fast.parameters(), slow.parameters(), strict=True):
            p.normal_(0.0, 0.3)
            q.copy_(p)
    req = board_request(space, 24, greedy=False)
    got, ref = fast.rollout(req), slow.rollout(req)
    np.testing.assert_allclose(got.policy_output.value, ref.policy_output.value, atol=1e-4)
    mask = req.obs["action_mask"].astype(bool)
    mask[0] = True
    assert mask[np.arange(24), got.action].all()
    assert (got.action[1] == 3) and (ref.action[1] == 3)
    with torch.no_grad():
        obs = slow.to_tensor(req.obs).apply(lambda x: x[None])
        params, _, _ = slow.module(obs, None, torch.zeros(1, 24, 1, dtype=bool))
        dist = slow._distribution(params[0], torch.as_tensor(mask))
        expected = dist.log_prob(torch.as_tensor(got.action)).numpy()
    np.testing.assert_allclose(got.policy_output.log_prob, expected, atol=1e-4)
    greedy = board_request(space, 24, greedy=True)
    np.testing.assert_array_equal(fast.rollout(greedy).action, slow.rollout(greedy).action)


def test_a_trainer_step_on_the_same_policy_object_is_acted_on_at_once():
    """A fused optimiser step does not bump the parameters' counters; the version does."""
    from algorithm.ppo.trainer import PPOTrainer

    fast, _ = pair(gym.spaces.Discrete(3))
    trainer = PPOTrainer(fast)
    req = request(8, greedy=True)
    before = fast.rollout(req).policy_output.value.copy()
    for p in fast.parameters():
        p.grad = torch.ones_like(p)
    trainer.optimizer.step()
    fast.inc_version()
    assert not np.allclose(before, fast.rollout(req).policy_output.value)


# ---------------------------------------------------------------------- the Q network
def q_pair(observation_space, **kwargs):
    """Two identical Q policies (same seed), one acting through numpy, one through torch."""
    from algorithm.q_policies.policy import QPolicy

    fast = QPolicy(observation_space, gym.spaces.Discrete(4, start=1), seed=3, **kwargs)
    slow = QPolicy(
        observation_space, gym.spaces.Discrete(4, start=1), seed=3, numpy_inference=False, **kwargs
    )
    assert fast._numpy is not None and slow._numpy is None
    return fast, slow


@pytest.mark.parametrize("dueling", [True, False])
def test_q_values_and_greedy_actions_agree_with_torch(dueling):
    fast, slow = q_pair(BOX_OBS, hidden_sizes=[16, 8], dueling=dueling)
    req = request(7, greedy=True)
    got, want = fast.rollout(req), slow.rollout(req)
    np.testing.assert_allclose(got.policy_output.q, want.policy_output.q, atol=1e-5)
    np.testing.assert_array_equal(got.action, want.action)
    assert got.policy_output.q.dtype == np.float32 and got.action.min() >= 1


def test_q_values_follow_a_trainer_step_and_a_loaded_checkpoint():
    from algorithm.dqn.trainer import DQNTrainer

    fast, slow = q_pair(BOX_OBS, hidden_sizes=[16])
    req = request(5, greedy=True)
    before = fast.rollout(req).policy_output.q.copy()
    trainer = DQNTrainer(fast, lr=0.1)
    for p in fast.parameters():
        p.grad = torch.ones_like(p)
    trainer.optimizer.step()  # fused: no parameter counter moves, the version does
    fast.inc_version()
    stepped = fast.rollout(req).policy_output.q
    assert not np.allclose(before, stepped)
    slow.load_checkpoint(fast.get_checkpoint())  # the torch path, on the stepped weights
    np.testing.assert_allclose(slow.rollout(req).policy_output.q, stepped, atol=1e-5)


def test_q_networks_on_images_act_through_torch():
    from algorithm.q_policies.policy import QPolicy

    space = gym.spaces.Box(0, 255, (3, 16, 16), np.uint8)
    assert QPolicy(space, gym.spaces.Discrete(3))._numpy is None


CATEGORICAL_OBS = {
    "a MultiDiscrete": gym.spaces.MultiDiscrete([3, 2, 4], start=[0, 1, -1]),
    "a 2-d MultiDiscrete": gym.spaces.MultiDiscrete([[2, 3], [3, 2]]),
    "a MultiBinary": gym.spaces.MultiBinary(5),
    "a Dict of them": gym.spaces.Dict(
        {"cells": gym.spaces.MultiDiscrete([3, 3]), "flags": gym.spaces.MultiBinary([2, 2])}
    ),
    "a Dict in a Dict": gym.spaces.Dict(
        {
            "hand": gym.spaces.Dict(
                {"card": gym.spaces.Discrete(4), "pos": gym.spaces.Box(-1, 1, (2,))}
            ),
            "seat": gym.spaces.Discrete(3),
        }
    ),
}


def batch_of(samples: list) -> np.ndarray | NamedArray:
    """Observations stacked as a lane stacks them: dicts (nested too) as NamedArrays."""
    if isinstance(samples[0], dict):
        return NamedArray(**{k: batch_of([s[k] for s in samples]) for k in samples[0]})
    return np.stack(samples)


@pytest.mark.parametrize("case", sorted(CATEGORICAL_OBS))
def test_multi_discrete_and_multi_binary_observations_act_alike_through_both_paths(case):
    """Such observations once failed to build a policy ("unsupported space"), though actors
    and the wire carried them: each MultiDiscrete component is now one-hot, a MultiBinary
    flattened, a Dict in a Dict encoded key by key, through torch and numpy alike."""
    space = CATEGORICAL_OBS[case]
    fast = ActorCriticPolicy(space, gym.spaces.Discrete(3), seed=2, hidden_sizes=[16])
    slow = ActorCriticPolicy(
        space, gym.spaces.Discrete(3), seed=2, hidden_sizes=[16], numpy_inference=False
    )
    assert fast._numpy is not None
    space.seed(4)
    samples = [space.sample() for _ in range(12)]
    obs = batch_of(samples)
    for greedy in (False, True):
        req = RolloutRequest(
            obs=obs, is_evaluation=np.full((12, 1), greedy), on_reset=np.ones((12, 1), bool)
        )
        got, ref = fast.rollout(req), slow.rollout(req)
        np.testing.assert_allclose(got.policy_output.value, ref.policy_output.value, atol=1e-5)
        if greedy:
            np.testing.assert_array_equal(got.action, ref.action)


def test_a_multi_discrete_observation_is_one_hot_per_component():
    from algorithm.modules.encoders import _MultiOneHot

    encode = _MultiOneHot(gym.spaces.MultiDiscrete([3, 2], start=[1, 0]))
    features = encode(torch.tensor([[3, 0], [1, 1]]))
    expected = [[0, 0, 1, 1, 0], [1, 0, 0, 0, 1]]
    np.testing.assert_array_equal(features.numpy(), np.array(expected, np.float32))


def test_a_tuple_observation_is_refused_saying_what_to_declare():
    space = gym.spaces.Tuple([gym.spaces.Discrete(5), gym.spaces.Discrete(2)])
    with pytest.raises(TypeError, match=r"a Tuple space .*declare a Dict of its parts instead"):
        ActorCriticPolicy(space, gym.spaces.Discrete(2))
