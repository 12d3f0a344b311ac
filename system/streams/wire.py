"""The wire codec: how every message on every Troupe socket is laid out.

A message is a list of frames::

    [*envelope, b"", header, array_0, array_1, ...]

- ``envelope``: routing frames, possibly none. A ROUTER socket prepends the peer's identity; a
  PUB/XPUB socket uses one topic frame. Envelope frames are never empty (ZeroMQ identities and our
  topics are non-empty), so the first empty frame is always the delimiter.
- ``b""``: the delimiter. It is sent even when the envelope is empty, so that one parser serves
  every socket type (DEALER, ROUTER, PAIR, PUB/SUB) and a message without it is refused as foreign.
- ``header``: msgpack of ``{"v": PROTOCOL_VERSION, "k": kind, "b": body}`` where arrays in the
  body were replaced by placeholders ``{"__nd__": frame_index, "dtype": "<f4", "shape": [..]}``.
  A small array travels inside its placeholder instead: ``"__nd__"`` then holds its raw bytes
  (msgpack bin, C order) rather than a frame index.
- ``array_i``: the raw bytes of each array not sent inline, C order, one frame each.

Why small arrays go inline: every ZeroMQ frame costs a few microseconds of CPU on each side
(measured ~3 us a frame to send and again to receive, on this project's 2-core VM), which for an
inference request of a few rows is more than the bytes themselves; one header frame carrying them
halves the cost of the messages actors and policy workers exchange thousands of times a second.
Arrays of at least ``INLINE_MAX_BYTES`` (and any once ``INLINE_BUDGET_BYTES`` of a message went
inline) keep a frame of their own, so large data is never copied into the header.

Nothing on the wire is ever unpickled and no class is looked up by a name a peer sends:
NamedArrays come back as generic ``NamedArray(**fields)``.

Zero copy: :func:`encode` returns array frames as views onto the caller's arrays, and
``transport.send`` (:mod:`system.streams.transport`) hands them to
``send_multipart(copy=False)``. pyzmq still copies frames smaller than ``socket.copy_threshold``
(64 KiB by default), because below that size the bookkeeping of a zero-copy frame costs more than
the copy; above it the buffer goes to ZeroMQ as is. The price of
zero copy: the caller must not modify an array until the peer has it (a reply or ack proves that),
or must send a snapshot.

On receive, decoded arrays are read-only views onto the received frames (``writeable=False``);
pass ``copy=True`` to :func:`decode` (or ``transport.recv``) to get writable arrays of one's own.

The sockets that carry these messages (sending, receiving, the process's ZeroMQ context, socket
options, CURVE from the environment) are :mod:`system.streams.transport`'s.

Longer than 400 lines because it is the format's specification and its strict decoder; keeping every
rule next to the check that enforces it is the point.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import zmq

from api.namedarray import NamedArray, is_field_name
from system.errors import WireError

PROTOCOL_VERSION = 1
MAX_DEPTH = 32
"""Deepest nesting of containers allowed in a body, on encode and on decode."""
MAX_NDIM = 32
ZERO_COPY_THRESHOLD = zmq.COPY_THRESHOLD
"""Frames at least this large (bytes) travel without a copy; smaller ones are copied by pyzmq."""
INLINE_MAX_BYTES = 8 * 1024
"""Arrays smaller than this (bytes) travel inside the header, not in a frame of their own."""
INLINE_BUDGET_BYTES = 32 * 1024
"""At most this many bytes of one message's arrays go inline; the rest take frames."""

_ND, _NA, _TU, _SC = "__nd__", "__na__", "__tu__", "__sc__"
_MARKERS = frozenset((_ND, _NA, _TU, _SC))
_ALLOWED_KINDS = frozenset("biufcSU")
_DTYPE_RE = re.compile(r"[<>|=]?(?:[biufc]\d{1,2}|[SU]\d{1,9})")
_HEADER_KEYS = frozenset(("v", "k", "b"))


@dataclass(frozen=True)
class Message:
    """One decoded message: its ``kind`` (what the peer asks or tells) and its ``body``."""

    kind: str
    body: Any


