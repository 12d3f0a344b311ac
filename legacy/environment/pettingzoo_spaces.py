"""How a PettingZoo game's spaces and observations are seen in Troupe: float64 boxes as float32
(what the networks compute in), Tuples as Dicts keyed by position (:mod:`api.spaces`), and a
placeholder observation for an agent that left without one."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from api.errors import UserError
from api.spaces import dict_of_tuples, from_positions


def troupe_space(space: gym.Space) -> gym.Space:
    """``space`` with every float64 Box declared float32 (recursively inside a Dict), and every
    Tuple a Dict keyed by position (:mod:`api.spaces`)."""
    space = dict_of_tuples(space)
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({k: troupe_space(s) for k, s in space.spaces.items()})
    if isinstance(space, gym.spaces.Box) and space.dtype == np.float64:
        low = space.low.astype(np.float32)
        high = space.high.astype(np.float32)
        return gym.spaces.Box(low, high, space.shape, np.float32)
    return space


def troupe_obs(obs: Any, space: gym.Space) -> Any:
    """Cast ``obs`` to the dtypes of ``space`` (as made by :func:`troupe_space`); a Tuple's
    observation is keyed by position."""
    if isinstance(space, gym.spaces.Dict):
        if isinstance(obs, (tuple, list)):  # the game's Tuple observation
            obs = from_positions(obs, space)
        return {k: troupe_obs(obs[k], s) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Box):
        return np.asarray(obs, dtype=space.dtype)
    return obs


def zero_obs(space: gym.Space) -> Any:
    """A placeholder observation for an agent that left without one (all zeros)."""
    if isinstance(space, gym.spaces.Dict):
        return {k: zero_obs(s) for k, s in space.spaces.items()}
    if isinstance(space, (gym.spaces.Box, gym.spaces.MultiBinary, gym.spaces.MultiDiscrete)):
        return np.zeros(space.shape, dtype=space.dtype)
    if isinstance(space, gym.spaces.Discrete):
        return np.int64(space.start)
    raise UserError(f"PettingZoo adapter: no placeholder observation for space {space}")


STATE_KEY = "state"
"""The key of the game's global state in each agent's observation (``global_state=True``)."""
OWN_KEY = "obs"
"""The key of an agent's own observation beside it, where that observation is no Dict."""


def with_state(space: gym.Space, state: gym.Space) -> gym.spaces.Dict:
    """An agent's observation space with the game's global state beside it: a Dict's keys and
    :data:`STATE_KEY`, or :data:`OWN_KEY` and :data:`STATE_KEY`."""
    if not isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({OWN_KEY: space, STATE_KEY: state})
    if STATE_KEY in space.spaces:
        raise UserError(
            f"global_state: the agents' observations have a '{STATE_KEY}' key already, where "
            "the game's global state would go"
        )
    return gym.spaces.Dict({**space.spaces, STATE_KEY: state})


def obs_with_state(obs: Any, state: Any) -> dict[str, Any]:
    """An agent's observation (as :func:`troupe_obs` gives it) with the global state beside it,
    as :func:`with_state` declares it."""
    if isinstance(obs, dict):
        return {**obs, STATE_KEY: state}
    return {OWN_KEY: obs, STATE_KEY: state}
