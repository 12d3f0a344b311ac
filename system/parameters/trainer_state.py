"""A trainer's own state (optimiser moments, step counters) in a form the wire codec carries.

A trainer's ``get_checkpoint`` returns what torch's optimisers return from ``state_dict()``:
dicts keyed by parameter index (ints, which the wire codec refuses as keys) holding tensors
(which it sends as numpy arrays, so they would come back as arrays, and an optimiser's
``load_state_dict`` needs tensors). :func:`to_wire` tags both, so that :func:`from_wire` gives
back the same structure: int-keyed dicts as int-keyed dicts, tensors as tensors, numpy arrays as
numpy arrays. What travels is still only msgpack and raw array frames (no pickle); the parameter
service stores the tagged form as it came and never needs torch to do so.

The trainer worker saves the state inside an envelope (:func:`wrap`) that also holds its own step
count: a trainer that keeps no count in ``get_checkpoint`` (the default keeps nothing) would
otherwise start ``trainer_steps`` from 0 on every resume or restart, and ``stop.trainer_steps``
and PBT's intervals with it. :func:`unwrap` reads a bare state of an older run folder too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from api.errors import UserError

TENSOR = "~tensor"
"""``{TENSOR: array}``: a torch tensor, sent as its numpy array."""
KEYS, VALUES = "~keys", "~values"
"""``{KEYS: [...], VALUES: [...]}``: a dict whose keys are not all strings (ints, say)."""
STATE, STEPS = "~state", "~steps"
"""``{STATE: tagged state, STEPS: int}``: the envelope :func:`wrap` makes."""
_TAGS = frozenset((TENSOR, KEYS, VALUES, STATE, STEPS))


def to_wire(state: Any, path: str = "trainer state") -> Any:
    """``state`` with tensors and non-string-keyed dicts tagged; raises UserError for a key the
    tags reserve. Everything else is left for the wire codec (which refuses what cannot go)."""
    if isinstance(state, dict):
        if all(type(k) is str for k in state):
            reserved = _TAGS.intersection(state)
            if reserved:
                raise UserError(f"{path}: key {sorted(reserved)[0]!r} is reserved")
            return {k: to_wire(v, f"{path}[{k!r}]") for k, v in state.items()}
        for k in state:
            if type(k) not in (str, int):
                raise UserError(f"{path}: dict key {k!r} is not a str or an int")
        return {
            KEYS: list(state),
            VALUES: [to_wire(v, f"{path}[{k!r}]") for k, v in state.items()],
        }
    if isinstance(state, (list, tuple)):
        items = [to_wire(v, f"{path}[{i}]") for i, v in enumerate(state)]
        return tuple(items) if isinstance(state, tuple) else items
    if type(state).__module__.startswith("torch"):
        import torch

        if isinstance(state, torch.Tensor):
            return {TENSOR: state.detach().cpu()}
    return state


def from_wire(state: Any) -> Any:
    """The structure :func:`to_wire` was given, with writable arrays and tensors of its own."""
    if isinstance(state, dict):
        if TENSOR in state:
            import torch

            value = state[TENSOR]
            if isinstance(value, torch.Tensor):  # never went through the wire codec
                return value.clone()
            return torch.from_numpy(np.array(value, copy=True))
        if KEYS in state:
            return {k: from_wire(v) for k, v in zip(state[KEYS], state[VALUES], strict=True)}
        return {k: from_wire(v) for k, v in state.items()}
    if isinstance(state, list):
        return [from_wire(v) for v in state]
    if isinstance(state, tuple):
        return tuple(from_wire(v) for v in state)
    if isinstance(state, np.ndarray):
        return np.array(state, copy=True)
    return state


def wrap(state: Any, steps: int) -> dict[str, Any]:
    """The trainer's ``state`` (tagged by :func:`to_wire`) with the worker's step count."""
    return {STATE: to_wire(state), STEPS: int(steps)}


def unwrap(saved: Any) -> tuple[Any, int | None]:
    """``(state, steps)`` from what :func:`wrap` made; ``(state, None)`` from a bare state."""
    if isinstance(saved, dict) and STATE in saved:
        steps = saved.get(STEPS)
        return from_wire(saved[STATE]), int(steps) if isinstance(steps, int) else None
    return from_wire(saved), None


def is_empty(state: Any) -> bool:
    """True for a trainer that keeps nothing of its own (the default ``get_checkpoint``)."""
    return isinstance(state, dict) and not state


def array_bytes(value: Any) -> int:
    """Bytes of every array in a decoded message body (what its size bound is about)."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, dict):
        return sum(array_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(array_bytes(v) for v in value)
    return 0
