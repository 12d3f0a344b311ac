"""Board encoders: 3x3 convolutions over piece planes (connect four's ``[6, 7, 2]``)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from algorithm.actor_critic_policies.policy import ActorCriticPolicy
from algorithm.modules.encoders import GridEncoder, ObservationEncoder, _Flat
from api.namedarray import NamedArray
from api.policy import RolloutRequest

BOARD = gym.spaces.Box(0, 1, shape=(6, 7, 2), dtype=np.int8)
CONNECT_FOUR = gym.spaces.Dict(
    {"observation": BOARD, "action_mask": gym.spaces.Box(0, 1, shape=(7,), dtype=np.int8)}
)


def test_boards_are_flattened_unless_grid_channels_are_given():
    assert isinstance(ObservationEncoder(BOARD, [16]).parts["obs"], _Flat)
    encoder = ObservationEncoder(BOARD, [16], grid_channels=[8, 4])
    assert isinstance(encoder.parts["obs"], GridEncoder)
    assert encoder.parts["obs"].out_features == 4 * 6 * 7  # the board's size is kept
    assert encoder(torch.zeros(3, 6, 7, 2, dtype=torch.int8)).shape == (3, 16)


def test_a_pattern_is_seen_by_the_same_weights_wherever_it_is():
    """Moved one column right (away from the edges), a piece's features move with it."""
    torch.manual_seed(0)
    grid = GridEncoder((6, 7, 2), [4])
    board = torch.zeros(1, 6, 7, 2)
    board[0, 3, 2, 0] = 1.0
    moved = torch.roll(board, shifts=1, dims=2)
    features = grid(board).reshape(4, 6, 7)
    moved_features = grid(moved).reshape(4, 6, 7)
    torch.testing.assert_close(moved_features[:, :, 2:6], features[:, :, 1:5])
    assert not torch.allclose(moved_features, features)


def test_channel_first_boards_give_the_same_features_as_channel_last():
    torch.manual_seed(0)
    last, first = GridEncoder((6, 7, 2), [8]), GridEncoder((2, 6, 7), [8])
    first.load_state_dict(last.state_dict())
    boards = torch.randint(0, 2, (5, 6, 7, 2), dtype=torch.int8)
    torch.testing.assert_close(first(boards.permute(0, 3, 1, 2)), last(boards))


def test_a_grid_policy_plays_legal_moves_and_learns_through_its_convolutions():
    policy = ActorCriticPolicy(
        CONNECT_FOUR, gym.spaces.Discrete(7), hidden_sizes=[32], grid_channels=[8], seed=0
    )
    rng = np.random.default_rng(0)
    mask = np.zeros((64, 7), np.int8)
    mask[:, [1, 5]] = 1
    obs = NamedArray(observation=rng.integers(0, 2, (64, 6, 7, 2), dtype=np.int8), action_mask=mask)
    result = policy.rollout(RolloutRequest(obs=obs, on_reset=np.ones((64, 1), bool)))
    assert set(np.unique(result.action)) <= {1, 5}
    conv = policy.module.actor_body.encoder.parts["observation"].net[0]
    logits, _, _ = policy.module(
        policy.to_tensor(obs).apply(lambda x: x[None]), None, torch.ones(1, 64, 1)
    )
    logits.sum().backward()
    assert conv.weight.grad is not None and conv.weight.grad.abs().sum() > 0
