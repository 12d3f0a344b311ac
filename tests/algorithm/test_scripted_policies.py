"""Scripted opponents: legal, batched, version 0, untrainable; the connect-four rules."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from algorithm.scripted_policies import ConnectFourHeuristicPolicy, RandomLegalPolicy
from api import policy as policy_api
from api.errors import UserError
from api.namedarray import NamedArray
from api.policy import RolloutRequest

BOARD = gym.spaces.Box(0, 1, (6, 7, 2), np.int8)
C4_OBS = gym.spaces.Dict({"action_mask": gym.spaces.Box(0, 1, (7,), np.int8), "observation": BOARD})
C4_ACT = gym.spaces.Discrete(7)


def _request(obs) -> RolloutRequest:
    n = len(obs)
    return RolloutRequest(
        obs=obs,
        is_evaluation=np.ones((n, 1), dtype=bool),
        on_reset=np.zeros((n, 1), dtype=bool),
        client_id=np.arange(n).reshape(n, 1),
        request_id=np.full((n, 1), 7),
    )


def _boards(*rows_of_text: list[str]) -> NamedArray:
    """Boards from text, top row first: 'x' the mover's piece, 'o' the opponent's, '.' empty."""
    boards = np.zeros((len(rows_of_text), 6, 7, 2), dtype=np.int8)
    for b, rows in enumerate(rows_of_text):
        rows = ["......."] * (6 - len(rows)) + rows
        for r, line in enumerate(rows):
            for c, ch in enumerate(line):
                if ch != ".":
                    boards[b, r, c, 0 if ch == "x" else 1] = 1
    mask = (boards[:, 0].sum(axis=-1) == 0).astype(np.int8)  # a column is legal while not full
    return NamedArray(action_mask=mask, observation=boards)


def test_registered_names_build_the_policies():
    made = policy_api.make("random-legal", observation_space=C4_OBS, action_space=C4_ACT)
    assert isinstance(made, RandomLegalPolicy) and made.version == 0
    made = policy_api.make("connect-four-heuristic", observation_space=C4_OBS, action_space=C4_ACT)
    assert isinstance(made, ConnectFourHeuristicPolicy) and made.version == 0


def test_random_legal_is_uniform_over_the_mask_and_echoes_ids():
    space = gym.spaces.Dict(
        {"action_mask": gym.spaces.MultiBinary(5), "x": gym.spaces.Box(0, 1, (2,))}
    )
    policy = RandomLegalPolicy(space, gym.spaces.Discrete(5), seed=0)
    n = 4000
    mask = np.tile(np.array([0, 1, 0, 1, 1], dtype=np.int8), (n, 1))
    result = policy.rollout(_request(NamedArray(action_mask=mask, x=np.zeros((n, 2)))))
    assert result.action.shape == (n,) and result.action.dtype == np.int64
    counts = np.bincount(result.action, minlength=5)
    assert counts[[0, 2]].sum() == 0
    assert np.all(np.abs(counts[[1, 3, 4]] / n - 1 / 3) < 0.03)
    assert result.request_id.tolist() == [[7]] * n and result.client_id[3, 0] == 3


def test_random_legal_without_a_mask_uses_the_whole_space_from_its_start():
    policy = RandomLegalPolicy(gym.spaces.Box(0, 1, (3,)), gym.spaces.Discrete(3, start=-1), seed=1)
    action = policy.rollout(_request(np.zeros((600, 3), dtype=np.float32))).action
    assert set(action.tolist()) == {-1, 0, 1}


def test_heuristic_wins_then_blocks_then_prefers_the_centre():
    obs = _boards(
        # x wins in column 6 (three stacked there); o also threatens column 0: win first
        ["o.....x", "o.....x", "o.....x"],
        # o has three on the bottom row, columns 1-3: block at 0 or 4, the nearer the centre
        ["......x", ".ooo..x"],
        # nothing urgent: centre
        ["x.....o"],
        # centre column full: next best is 2 (then 4)
        ["...x...", "...o...", "...x...", "...o...", "...x...", "...o..."],
        # diagonal win for x: x at (3,1), (4,2), (5,3); a drop in column 0 lands on (2,0)
        ["ox.....", "oox....", "xoox..."],
    )
    policy = ConnectFourHeuristicPolicy(C4_OBS, C4_ACT)
    actions = policy.rollout(_request(obs)).action
    assert actions[0] == 6
    assert actions[1] == 4
    assert actions[2] == 3
    assert actions[3] == 2
    assert actions[4] == 0


def test_heuristic_plays_legal_columns_on_boards_from_real_games():
    pytest.importorskip("pettingzoo", reason="needs the 'multiagent' extra")
    from api import environment

    env = environment.make("ConnectFour-v3")
    env.seed(0)
    rng = np.random.default_rng(0)
    policy = ConnectFourHeuristicPolicy(C4_OBS, C4_ACT)
    observations, results = [], env.reset()
    while len(observations) < 300:
        i, mover = next((i, r) for i, r in enumerate(results) if r is not None)
        if mover.done or mover.truncated:
            results = env.reset()
            continue
        observations.append(mover.obs)
        actions = [None, None]
        actions[i] = int(rng.choice(np.flatnonzero(mover.obs["action_mask"])))
        results = env.step(actions)
    obs = NamedArray(
        action_mask=np.stack([o["action_mask"] for o in observations]),
        observation=np.stack([o["observation"] for o in observations]),
    )
    actions = policy.rollout(_request(obs)).action
    assert obs.action_mask[np.arange(len(actions)), actions].all()


def test_heuristic_refuses_other_games_with_a_clear_message():
    ttt = gym.spaces.Dict(
        {
            "action_mask": gym.spaces.Box(0, 1, (9,), np.int8),
            "observation": gym.spaces.Box(0, 1, (3, 3, 2), np.int8),
        }
    )
    with pytest.raises(UserError, match="ConnectFour-v3"):
        ConnectFourHeuristicPolicy(ttt, gym.spaces.Discrete(9))


def test_scripted_policies_cannot_be_trained_and_keep_version_zero():
    policy = RandomLegalPolicy(C4_OBS, C4_ACT)
    with pytest.raises(UserError, match="trainer empty"):
        policy.analyze(None)
    policy.load_checkpoint({"version": 12})
    assert policy.version == 0 and policy.get_checkpoint() == {"version": 0}
