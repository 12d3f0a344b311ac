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
