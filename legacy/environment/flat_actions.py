"""Dict and Tuple action spaces, acted in as one flat space.

Troupe's policies take Discrete, MultiDiscrete, MultiBinary and Box actions. An environment
whose action is a Dict or a Tuple of parts (``{"move": Discrete(3), "fire": Discrete(2)}``) was
refused. Where every part is discrete, the parts are one MultiDiscrete (a Categorical each: the
parts are drawn independently, as RLlib's and Stable-Baselines3's MultiDiscrete heads draw
theirs); where every part is a Box, they are one Box, the parts' values side by side; where
they mix (which move, and how far), one :class:`~api.spaces.HybridBox`: the choices' indices
first, then the values. The gymnasium and PettingZoo adapters show the policy that flat space and
hand the environment each action back in its own shape (:meth:`FlatActions.unflatten`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from api.spaces import HybridBox

DISCRETE = (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)


@dataclass(frozen=True)
class Part:
    """One leaf of the nested space: where it sits (Dict keys, Tuple positions), its space, and
    the flat action's slice that holds it."""

    path: tuple[Any, ...]
    space: gym.Space
    at: slice


@dataclass(frozen=True)
class FlatActions:
    """A Dict or Tuple action space (``nested``) and the flat one a policy acts in."""

    nested: gym.Space
    space: gym.Space
    parts: tuple[Part, ...]

    def unflatten(self, action: Any) -> Any:
        """The flat ``action`` in the nested space's own shape: each part from its slice, a
        Discrete's index from its ``start``, each in the part's dtype."""
        flat = np.asarray(action).reshape(-1)
        values = {part.path: _part_value(part.space, flat[part.at]) for part in self.parts}
        return _assemble(self.nested, (), values)


def flat_actions(space: gym.Space) -> FlatActions | None:
    """``space`` flattened (see the module), or None where it is no Dict or Tuple and is acted
    in as it is. Raises ValueError for parts of both kinds, or of another kind."""
    if not isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        return None
    leaves = list(_leaves(space, ()))
    if all(isinstance(s, DISCRETE) for _, s in leaves):
        return _flattened(space, leaves, _choices, _discrete_space)
    if all(isinstance(s, gym.spaces.Box) for _, s in leaves):
        return _flattened(space, leaves, _values, _box_space)
    if all(isinstance(s, (*DISCRETE, gym.spaces.Box)) for _, s in leaves):
        # the choices first, then the values: the layout a HybridBox has
        ordered = sorted(leaves, key=lambda leaf: isinstance(leaf[1], gym.spaces.Box))
        return _flattened(space, ordered, _entries, _hybrid_space)
    kinds = ", ".join(f"{_where(p)}: {type(s).__name__}" for p, s in leaves)
    raise ValueError(
        f"a {type(space).__name__} action space is acted in as one flat space of discrete and "
        f"Box parts; this one has others ({kinds})"
    )


def flat_or_none(space: gym.Space) -> FlatActions | None:
    """``space`` flattened, or None: no Dict or Tuple, or one mixing discrete and continuous
    parts, which stays as it is (the experiments refuse it, naming its parts)."""
    try:
        return flat_actions(space)
    except ValueError:
        return None


def _leaves(space: gym.Space, path: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], gym.Space]]:
    if isinstance(space, gym.spaces.Dict):
        for key, sub in space.spaces.items():
            yield from _leaves(sub, (*path, key))
    elif isinstance(space, gym.spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            yield from _leaves(sub, (*path, i))
    else:
        yield path, space


def _flattened(
    nested: gym.Space,
    leaves: list[tuple[tuple[Any, ...], gym.Space]],
    width: Callable[[gym.Space], int],
    make: Callable[[list[gym.Space]], gym.Space],
) -> FlatActions:
    parts, start = [], 0
    for path, space in leaves:
        parts.append(Part(path, space, slice(start, start + width(space))))
        start += width(space)
    return FlatActions(nested, make([s for _, s in leaves]), tuple(parts))


def _choices(space: gym.Space) -> int:
    """How many of the flat MultiDiscrete's entries a discrete part takes."""
    return 1 if isinstance(space, gym.spaces.Discrete) else int(np.prod(space.shape))


def _entries(space: gym.Space) -> int:
    return _values(space) if isinstance(space, gym.spaces.Box) else _choices(space)


def _values(space: gym.Space) -> int:
    """How many of the flat action's entries a Box part takes."""
    return int(np.prod(space.shape))


def _hybrid_space(spaces: list[gym.Space]) -> gym.Space:
    """Discrete parts (first) and Box parts as one :class:`~api.spaces.HybridBox`."""
    discrete = [s for s in spaces if not isinstance(s, gym.spaces.Box)]
    boxes = [s for s in spaces if isinstance(s, gym.spaces.Box)]
    values = _box_space(boxes)
    return HybridBox(_discrete_space(discrete).nvec, values.low, values.high)


def _discrete_space(spaces: list[gym.Space]) -> gym.Space:
    counts = []
    for space in spaces:
        if isinstance(space, gym.spaces.Discrete):
            counts.append([int(space.n)])
        elif isinstance(space, gym.spaces.MultiDiscrete):
            counts.append(np.asarray(space.nvec).reshape(-1).tolist())
        else:  # MultiBinary: a two-way choice each
            counts.append([2] * int(np.prod(space.shape)))
    return gym.spaces.MultiDiscrete([n for part in counts for n in part])


def _box_space(spaces: list[gym.Space]) -> gym.Space:
    low = np.concatenate([np.asarray(s.low, np.float64).reshape(-1) for s in spaces])
    high = np.concatenate([np.asarray(s.high, np.float64).reshape(-1) for s in spaces])
    dtype = np.result_type(*(s.dtype for s in spaces))
    return gym.spaces.Box(low.astype(dtype), high.astype(dtype), dtype=dtype)


def _part_value(space: gym.Space, flat: np.ndarray) -> Any:
    """A part's value from its slice: a choice is an index (a float in a HybridBox's action,
    rounded back), a Box part's values in the part's dtype."""
    if isinstance(space, gym.spaces.Box):
        return flat.reshape(space.shape).astype(space.dtype)
    index = np.rint(flat).astype(np.int64)
    if isinstance(space, gym.spaces.Discrete):
        return np.int64(int(index[0]) + int(space.start))
    start = np.asarray(getattr(space, "start", 0))  # MultiDiscrete; MultiBinary: none
    return (index.reshape(space.shape) + start).astype(space.dtype)


def _assemble(space: gym.Space, path: tuple[Any, ...], values: dict[tuple[Any, ...], Any]) -> Any:
    if isinstance(space, gym.spaces.Dict):
        return {key: _assemble(sub, (*path, key), values) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_assemble(sub, (*path, i), values) for i, sub in enumerate(space.spaces))
    return values[path]


def _where(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path) or "the action"
