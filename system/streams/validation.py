"""What a message may hold: the layout a run declared, checked before a handler touches the data.

The wire codec (:mod:`system.streams.wire`) guarantees a message is well formed: arrays whose
bytes match their dtype and shape. It cannot know that a rollout request for a CartPole policy
must carry ``[B, 4]`` float observations, or that a sample segment is ``segment_length + 1``
steps long. Without that check one bad message (a wrong shape, a zero-length array, a NaN) gets
as far as ``concatenate`` or ``torch`` and kills the worker that received it.

A :data:`Spec` is the per-row layout of one message field, derived from an example the run builds
itself (what an actor would send for an observation sampled from the space, what the policy
answers to it, what ``get_checkpoint`` returns): a :class:`Leaf` for an array, a dict of specs
for a NamedArray, :class:`Tree` for a plain dict (checkpoints), :class:`Maybe` for a field that
may also be None. :func:`check` raises WireError naming the field, so handlers count and drop
the message like any other malformed one.

Why dtypes are matched by kind, not exactly: environments that return float64 observations for a
float32 space work today (the policy casts), and refusing them would stop a run that learns. A
value of the same kind (float for float, any integer or bool for an integer) at most
:data:`MAX_ITEMSIZE` bytes wide is accepted; :func:`max_bytes` assumes that width for every
element, so every message the checks accept also fits under the socket's size bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from api.errors import PipelineCheckError
from api.namedarray import NamedArray
from system.errors import WireError

MAX_ITEMSIZE = 8
"""Widest element accepted in place of a declared one (bytes)."""
HEADROOM_BYTES = 1 << 20
"""Added to every declared message size for the header, envelope and scalars (1 MiB)."""
TRAINER_STATE_VALUES = 3
"""Values per checkpoint element a trainer's own state may hold (at :data:`MAX_ITEMSIZE` bytes
each), shipped to the parameter service with every persisted version: Adam keeps two moments
per parameter, three with amsgrad. Its size cannot be declared from a freshly built trainer
(optimisers make their state at the first step), so it is bounded by the checkpoint's size."""


@dataclass(frozen=True)
class Leaf:
    """An array: its shape after the leading (batch or time) dimensions, and its dtype."""

    shape: tuple[int, ...]
    dtype: np.dtype
    finite: bool = True
    """Floats must hold no NaN or infinity."""


@dataclass(frozen=True)
class Maybe:
    """A field that is either None or laid out as ``spec``."""

    spec: Any


@dataclass(frozen=True)
class Tree:
    """A plain dict (a checkpoint): exactly these keys, each with its spec."""

    items: dict[str, Any]


@dataclass(frozen=True)
class Scalar:
    """A Python scalar of this type (a checkpoint's ``version``, say)."""

    kind: type


Spec = Leaf | Maybe | Tree | Scalar | dict | None


def spec_of(example: Any, lead: int, *, finite: bool = True) -> Spec:
    """The spec of ``example``, whose arrays have ``lead`` leading dimensions to drop."""
    if example is None:
        return None
    if isinstance(example, NamedArray):
        return {k: spec_of(v, lead, finite=finite) for k, v in example.items()}
    if isinstance(example, dict):
        return Tree({k: spec_of(v, lead, finite=finite) for k, v in example.items()})
    if isinstance(example, (np.ndarray, np.generic)):
        array = np.asarray(example)
        return Leaf(tuple(array.shape[lead:]), array.dtype, finite)
    if isinstance(example, (bool, int, float, str)):
        return Scalar(bool if isinstance(example, bool) else type(example))
    raise TypeError(f"no message spec for a value of type {type(example).__name__}")


