"""Tuple observation spaces seen as Dicts keyed by position, and back.

Troupe's encoders, wire checks and NamedArrays know Dict observations, whose keys name fields;
a gymnasium ``Tuple`` (Blackjack's ``(player sum, dealer card, usable ace)``) is the same data
under positions. :func:`dict_of_tuples` names them ``item0``, ``item1``, ... (zero-padded past
ten, so that a Dict, which sorts its keys, keeps their order), recursively; the gymnasium
adapter presents its observations so through :func:`from_positions`, which turns a raw tuple
into such a dict (also for a policy acting outside a run, ``troupe.load_policy(...).act``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


def dict_of_tuples(space: gym.Space) -> gym.Space:
    """``space`` with every Tuple in it a Dict keyed by position; ``space`` itself (the same
    object) where it has none."""
    if isinstance(space, gym.spaces.Tuple):
        parts = [dict_of_tuples(s) for s in space.spaces]
        return gym.spaces.Dict({_position(i, len(parts)): s for i, s in enumerate(parts)})
    if isinstance(space, gym.spaces.Dict):
        parts = {k: dict_of_tuples(s) for k, s in space.spaces.items()}
        if all(parts[k] is s for k, s in space.spaces.items()):
            return space
        return gym.spaces.Dict(parts)
    return space


def _position(index: int, count: int) -> str:
    """``item3``, or ``item03`` among a dozen: Dict spaces sort their keys, and so keep the
    order."""
    return "item" + str(index).zfill(len(str(count - 1)))


def from_positions(obs: Any, space: gym.Space) -> Any:
    """``obs`` for ``space``: a tuple (or list) where ``space`` is a Dict keyed by position is
    the dict those positions name, recursively; anything else as it is."""
    if not isinstance(space, gym.spaces.Dict):
        return obs
    keys = list(space.spaces)
    if isinstance(obs, (tuple, list)) and keys == [_position(i, len(obs)) for i in range(len(obs))]:
        return {k: from_positions(o, space.spaces[k]) for k, o in zip(keys, obs, strict=True)}
    if isinstance(obs, dict):
        return {k: from_positions(v, space.spaces[k]) if k in space.spaces else v
                for k, v in obs.items()}  # fmt: skip
    return obs


class HybridBox(gym.spaces.Box):
    """An action of discrete choices and continuous values together (a parameterised action:
    which move, and how far), as one flat float32 vector: first one entry per choice, its index
    from 0 (``nvec``: how many each offers), then the continuous values within ``low`` and
    ``high``. A Box, so that what carries, clips and checks Box actions carries these; a policy
    that knows it draws a Categorical per choice and a Gaussian for the values
    (``algorithm.modules.distributions.Hybrid``). The gymnasium and PettingZoo adapters present
    a Dict or Tuple action space that mixes discrete and Box parts as one."""

    def __init__(self, nvec: Any, low: Any, high: Any, seed: Any = None):
        self.nvec = np.asarray(nvec, dtype=np.int64).reshape(-1)
        low = np.asarray(low, dtype=np.float32).reshape(-1)
        high = np.asarray(high, dtype=np.float32).reshape(-1)
        super().__init__(
            np.concatenate([np.zeros(len(self.nvec), np.float32), low]),
            np.concatenate([(self.nvec - 1).astype(np.float32), high]),
            dtype=np.float32,
            seed=seed,
        )

    @property
    def choices(self) -> int:
        """How many leading entries are discrete choices."""
        return len(self.nvec)

    def sample(self, mask: Any = None, probability: Any = None) -> np.ndarray:
        values = super().sample()
        values[: self.choices] = [self.np_random.integers(n) for n in self.nvec]
        return values

    def contains(self, x: Any) -> bool:
        if not super().contains(x):
            return False
        picked = np.asarray(x, dtype=np.float32).reshape(-1)[: self.choices]
        return bool(np.all(picked == np.rint(picked)))

    def __repr__(self) -> str:
        continuous = gym.spaces.Box(self.low[self.choices :], self.high[self.choices :])
        return f"HybridBox(choices {self.nvec.tolist()}, then {continuous})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, HybridBox)
            and np.array_equal(self.nvec, other.nvec)
            and super().__eq__(other)
        )
