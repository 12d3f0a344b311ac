"""Scripted opponents: ordinary policies that answer batched requests and never learn.

They are what a learned policy is measured against and what self-play starts from, so they go
through exactly the same door as a learned one: ``rollout(RolloutRequest)`` over a batch of
agents, a ``version`` (always 0), checkpoints (empty: there are no parameters). They have no
trainer; ``analyze`` refuses, naming the fix (leave the policy's trainer empty in the config).

* ``random-legal`` (:class:`RandomLegalPolicy`): uniform over the legal actions, read from the
  ``action_mask`` key of a dict observation (uniform over the whole Discrete space when there is
  no mask). A row whose mask allows nothing (the game is over) gets action 0.
* ``connect-four-heuristic`` (:class:`ConnectFourHeuristicPolicy`): win if a drop wins, else block
  a column where the opponent's next drop would win, else take the legal column nearest the
  centre. It reads PettingZoo's connect-four observation, which is laid out *from the acting
  player's side*: ``observation[row, column, 0]`` is 1 where the player to move has a piece and
  ``[..., 1]`` where its opponent has one, whichever seat it sits in; row 0 is the top of the
  board, so a piece dropped in a column lands on the highest-numbered empty row.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from api.errors import UserError
from api.namedarray import NamedArray
from api.policy import Policy, RolloutRequest, RolloutResult, SampleBatch

ACTION_MASK_KEY = "action_mask"  # the key algorithm.modules.encoders and the policies agree on

ROWS, COLUMNS = 6, 7
CENTRE_FIRST = np.array([3, 2, 4, 1, 5, 0, 6])
"""Connect-four columns from the centre outwards: a centre piece joins the most lines of four."""


class ScriptedPolicy(Policy):
    """A policy with fixed behaviour: version 0, nothing to train, nothing to checkpoint."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, seed: int | None):
        if not isinstance(action_space, gym.spaces.Discrete):
            raise UserError(
                f"{type(self).__name__} plays Discrete action spaces only, got {action_space}"
            )
        self.observation_space = observation_space
        self.action_space = action_space
        self.rng = np.random.default_rng(seed)

    @property
    def version(self) -> int:
        return 0

    def rollout(self, request: RolloutRequest, **kwargs: Any) -> RolloutResult:
        action = self.act(request.obs) + int(self.action_space.start)
        return RolloutResult(
            action=action.astype(np.int64),
            client_id=request.client_id,
            request_id=request.request_id,
        )

    def act(self, obs: Any) -> np.ndarray:
        """Actions ``[B]`` counted from 0, for a batch of observations."""
        raise NotImplementedError

    def analyze(self, sample: SampleBatch, target: str = "ppo", **kwargs: Any) -> Any:
        raise UserError(
            f"{type(self).__name__} is scripted and cannot be trained; leave its policy's "
            "trainer empty (PolicyConfig.trainer.type = '') so it plays as a frozen opponent"
        )

    def get_checkpoint(self) -> dict[str, Any]:
        return {"version": 0}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Nothing to load: the behaviour is fixed (a checkpoint of any version is accepted)."""


def _mask(obs: Any, n: int) -> np.ndarray:
    """``[B, n]`` bool legal actions: the ``action_mask`` key, or everything legal without one."""
    if isinstance(obs, (NamedArray, dict)) and ACTION_MASK_KEY in obs:
        return np.asarray(obs[ACTION_MASK_KEY]).reshape(-1, n).astype(bool)
    rows = len(obs) if not isinstance(obs, dict) else len(next(iter(obs.values())))
    return np.ones((rows, n), dtype=bool)


class RandomLegalPolicy(ScriptedPolicy):
    """Uniformly random over the legal actions of each row (registered as ``random-legal``)."""

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        seed: int | None = None,
    ):
        super().__init__(observation_space, action_space, seed)

    def act(self, obs: Any) -> np.ndarray:
        legal = _mask(obs, int(self.action_space.n))
        # Random keys, illegal ones pushed below every legal one: argmax is a uniform legal pick.
        keys = self.rng.random(legal.shape) + legal
        return keys.argmax(axis=1)


class ConnectFourHeuristicPolicy(ScriptedPolicy):
    """Win now, else block the opponent's immediate win, else prefer centre columns (registered
    as ``connect-four-heuristic``). Deterministic: the same board always gets the same move."""

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        seed: int | None = None,
    ):
        super().__init__(observation_space, action_space, seed)
        _check_connect_four_spaces(observation_space, action_space)

    def act(self, obs: Any) -> np.ndarray:
        board = np.asarray(obs["observation"]).astype(bool)  # [B, 6, 7, 2]
        legal = _mask(obs, COLUMNS)
        mine, theirs = board[..., 0], board[..., 1]
        landing = (~(mine | theirs)).sum(axis=1) - 1  # [B, 7]: row a drop lands on, -1 if full
        score = np.zeros(legal.shape)
        score[:, CENTRE_FIRST] = np.linspace(1.0, 0.0, COLUMNS)  # centre first
        score += 10.0 * _wins_by_drop(theirs, landing)  # block
        score += 100.0 * _wins_by_drop(mine, landing)  # win
        score[~legal] = -np.inf
        return score.argmax(axis=1)


def _wins_by_drop(pieces: np.ndarray, landing: np.ndarray) -> np.ndarray:
    """``[B, 7]``: would a piece dropped in each column complete four in a row for ``pieces``?"""
    batch = pieces.shape[0]
    placed = np.repeat(pieces[:, None], COLUMNS, axis=1)  # [B, 7 drops, 6, 7]
    b, c = np.meshgrid(np.arange(batch), np.arange(COLUMNS), indexing="ij")
    ok = landing >= 0
    placed[b[ok], c[ok], landing[ok], c[ok]] = True
    return _has_four(placed) & ok


def _has_four(x: np.ndarray) -> np.ndarray:
    """Any four in a row (horizontal, vertical, both diagonals) on boards ``[..., 6, 7]``."""
    h = x[..., :, 0:4] & x[..., :, 1:5] & x[..., :, 2:6] & x[..., :, 3:7]
    v = x[..., 0:3, :] & x[..., 1:4, :] & x[..., 2:5, :] & x[..., 3:6, :]
    d = x[..., 0:3, 0:4] & x[..., 1:4, 1:5] & x[..., 2:5, 2:6] & x[..., 3:6, 3:7]
    a = x[..., 0:3, 3:7] & x[..., 1:4, 2:6] & x[..., 2:5, 1:5] & x[..., 3:6, 0:4]
    return h.any(axis=(-2, -1)) | v.any(axis=(-2, -1)) | d.any(axis=(-2, -1)) | a.any(axis=(-2, -1))


def _check_connect_four_spaces(observation_space: gym.Space, action_space: gym.Space) -> None:
    board = None
    if isinstance(observation_space, gym.spaces.Dict):
        board = observation_space.spaces.get("observation")
    if (
        board is None
        or getattr(board, "shape", None) != (ROWS, COLUMNS, 2)
        or ACTION_MASK_KEY not in observation_space.spaces
        or int(action_space.n) != COLUMNS
    ):
        raise UserError(
            "connect-four-heuristic plays PettingZoo's connect four only: it needs a Dict "
            f"observation with 'observation' (6, 7, 2) and '{ACTION_MASK_KEY}' (7,), and "
            f"Discrete(7) actions; got {observation_space} and {action_space}. Use it with the "
            "ConnectFour-v3 environment"
        )