# ------------------------------------------------------------------------------------- encode
def encode(
    kind: str, body: Any, *, inline_budget: int = INLINE_BUDGET_BYTES
) -> list[bytes | np.ndarray]:
    """Frames for ``kind`` and ``body`` (without envelope or delimiter; :func:`send` adds them).

    Small arrays are copied into the header (up to ``inline_budget`` bytes in all; 0 sends every
    array in a frame of its own). Array frames are uint8 views onto the body's arrays (made
    contiguous first if needed), not copies. Raises WireError for anything that cannot travel:
    object dtype arrays, unsupported types, non-string dict keys, reserved keys, integers beyond
    64 bits, nesting deeper than MAX_DEPTH.
    """
    if not isinstance(kind, str) or not kind:
        raise WireError(f"message kind must be a non-empty str, got {kind!r}")
    frames = _Frames([b""])
    frames.inline_left = inline_budget
    tree = _pack(body, frames, 0, "body")
    try:
        frames[0] = msgpack.packb({"v": PROTOCOL_VERSION, "k": kind, "b": tree}, use_bin_type=True)
    except (OverflowError, ValueError, TypeError) as e:
        raise WireError(f"cannot encode message '{kind}': {e}") from e
    return frames


class _Frames(list):
    """The frames of a message being encoded, and how many bytes may still go inline."""

    inline_left: int = 0


