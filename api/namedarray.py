"""NamedArray: a nested, named structure of arrays that shares one leading batch dimension.

Everything the runtime moves around (rollout requests and results, policy states, sample batches)
is a NamedArray, so that one indexing expression selects the same rows of every field, and one
``stack`` turns many per-step records into a batch.

Declare a structure with the ``@namedarray`` decorator (or by subclassing ``NamedArray`` and
listing annotations)::

    @namedarray
    class PolicyState:
        hx: np.ndarray

    @namedarray
    class Step:
        obs: np.ndarray
        state: PolicyState | None = None   # nested, and may be None

    s = Step(obs=np.zeros((4, 3)), state=PolicyState(hx=np.zeros((4, 8))))
    s.obs.shape, s["obs"].shape     # attribute and item access
    s[1:3], s[np.array([0, 2])]     # index every leaf, get a Step back
    stack([s[0], s[1]])             # many -> one batch

Leaves are numpy arrays (torch tensors work too for ``apply`` and indexing) or ``None``.
Serialisation is not the class's business: the wire codec in ``system`` encodes a NamedArray as
its tree of fields and decodes it into a generic ``NamedArray``. :meth:`NamedArray.flatten` and
:func:`from_flat` give a flat ``{"a.b": leaf}`` view for code that wants one.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from api.errors import NamedArrayError

T = TypeVar("T", bound="NamedArray")

_MISSING = object()


def is_field_name(name: Any) -> bool:
    """Whether ``name`` may name a field: an identifier not starting with ``_`` (underscores
    are the class's own attributes). The wire codec refuses any other name in a message."""
    return type(name) is str and name.isidentifier() and not name.startswith("_")


class NamedArray:
    """Base class. A subclass declares its fields with annotations; this class itself takes any.

    A plain ``NamedArray(a=..., b=...)`` has exactly the fields it was built with; the wire codec
    decodes into such generic instances, so a peer never makes us import a class by name.
    """

    _fields: tuple[str, ...] = ()
    _defaults: dict[str, Any] = {}
    _declared: bool = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        names = [n for n in _own_annotations(cls) if not n.startswith("_")]
        inherited = [f for f in cls._fields if f not in names]
        cls._fields = tuple(inherited + names)
        defaults = dict(cls._defaults)
        for name in names:
            value = cls.__dict__.get(name, _MISSING)
            if value is not _MISSING:
                defaults[name] = value
                delattr(cls, name)  # the instance's value lives in _data, not on the class
        cls._defaults = defaults
        cls._declared = True

    def __init__(self, *args, **fields):
        data: dict[str, Any] = {}
        if self._declared:
            if len(args) > len(self._fields):
                raise NamedArrayError(
                    f"{type(self).__name__} takes {len(self._fields)} fields, got {len(args)} "
                    "positional values"
                )
            for name, value in zip(self._fields, args):
                fields[name] = value
            unknown = sorted(set(fields) - set(self._fields))
            if unknown:
                raise NamedArrayError(
                    f"{type(self).__name__} has no field {', '.join(map(repr, unknown))}; "
                    f"declared fields are {list(self._fields)}"
                )
            for name in self._fields:
                data[name] = fields.get(name, self._defaults.get(name))
        else:
            if args:
                raise NamedArrayError("a generic NamedArray takes keyword fields only")
            data.update(fields)
        object.__setattr__(self, "_data", data)

    # ----------------------------------------------------------------- field access
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        data = self.__dict__.get("_data")
        if data is not None and name in data:
            return data[name]
        raise AttributeError(f"{type(self).__name__} has no field '{name}'; fields: {self.keys()}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._data:
            raise NamedArrayError(
                f"cannot assign undeclared field '{name}' on {type(self).__name__}; "
                f"declared fields are {self.keys()}"
            )
        self._data[name] = value

    def __getitem__(self, key):
        if isinstance(key, str):
            if key not in self._data:
                raise KeyError(f"{type(self).__name__} has no field '{key}'; fields: {self.keys()}")
            return self._data[key]
        return self._rebuild({k: _index(v, key) for k, v in self._data.items()})

    def __setitem__(self, key, value) -> None:
        if isinstance(key, str):
            setattr(self, key, value)
            return
        if not isinstance(value, NamedArray):
            raise NamedArrayError(
                f"assigning rows of {type(self).__name__} needs a NamedArray, got {type(value)}"
            )
        for name, leaf in self._data.items():
            other = value._data.get(name, _MISSING)
            if other is _MISSING:
                raise NamedArrayError(f"assigned value has no field '{name}'")
            if leaf is None:
                continue
            if isinstance(leaf, NamedArray):
                leaf[key] = other
            else:
                leaf[key] = other

    def keys(self) -> list[str]:
        return list(self._data.keys())

    def values(self) -> list[Any]:
        return list(self._data.values())

    def items(self) -> list[tuple[str, Any]]:
        return list(self._data.items())

    def __contains__(self, name: str) -> bool:
        return name in self._data

    def __len__(self) -> int:
        for _, leaf in self.flatten():
            return len(leaf)
        raise TypeError(f"{type(self).__name__} with only None fields has no length")

    # ----------------------------------------------------------------- structure
    @property
    def shape(self) -> dict[str, Any]:
        """Shape of every field (nested dict for nested fields, None for None fields)."""
        return {
            k: v.shape if isinstance(v, NamedArray) else (None if v is None else tuple(v.shape))
            for k, v in self._data.items()
        }

    @property
    def dtype(self) -> dict[str, Any]:
        """Dtype of every field (nested dict for nested fields, None for None fields)."""
        return {
            k: v.dtype if isinstance(v, NamedArray) else (None if v is None else v.dtype)
            for k, v in self._data.items()
        }

    def flatten(self, prefix: str = "") -> list[tuple[str, Any]]:
        """Every non-None leaf as ``("a.b.c", array)``, in field order."""
        out: list[tuple[str, Any]] = []
        for name, value in self._data.items():
            path = f"{prefix}{name}"
            if isinstance(value, NamedArray):
                out.extend(value.flatten(path + "."))
            elif value is not None:
                out.append((path, value))
        return out

    def structure(self) -> dict[str, Any]:
        """The tree of field names, with None for leaves: what ``from_flat`` needs to rebuild."""
        return {
            k: v.structure() if isinstance(v, NamedArray) else None for k, v in self._data.items()
        }

    def apply(self: T, fn: Callable[[Any], Any]) -> T:
        """A new NamedArray of the same type with ``fn`` applied to every non-None leaf."""
        return self._rebuild(
            {
                k: v.apply(fn) if isinstance(v, NamedArray) else (None if v is None else fn(v))
                for k, v in self._data.items()
            }
        )

    def to_dict(self) -> dict[str, Any]:
        """Nested plain dicts of leaves (the leaves themselves are not copied)."""
        return {k: v.to_dict() if isinstance(v, NamedArray) else v for k, v in self._data.items()}

    @classmethod
    def from_dict(cls: type[T], d: dict[str, Any]) -> T:
        """Build from nested dicts; nested declared types are rebuilt from the annotations."""
        hints = _field_types(cls)
        fields = {}
        for k, v in d.items():
            if isinstance(v, dict):
                sub = hints.get(k)
                fields[k] = (sub if sub is not None else NamedArray).from_dict(v)
            else:
                fields[k] = v
        return cls(**fields)

    def _rebuild(self: T, data: dict[str, Any]) -> T:
        obj = type(self).__new__(type(self))
        object.__setattr__(obj, "_data", data)
        return obj

    def __repr__(self) -> str:
        parts = []
        for k, v in self._data.items():
            if isinstance(v, NamedArray) or v is None:
                parts.append(f"{k}={v!r}")
            else:
                parts.append(f"{k}=<{getattr(v, 'dtype', type(v).__name__)} {tuple(v.shape)}>")
        return f"{type(self).__name__}({', '.join(parts)})"

    # Pickle/torch.save support: the custom __getattr__ must not see a half-built object.
    def __getstate__(self):
        return self._data

    def __setstate__(self, state):
        object.__setattr__(self, "_data", state)


def namedarray(cls: type) -> type[NamedArray]:
    """Decorator: turn an annotated class into a NamedArray subclass with those fields."""
    namespace = {k: v for k, v in cls.__dict__.items() if k not in ("__dict__", "__weakref__")}
    return type(cls.__name__, (NamedArray, *_bases(cls)), namespace)


def _bases(cls: type) -> tuple[type, ...]:
    return tuple(b for b in cls.__bases__ if b is not object and not issubclass(b, NamedArray))


def _own_annotations(cls: type) -> list[str]:
    return list(inspect.get_annotations(cls).keys())


@functools.cache
def _field_types(cls: type) -> dict[str, type[NamedArray] | None]:
    """Map field name to its NamedArray type where the annotation names one (once a class:
    resolving the hints costs ~50 us, and :meth:`NamedArray.from_dict` builds an actor's
    every dict observation). Read it, never change it: the dict is shared."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # annotations naming local types cannot always be resolved
        return {}
    out: dict[str, type[NamedArray] | None] = {}
    for name, hint in hints.items():
        candidates = typing.get_args(hint) or (hint,)
        for c in candidates:
            if isinstance(c, type) and issubclass(c, NamedArray):
                out[name] = c
                break
    return out


def _index(value: Any, key: Any) -> Any:
    if value is None:
        return None
    return value[key]


# --------------------------------------------------------------------- many -> one
def stack(items: Sequence[T], axis: int = 0) -> T:
    """Stack NamedArrays of the same structure along a new axis (default: a new batch axis)."""
    return _combine(items, np.stack, "stack", axis)


def concatenate(items: Sequence[T], axis: int = 0) -> T:
    """Concatenate NamedArrays of the same structure along an existing axis."""
    return _combine(items, np.concatenate, "concatenate", axis)


def _combine(items: Sequence[T], fn: Callable, verb: str, axis: int, path: str = "") -> T:
    if len(items) == 0:
        raise NamedArrayError(f"cannot {verb} an empty list of NamedArrays")
    first = items[0]
    for i, other in enumerate(items[1:], start=1):
        if other.keys() != first.keys():
            raise NamedArrayError(
                f"cannot {verb}{_at(path)}: entry 0 has fields {first.keys()}, "
                f"entry {i} has fields {other.keys()}"
            )
    data = {}
    for name in first._data:
        field_path = f"{path}{name}"
        values = [it._data[name] for it in items]
        nones = [v is None for v in values]
        if all(nones):
            data[name] = None
        elif any(nones):
            raise NamedArrayError(
                f"cannot {verb} field '{field_path}': it is None in entry {nones.index(True)} "
                f"but not in entry {nones.index(False)}"
            )
        elif isinstance(values[0], NamedArray):
            data[name] = _combine(values, fn, verb, axis, field_path + ".")
        else:
            data[name] = _combine_leaves(values, fn, verb, axis, field_path)
    return first._rebuild(data)


def _combine_leaves(values: list, fn: Callable, verb: str, axis: int, path: str):
    if _is_torch(values[0]):
        import torch

        tfn = torch.stack if fn is np.stack else torch.cat
        return tfn(list(values), dim=axis)
    arrays = [np.asarray(v) for v in values]
    ref = arrays[0].shape
    for i, a in enumerate(arrays[1:], start=1):
        mismatch = a.shape != ref if fn is np.stack else _concat_mismatch(a.shape, ref, axis)
        if mismatch:
            raise NamedArrayError(
                f"cannot {verb} field '{path}': entry 0 has shape {ref}, entry {i} has shape "
                f"{a.shape}"
            )
    return fn(arrays, axis=axis)


def _concat_mismatch(a: tuple, b: tuple, axis: int) -> bool:
    if len(a) != len(b) or len(a) == 0:
        return True
    ax = axis % len(a)
    return any(x != y for d, (x, y) in enumerate(zip(a, b)) if d != ax)


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch")


def _at(path: str) -> str:
    return f" at '{path.rstrip('.')}'" if path else ""


# --------------------------------------------------------------------- flat form
def from_flat(structure: dict[str, Any], leaves: dict[str, Any], prefix: str = "") -> NamedArray:
    """Rebuild a generic NamedArray from :meth:`NamedArray.structure` and flattened leaves."""
    fields = {}
    for name, sub in structure.items():
        path = f"{prefix}{name}"
        if isinstance(sub, dict):
            fields[name] = from_flat(sub, leaves, path + ".")
        else:
            fields[name] = leaves.get(path)
    return NamedArray(**fields)