def check(value: Any, spec: Spec, lead: tuple[int, ...], path: str) -> None:
    """Raise WireError unless ``value`` is laid out as ``spec`` with leading shape ``lead``."""
    if isinstance(spec, Maybe):
        if value is not None:
            check(value, spec.spec, lead, path)
    elif spec is None:
        if value is not None:
            raise WireError(f"{path} must be None, got {type(value).__name__}")
    elif isinstance(spec, Leaf):
        _check_leaf(value, spec, lead, path)
    elif isinstance(spec, Scalar):
        if type(value) is not spec.kind and not (spec.kind is float and type(value) is int):
            raise WireError(f"{path} must be a {spec.kind.__name__}, got {type(value).__name__}")
    elif isinstance(spec, Tree):
        if not isinstance(value, dict):
            raise WireError(f"{path} must be a mapping, got {type(value).__name__}")
        _check_keys(value.keys(), spec.items, path)
        for k, sub in spec.items.items():
            check(value[k], sub, lead, f"{path}.{k}")
    else:
        if not isinstance(value, NamedArray):
            raise WireError(f"{path} must be a NamedArray, got {type(value).__name__}")
        _check_keys(value.keys(), spec, path)
        for k, sub in spec.items():
            check(value[k], sub, lead, f"{path}.{k}")


def _check_keys(got, declared: dict, path: str) -> None:
    got = set(got)
    if got != set(declared):
        missing, extra = sorted(set(declared) - got), sorted(got - set(declared))
        raise WireError(f"{path} has fields {sorted(got)}; missing {missing}, unexpected {extra}")


def _check_leaf(value: Any, spec: Leaf, lead: tuple[int, ...], path: str) -> None:
    if not isinstance(value, (np.ndarray, np.generic)):
        raise WireError(f"{path} must be an array, got {type(value).__name__}")
    shape = (*lead, *spec.shape)
    if value.shape != shape:
        raise WireError(f"{path} has shape {value.shape}, declared {shape}")
    if not _kind_fits(value.dtype, spec.dtype):
        raise WireError(f"{path} has dtype {value.dtype}, declared {spec.dtype}")
    if spec.finite and value.dtype.kind == "f" and not np.isfinite(value).all():
        raise WireError(f"{path} holds NaN or infinite values")


def _kind_fits(got: np.dtype, declared: np.dtype) -> bool:
    if got == declared:
        return True
    if got.itemsize > MAX_ITEMSIZE or got.kind not in "biuf":
        return False
    return bool(np.can_cast(got, declared, casting="same_kind"))


def elements(spec: Spec) -> int:
    """Array elements per leading index (per row, or per step and segment)."""
    if isinstance(spec, Maybe):
        return elements(spec.spec)
    if isinstance(spec, Leaf):
        return math.prod(spec.shape)
    if isinstance(spec, Tree):
        return sum(elements(s) for s in spec.items.values())
    if isinstance(spec, dict):
        return sum(elements(s) for s in spec.values())
    return 0


def max_bytes(spec: Spec, rows: int) -> int:
    """The largest message of ``rows`` leading indices that :func:`check` can accept, plus
    :data:`HEADROOM_BYTES`: the size bound of the socket that receives such messages."""
    return rows * elements(spec) * MAX_ITEMSIZE + HEADROOM_BYTES


@dataclass(frozen=True)
class RequestLayout:
    """What a policy worker accepts: rollout requests of 1 to ``max_rows`` rows, each row laid
    out as ``row`` (a spec of :class:`~api.policy.RolloutRequest`)."""

    row: dict
    max_rows: int

    def check(self, request: NamedArray) -> None:
        rows = _leading(request, "on_reset", 0)
        if not 1 <= rows <= self.max_rows:
            raise WireError(f"rollout request has {rows} rows, this run sends 1 to {self.max_rows}")
        check(request, self.row, (rows,), "request")

    @property
    def max_message_bytes(self) -> int:
        return max_bytes(self.row, self.max_rows)


@dataclass(frozen=True)
class SegmentLayout:
    """What a trainer accepts: chunks of 1 to ``max_segments`` segments of ``length`` steps,
    each step laid out as ``step`` (a spec of :class:`~api.policy.SampleBatch`)."""

    step: dict
    length: int
    max_segments: int

    def check(self, segment: NamedArray) -> None:
        count = _leading(segment, "reward", 1)
        if not 1 <= count <= self.max_segments:
            raise WireError(
                f"sample chunk holds {count} segments, this run sends 1 to {self.max_segments}"
            )
        check(segment, self.step, (self.length, count), "segment")

    @property
    def max_message_bytes(self) -> int:
        return max_bytes(self.step, self.length * self.max_segments)