def _pack(value: Any, frames: _Frames, depth: int, path: str) -> Any:
    if depth > MAX_DEPTH:
        raise WireError(f"cannot encode {path}: nesting deeper than {MAX_DEPTH} levels")
    t = type(value)
    if value is None or t is bool or t is str or t is float or t is bytes:
        return value
    if t is int:
        if not -(2**63) <= value < 2**64:
            raise WireError(f"cannot encode {path}: integer {value} does not fit in 64 bits")
        return value
    if t is dict:
        return _pack_dict(value, frames, depth, path)
    if t is list:
        return [_pack(v, frames, depth + 1, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, np.ndarray):
        return _pack_array(value, frames, path)
    if isinstance(value, np.generic):
        return _pack_scalar(value, path)
    if isinstance(value, NamedArray):
        fields = {}
        for name, leaf in value.items():
            fields[name] = _pack(leaf, frames, depth + 1, f"{path}.{name}")
        return {_NA: fields}
    if isinstance(value, tuple):
        return {_TU: [_pack(v, frames, depth + 1, f"{path}[{i}]") for i, v in enumerate(value)]}
    if t.__module__.startswith("torch"):
        return _pack_array(_torch_to_numpy(value, path), frames, path)
    if isinstance(value, dict):
        return _pack_dict(value, frames, depth, path)
    if isinstance(value, list):
        return _pack(list(value), frames, depth, path)
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    # Subclasses of the plain types (IntEnum members, str enums) travel as the plain value.
    for plain in (bool, int, float, str):
        if isinstance(value, plain):
            return _pack(plain(value), frames, depth, path)
    raise WireError(f"cannot encode {path}: values of type {t.__qualname__} cannot go on the wire")


def _pack_dict(value: dict, frames: _Frames, depth: int, path: str) -> dict:
    out = {}
    for key, v in value.items():
        if type(key) is not str:
            raise WireError(f"cannot encode {path}: dict keys must be str, got {key!r}")
        if key in _MARKERS:
            raise WireError(f"cannot encode {path}: dict key '{key}' is reserved by the wire codec")
        out[key] = _pack(v, frames, depth + 1, f"{path}[{key!r}]")
    return out


def _check_encodable_dtype(dtype: np.dtype, path: str) -> None:
    if dtype.kind not in _ALLOWED_KINDS or dtype.itemsize == 0:
        raise WireError(
            f"cannot encode {path}: dtype {dtype} is not allowed on the wire (allowed: bool, "
            "integer, float, complex, fixed-size bytes and unicode)"
        )


def _pack_array(value: np.ndarray, frames: _Frames, path: str) -> dict:
    array = np.asarray(value)
    _check_encodable_dtype(array.dtype, path)
    if array.ndim > MAX_NDIM:
        raise WireError(f"cannot encode {path}: {array.ndim} dimensions, at most {MAX_NDIM}")
    nbytes = array.nbytes
    if nbytes < INLINE_MAX_BYTES and nbytes <= frames.inline_left:
        frames.inline_left -= nbytes
        return {_ND: array.tobytes(), "dtype": array.dtype.str, "shape": list(array.shape)}
    contiguous = array if array.flags.c_contiguous else np.ascontiguousarray(array)
    frames.append(contiguous.reshape(-1).view(np.uint8))
    return {_ND: len(frames) - 1, "dtype": array.dtype.str, "shape": list(array.shape)}


def _pack_scalar(value: np.generic, path: str) -> dict:
    _check_encodable_dtype(value.dtype, path)
    return {_SC: value.tobytes(), "dtype": value.dtype.str}


def _torch_to_numpy(value: Any, path: str) -> np.ndarray:
    import torch

    if not isinstance(value, torch.Tensor):
        raise WireError(f"cannot encode {path}: {type(value).__qualname__} is not a tensor")
    try:
        return value.detach().cpu().numpy()
    except (TypeError, RuntimeError) as e:
        raise WireError(f"cannot encode {path}: tensor has no numpy equivalent ({e})") from e


# ------------------------------------------------------------------------------------- decode
def decode(frames: Sequence[Any], *, copy: bool = False) -> Message:
    """Rebuild a Message from its codec frames (no envelope, no delimiter).

    Frames may be bytes, memoryviews, numpy uint8 arrays or ``zmq.Frame`` objects. With
    ``copy=False`` arrays are read-only views onto the frames; with ``copy=True`` they are
    writable copies. Any problem raises WireError saying what was wrong, never another error.
    """
    try:
        return _decode(frames, copy)
    except WireError:
        raise
    except Exception as e:  # a foreign message must never surface as anything but WireError
        raise WireError(f"undecodable message: {type(e).__name__}: {e}") from e


def _decode(frames: Sequence[Any], copy: bool) -> Message:
    if not isinstance(frames, (list, tuple)):
        raise WireError(f"frames must be a list, got {type(frames).__name__}")
    if len(frames) == 0:
        raise WireError("empty message: no header frame")
    views = [_as_view(f) for f in frames]
    try:
        header = msgpack.unpackb(
            views[0], raw=False, strict_map_key=True, use_list=True, ext_hook=_refuse_ext
        )
    except WireError:
        raise
    except Exception as e:
        raise WireError(f"header is not valid msgpack: {e}") from e
    if not isinstance(header, dict):
        raise WireError(f"header is not a map but {type(header).__name__}")
    version = header.get("v")
    if type(version) is not int:
        raise WireError("header has no protocol version 'v'")
    if version != PROTOCOL_VERSION:
        raise WireError(f"protocol version {version} is not supported (this side speaks 1)")
    kind = header.get("k")
    if type(kind) is not str or not kind:
        raise WireError("header has no message kind 'k'")
    if "b" not in header:
        raise WireError("header has no body 'b'")
    extra = set(header) - _HEADER_KEYS
    if extra:
        raise WireError(f"header has unknown keys {sorted(map(str, extra))}")
    used: set[int] = set()
    body = _unpack(header["b"], views, used, 0, copy)
    if len(used) != len(views) - 1:
        unused = sorted(set(range(1, len(views))) - used)
        raise WireError(f"frames {unused} are not referenced by the header")
    return Message(kind, body)


def _as_view(frame: Any) -> memoryview:
    view = frame.buffer if isinstance(frame, zmq.Frame) else memoryview(frame)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    return view


def _refuse_ext(code: int, data: bytes) -> Any:
    raise WireError(f"msgpack extension type {code} is not allowed")


def _unpack(node: Any, frames: list[memoryview], used: set[int], depth: int, copy: bool) -> Any:
    if depth > MAX_DEPTH:
        raise WireError(f"body nested deeper than {MAX_DEPTH} levels")
    t = type(node)
    if node is None or t is bool or t is int or t is float or t is str or t is bytes:
        return node
    if t is list:
        return [_unpack(v, frames, used, depth + 1, copy) for v in node]
    if t is not dict:
        raise WireError(f"value of type {t.__name__} is not allowed in a body")
    if _ND in node:
        return _unpack_array(node, frames, used, copy)
    if _SC in node:
        return _unpack_scalar(node)
    if _TU in node:
        items = _marker(node, _TU, (), list)
        return tuple(_unpack(v, frames, used, depth + 1, copy) for v in items)
    if _NA in node:
        fields = _marker(node, _NA, (), dict)
        for name in fields:
            if not is_field_name(name):
                raise WireError(f"NamedArray field name {name!r} is not allowed")
        return NamedArray(
            **{k: _unpack(v, frames, used, depth + 1, copy) for k, v in fields.items()}
        )
    out = {}
    for key, value in node.items():
        if type(key) is not str:
            raise WireError(f"dict key {key!r} is not a str")
        out[key] = _unpack(value, frames, used, depth + 1, copy)
    return out


def _marker(
    node: dict, marker: str, others: tuple[str, ...], expect: type | tuple[type, ...]
) -> Any:
    if set(node) != {marker, *others}:
        raise WireError(f"'{marker}' entry has keys {sorted(map(str, node))}")
    value = node[marker]
    allowed = expect if isinstance(expect, tuple) else (expect,)
    if type(value) not in allowed:
        names = " or ".join(t.__name__ for t in allowed)
        raise WireError(f"'{marker}' entry holds {type(value).__name__}, not {names}")
    return value


_dtype_cache: dict[str, np.dtype] = {}


def _wire_dtype(text: Any) -> np.dtype:
    """The dtype a header names, checked once per distinct string (there are only a few)."""
    dtype = _dtype_cache.get(text) if type(text) is str else None
    if dtype is None:
        dtype = _parse_dtype(text)
        if len(_dtype_cache) < 256:
            _dtype_cache[text] = dtype
    return dtype


def _parse_dtype(text: Any) -> np.dtype:
    if type(text) is not str or not _DTYPE_RE.fullmatch(text):
        raise WireError(f"dtype {text!r} is not allowed on the wire")
    try:
        dtype = np.dtype(text)
    except TypeError as e:
        raise WireError(f"dtype {text!r} is not a valid numpy dtype") from e
    if dtype.kind not in _ALLOWED_KINDS or dtype.itemsize == 0:
        raise WireError(f"dtype {text!r} is not allowed on the wire")
    return dtype


def _unpack_array(node: dict, frames: list[memoryview], used: set[int], copy: bool) -> np.ndarray:
    index = _marker(node, _ND, ("dtype", "shape"), (int, bytes))
    dtype = _wire_dtype(node["dtype"])
    shape, count = _wire_shape(node["shape"])
    if type(index) is bytes:
        frame, where = index, "inline array"
    else:
        if not 1 <= index < len(frames):
            raise WireError(f"array refers to frame {index}, message has {len(frames)} frames")
        if index in used:
            raise WireError(f"frame {index} is referenced twice")
        used.add(index)
        frame, where = frames[index], f"frame {index}"
    if len(frame) != count * dtype.itemsize:
        raise WireError(
            f"{where} holds {len(frame)} bytes, dtype {dtype.str} shape {shape} "
            f"needs {count * dtype.itemsize}"
        )
    array = np.frombuffer(frame, dtype=dtype, count=count).reshape(shape)
    if dtype.kind == "b" and type(frame) is bytes:
        if frame.translate(None, b"\x00\x01"):  # C speed on the small inline case
            raise WireError("bool array holds bytes other than 0 and 1")
    elif dtype.kind in "bU":
        _check_values(array)
    if copy:
        return array.copy()
    if type(frame) is not bytes:  # arrays over bytes are read-only already
        array.flags.writeable = False
    return array


def _wire_shape(shape: Any) -> tuple[tuple[int, ...], int]:
    """The shape a header names, and its element count."""
    if type(shape) is not list or len(shape) > MAX_NDIM:
        raise WireError(f"array shape {shape!r} is not a list of at most {MAX_NDIM} sizes")
    for d in shape:
        if type(d) is not int or not 0 <= d < 2**62:
            raise WireError(f"array shape {shape!r} has a size that is not a non-negative int")
    return tuple(shape), math.prod(shape)


def _unpack_scalar(node: dict) -> np.generic:
    data = _marker(node, _SC, ("dtype",), bytes)
    dtype = _wire_dtype(node["dtype"])
    if len(data) != dtype.itemsize:
        raise WireError(
            f"scalar of dtype {dtype.str} needs {dtype.itemsize} bytes, has {len(data)}"
        )
    array = np.frombuffer(data, dtype=dtype, count=1)
    _check_values(array)
    return array[0]


def _check_values(array: np.ndarray) -> None:
    """Refuse bytes that numpy would accept but that no honest sender can produce."""
    if array.size == 0:
        return
    if array.dtype.kind == "b" and bool((array.reshape(-1).view(np.uint8) > 1).any()):
        raise WireError("bool array holds bytes other than 0 and 1")
    if array.dtype.kind == "U":
        codes = array.reshape(-1).view(np.dtype(array.dtype.byteorder + "u4"))
        if bool((codes > 0x10FFFF).any()):
            raise WireError("unicode array holds invalid code points")
