"""A symmetric actor-critic (``mirror_actions``): the reflection of a board is played as the
reflection of the play, for any weights, and what trains one side trains the other."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from algorithm.actor_critic_policies.policy import ActorCriticPolicy
from api.namedarray import NamedArray
from api.policy import RolloutRequest

BOARD = gym.spaces.Box(0, 1, shape=(6, 7, 2), dtype=np.int8)
CONNECT_FOUR = gym.spaces.Dict(
    {"observation": BOARD, "action_mask": gym.spaces.Box(0, 1, shape=(7,), dtype=np.int8)}
)
COLUMNS = [6, 5, 4, 3, 2, 1, 0]


def _policy(space=CONNECT_FOUR, **kwargs) -> ActorCriticPolicy:
    args = dict(hidden_sizes=[32], grid_channels=[8], mirror_actions=COLUMNS, seed=0)
    return ActorCriticPolicy(space, gym.spaces.Discrete(7), **{**args, **kwargs})


def _boards(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2, (n, 6, 7, 2), dtype=np.int8)


def _outputs(policy: ActorCriticPolicy, boards: np.ndarray):
    obs = NamedArray(observation=boards, action_mask=np.ones((len(boards), 7), np.int8))
    params, value, _ = policy.module(
        policy.to_tensor(obs).apply(lambda x: x[None]), None, torch.ones(1, len(boards), 1)
    )
    return params[0], value[0]


def test_the_reflected_board_gets_the_reflected_logits_and_the_same_value():
    policy = _policy()
    boards = _boards(16)
    logits, value = _outputs(policy, boards)
    mirrored_logits, mirrored_value = _outputs(policy, boards[:, :, ::-1].copy())
    torch.testing.assert_close(mirrored_logits, logits[:, COLUMNS])
    torch.testing.assert_close(mirrored_value, value)
    assert not torch.allclose(logits, logits[:, COLUMNS])  # not symmetric within one board


def test_channel_first_boards_are_reflected_along_their_width():
    space = gym.spaces.Box(0, 1, shape=(2, 6, 7), dtype=np.int8)
    policy = _policy(space)
    boards = torch.as_tensor(_boards(8).transpose(0, 3, 1, 2).copy())
    logits, _, _ = policy.module(boards[None], None, torch.ones(1, 8, 1))
    mirrored, _, _ = policy.module(boards.flip(-1)[None], None, torch.ones(1, 8, 1))
    torch.testing.assert_close(mirrored[0], logits[0][:, COLUMNS])


def test_greedy_play_of_a_reflected_position_is_the_reflected_move():
    policy = _policy()
    boards = _boards(32, seed=1)
    mask = np.random.default_rng(2).integers(0, 2, (32, 7), dtype=np.int8)
    mask[:, 3] = 1  # at least one legal column
    greedy = np.ones((32, 1), bool)

    def play(b, m):
        obs = NamedArray(observation=b, action_mask=m)
        return policy.rollout(RolloutRequest(obs=obs, is_evaluation=greedy)).action

    moves = play(boards, mask)
    mirrored = play(boards[:, :, ::-1].copy(), mask[:, ::-1].copy())
    np.testing.assert_array_equal(mirrored, np.asarray(COLUMNS)[moves])
    assert all(mask[i, a] for i, a in enumerate(moves))


def test_a_gradient_step_on_one_side_moves_the_mirror_side_alike():
    policy = _policy()
    board = _boards(1, seed=3)
    optimiser = torch.optim.SGD(policy.module.parameters(), lr=0.5)
    logits, _ = _outputs(policy, board)
    mirrored_before, _ = _outputs(policy, board[:, :, ::-1].copy())
    (-torch.log_softmax(logits, -1)[0, 1]).backward()  # make column 1 likelier
    optimiser.step()
    after, _ = _outputs(policy, board)
    mirrored_after, _ = _outputs(policy, board[:, :, ::-1].copy())
    assert torch.softmax(after, -1)[0, 1] > torch.softmax(logits.detach(), -1)[0, 1]
    # The reflection was never trained on, yet its column 5 became likelier by as much.
    before5 = torch.softmax(mirrored_before.detach(), -1)[0, 5]
    assert torch.softmax(mirrored_after, -1)[0, 5] > before5
    torch.testing.assert_close(mirrored_after[0, 5], after[0, 1])  # column 5 of the reflection


def test_a_checkpoint_loads_with_or_without_the_symmetry():
    symmetric, plain = _policy(), _policy(mirror_actions=())
    plain.module.load_state_dict(symmetric.module.state_dict())
    boards = _boards(4)
    logits, _ = _outputs(plain, boards)
    averaged = (logits + _outputs(plain, boards[:, :, ::-1].copy())[0][:, COLUMNS]) / 2
    torch.testing.assert_close(_outputs(symmetric, boards)[0], averaged)


@pytest.mark.parametrize(
    "space, kwargs, message",
    [
        (CONNECT_FOUR, dict(mirror_actions=[0, 1, 2]), "each of the 7 actions once"),
        (CONNECT_FOUR, dict(mirror_actions=[1, 2, 0, 3, 4, 5, 6]), "back to it"),
        (gym.spaces.Box(-1, 1, (4,)), dict(grid_channels=()), "no width to reflect"),
        (CONNECT_FOUR, dict(rnn_hidden=8), "feed-forward"),
    ],
)
def test_what_has_no_reflection_is_refused_with_the_reason(space, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _policy(space, **kwargs)
