"""The sockets every Troupe message travels on: send and receive one message in the wire format
(:mod:`system.streams.wire`), the process's ZeroMQ context, the options every socket states, and
CURVE security from the environment.

Kept apart from the codec: the format is a specification that peers in other languages could
implement from :mod:`~system.streams.wire` alone, while this module is how this process uses
ZeroMQ (a context per process, rebuilt after a fork; zero copy only where it pays).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import zmq

from system.errors import WireError
from system.streams.wire import ZERO_COPY_THRESHOLD, Message, decode, encode


def send(
    socket: zmq.Socket,
    kind: str,
    body: Any,
    *,
    flags: int = 0,
    envelope: Sequence[bytes] = (),
    copy: bool = False,
) -> None:
    """Encode and send one message: ``[*envelope, b"", header, *arrays]``.

    Large array frames go without a copy (see the module docstring for the rule this imposes)
    unless ``copy``: then ZeroMQ has its own copy when this returns, and the sender may change
    the arrays at once (a message that is not waited for).
    """
    frames = [*envelope, b"", *encode(kind, body)]
    # Zero-copy has a fixed cost per frame (a tracked zmq.Frame); it only pays for large ones.
    large = any(_nbytes(f) >= ZERO_COPY_THRESHOLD for f in frames)
    socket.send_multipart(frames, flags=flags, copy=copy or not large)


def _nbytes(frame: Any) -> int:
    return frame.nbytes if isinstance(frame, np.ndarray) else len(frame)


def split(parts: Sequence[Any], *, copy: bool = False) -> tuple[list[bytes], Message]:
    """Split received frames at the delimiter into (envelope, decoded Message)."""
    for i, part in enumerate(parts):
        if len(part) == 0:
            envelope = [p.bytes if isinstance(p, zmq.Frame) else bytes(p) for p in parts[:i]]
            return envelope, decode(list(parts[i + 1 :]), copy=copy)
    raise WireError(f"message of {len(parts)} frames has no empty delimiter frame")


def recv(
    socket: zmq.Socket, *, timeout_ms: int, copy: bool = False, zero_copy: bool = False
) -> tuple[list[bytes], Message] | None:
    """Wait up to ``timeout_ms`` for one message; None if none came, WireError if malformed.

    A malformed message has been consumed when WireError is raised, so the caller can count it
    and go on. ``copy``: decoded arrays are writable copies. ``zero_copy``: receive frames without
    copying them out of ZeroMQ (pays for large messages such as weights; small ones are faster
    copied, which is the default).
    """
    if timeout_ms < 0:
        raise ValueError("every receive needs a timeout: timeout_ms must be >= 0")
    if not socket.poll(timeout_ms, zmq.POLLIN):
        return None
    try:
        parts = socket.recv_multipart(zmq.NOBLOCK, copy=not zero_copy)
    except zmq.Again:
        return None
    return split(parts, copy=copy)


def socket_options(sock: zmq.Socket, *, hwm: int = 1000, linger: int = 0) -> zmq.Socket:
    """Set the options every Troupe socket states explicitly; returns ``sock``.

    ``hwm`` bounds the messages queued per peer in each direction; ``linger=0`` makes close()
    drop unsent messages instead of blocking the process on exit.
    """
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.LINGER, linger)
    return sock


_context: zmq.Context | None = None
_context_pid: int | None = None
_context_lock = threading.Lock()


def _reset_lock_in_child() -> None:
    # A fork taken while another thread held the lock would leave the child's copy held forever.
    global _context_lock
    _context_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_lock_in_child)


def context() -> zmq.Context:
    """The one ZeroMQ context of this process.

    Keyed on the process id: a child made by fork must not use its parent's context (its I/O
    threads did not survive the fork), so a new one is made there and the inherited one is left
    alone, neither used nor terminated.
    """
    global _context, _context_pid
    with _context_lock:
        pid = os.getpid()
        if _context is None or _context_pid != pid or _context.closed:
            _context = zmq.Context()
            _context_pid = pid
        return _context


def make_socket(
    kind: int,
    *,
    server: bool,
    hwm: int = 1000,
    linger: int = 0,
    max_message_bytes: int | None = None,
) -> zmq.Socket:
    """A socket of this process's context with Troupe's options, and CURVE when it is on.

    ``server``: this socket binds (and presents the run's server key); otherwise it connects.
    Every socket in the runtime is made here, so none can be left unauthenticated in a cluster.
    ``max_message_bytes``: ZeroMQ's ``MAXMSGSIZE``, the largest message a peer may send (None:
    no bound). ZeroMQ reads the size a peer claims before it allocates, and disconnects a peer
    that claims more, so an oversized message never costs this process its memory. Set it on
    every socket that binds, from the largest message the run can legally send there: options
    are copied when the socket binds, so it cannot be changed afterwards.
    """
    from system.streams import security

    sock = socket_options(context().socket(kind), hwm=hwm, linger=linger)
    if max_message_bytes is not None:
        sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    if server:
        security.secure_server(sock)
    else:
        security.secure_client(sock)
    return sock


def secure_from_environment() -> bool:
    """Turn CURVE on if the environment carries run keys; return whether it is on."""
    from system.streams import security

    keys = security.keys_from_environment()
    if keys is not None:
        security.enable(keys, context())
    return keys is not None