@dataclass(frozen=True)
class PriorityLayout:
    """What a replay worker accepts: requests handing back the priorities of at most
    ``max_rows`` transitions (the batch its trainer trained on last)."""

    max_rows: int

    def check(self, keys: np.ndarray) -> None:
        if len(keys) > self.max_rows:
            raise WireError(
                f"replay request hands back {len(keys)} priorities, this run's batches hold "
                f"{self.max_rows}"
            )

    @property
    def max_message_bytes(self) -> int:
        return max_bytes(PRIORITIES, self.max_rows)


PRIORITIES = {"keys": Leaf((), np.dtype(np.int64)), "priorities": Leaf((), np.dtype(np.float64))}
"""One row of a replay request: a transition's buffer key and its new priority."""


@dataclass(frozen=True)
class BatchLayout:
    """What a trainer accepts from its replay worker: batches of ``rows`` transitions, each
    laid out as ``row`` (a spec of :class:`~api.replay.TransitionBatch`)."""

    row: dict
    rows: int

    @property
    def max_message_bytes(self) -> int:
        return max_bytes(self.row, self.rows)


def _leading(value: NamedArray, field: str, axis: int) -> int:
    """The size of ``axis`` of one field, which every other field is then checked against."""
    leaf = getattr(value, field, None)
    if not isinstance(leaf, np.ndarray) or leaf.ndim <= axis:
        raise WireError(f"'{field}' must be an array with at least {axis + 1} dimensions")
    return int(leaf.shape[axis])


@dataclass(frozen=True)
class ParamsLayout:
    """What the parameter service stores: per declared policy, checkpoints laid out as its spec
    (the structure ``get_checkpoint`` returns: the same keys, shapes and dtypes every version)."""

    policies: dict[str, Spec]

    def check(self, policy: str, params: Any) -> None:
        spec = self.policies.get(policy)
        if spec is None:
            trained = sorted(self.policies)
            raise WireError(f"policy '{policy}' is not trained in this run (trained: {trained})")
        check(params, spec, (), f"parameters of '{policy}'")

    def max_trainer_state_bytes(self, policy: str) -> int:
        """The most bytes of arrays a trainer's own state of ``policy`` may hold."""
        spec = self.policies.get(policy)
        return 0 if spec is None else TRAINER_STATE_VALUES * elements(spec) * MAX_ITEMSIZE

    @property
    def max_message_bytes(self) -> int:
        """A publish that persists a version carries the trainer's own state as well: the
        largest message is a checkpoint and that state (see :data:`TRAINER_STATE_VALUES`)."""
        return max(
            (max_bytes(s, 1 + TRAINER_STATE_VALUES) for s in self.policies.values()),
            default=HEADROOM_BYTES,
        )


def check_action(policy: str, agent: int, action: Any, space: Any) -> None:
    """Raise PipelineCheckError unless ``action`` (a policy's answer for ``agent``) fits its
    action space: a Box action by shape only (Gaussian samples may leave the bounds)."""
    if isinstance(space, gym.spaces.Box):
        fits = np.shape(action) == space.shape
    else:
        fits = space.contains(action)
    if not fits:
        raise PipelineCheckError(
            f"policy '{policy}' answered agent {agent} with action {action!r} "
            f"(shape {np.shape(action)}, dtype {getattr(action, 'dtype', type(action))}), "
            f"which is not in its action space {space}; make rollout() return one row "
            "per request with actions shaped like action_space.sample()"
        )


Bounds = tuple[np.ndarray, np.ndarray, np.dtype]


def action_bounds(spaces: Sequence[Any]) -> list[Bounds | None] | None:
    """Each agent's Box bounds (None for another space); None when no agent acts in a Box."""
    bounds = [
        (space.low, space.high, space.dtype) if isinstance(space, gym.spaces.Box) else None
        for space in spaces
    ]
    return bounds if any(b is not None for b in bounds) else None


def fit_actions(actions: list[Any], bounds: list[Bounds | None] | None) -> list[Any]:
    """``actions`` with every Box action clipped into its bounds, as the environment gets them.
    A Gaussian policy samples past them (and trains on the sample it drew); the gymnasium
    adapter clipped, but an environment of one's own got the raw sample (|a| 2.5 in a [-1, 1]
    box, 16 steps of 50)."""
    if bounds is None:
        return actions
    return [
        a if b is None or a is None else np.clip(np.asarray(a, dtype=b[2]), b[0], b[1])
        for a, b in zip(actions, bounds, strict=True)
    ]
