"""The control channel's messages: one frozen dataclass per kind, and their checks.

Worker -> controller: :class:`Hello`, :class:`Register`, :class:`Lookup`, :class:`Ready`,
:class:`Heartbeat`, :class:`Error`, :class:`Signalled`, :class:`Bye`, :class:`StateWrite`.
Controller -> worker: :class:`Configure`, :class:`LookupResult`, :class:`Ack` (one per
heartbeat), :class:`Moved`, :class:`Stop`, :class:`StateResult`, :class:`Refused`.

Every kind is spelled once, here: a sender builds the dataclass and :func:`send` puts its
``kind`` and :meth:`ControlMessage.body` on the wire; a receiver turns what came into one with
:func:`parse`, which raises :class:`WireError` naming the kind and the field for a body that
does not fit (a foreign or broken peer), so a malformed message is counted and dropped the same
way at both ends. Fields are checked against their annotations; a kind with more to check (a
state write's key and value) adds it in its ``from_body``.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, Union

import msgpack
import zmq

from api.global_state import MAX_VALUE_BYTES, GlobalStateError, check_key, check_value
from system.errors import WireError
from system.streams import transport, wire

_MISSING = object()
_M = TypeVar("_M", bound="ControlMessage")


class ControlMessage:
    """The base of every control message: its ``kind`` on the wire, its body, its parser."""

    kind: ClassVar[str]

    def body(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_body(cls: type[_M], body: Any) -> _M:
        if not isinstance(body, dict):
            raise WireError(f"'{cls.kind}' message: the body must be a mapping, got {_short(body)}")
        accepted = _accepted_types(cls)
        unknown = sorted(str(k)[:40] for k in body if k not in accepted)
        if unknown:
            raise WireError(f"'{cls.kind}' message: unknown fields {unknown[:5]}")
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            value = body.get(f.name, _MISSING)
            if value is _MISSING:
                if f.default is dataclasses.MISSING:
                    raise WireError(f"'{cls.kind}' message has no '{f.name}'")
                continue
            kinds = accepted[f.name]
            if kinds is not None and type(value) not in kinds:
                wanted = " or ".join(_a(k) for k in kinds if not (k is int and float in kinds))
                got = _short(value)
                raise WireError(f"'{cls.kind}' message: '{f.name}' must be {wanted}, got {got}")
            values[f.name] = value
        return cls(**values)


def _short(value: Any) -> str:
    """A received value as an error names it: a peer's junk may be megabytes."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _a(kind: type) -> str:
    """A type as an error message names it: "an int", "a str", "None"."""
    if kind is type(None):
        return "None"
    article = "an" if kind.__name__[0] in "aeiou" else "a"
    return f"{article} {kind.__name__}"


@functools.cache
def _accepted_types(cls: type) -> dict[str, tuple[type, ...] | None]:
    """Per field, the exact types its annotation accepts (None: anything, for ``Any``)."""
    hints = typing.get_type_hints(cls)
    return {f.name: _types_of(hints[f.name]) for f in dataclasses.fields(cls)}


def _types_of(hint: Any) -> tuple[type, ...] | None:
    if hint is Any:
        return None
    if typing.get_origin(hint) in (Union, types.UnionType):
        parts = [_types_of(a) for a in typing.get_args(hint)]
        return None if None in parts else tuple(t for p in parts for t in p)  # type: ignore[union-attr]
    if hint is type(None):
        return (type(None),)
    origin = typing.get_origin(hint) or hint
    return (int, float) if origin is float else (origin,)


KINDS: dict[str, type[ControlMessage]] = {}
"""Every control message class by its kind."""


def _kind(name: str):
    def register(cls):
        cls.kind = name
        KINDS[name] = cls
        return dataclass(frozen=True)(cls)

    return register


def parse(message: wire.Message) -> ControlMessage:
    """The typed control message of a received one; :class:`WireError` if it is none."""
    cls = KINDS.get(message.kind)
    if cls is None:
        raise WireError(f"unknown control message kind {message.kind!r}")
    return cls.from_body(message.body)


def send(socket: zmq.Socket, message: ControlMessage, envelope: list[bytes] | None = None) -> None:
    transport.send(socket, message.kind, message.body(), envelope=envelope or ())


# ----------------------------------------------------------------- worker -> controller
@_kind("hello")
class Hello(ControlMessage):
    """A worker process started (or was restarted) and asks for its configuration."""

    role: str
    pid: int


@_kind("register")
class Register(ControlMessage):
    """A worker bound ``address`` for the endpoint ``name`` (:mod:`system.roles`)."""

    name: str
    address: str


@_kind("lookup")
class Lookup(ControlMessage):
    """Where is ``name``? Answered with :class:`LookupResult` once its owner registered."""

    name: str


@_kind("ready")
class Ready(ControlMessage):
    """Built: the worker's loop starts."""


@_kind("heartbeat")
class Heartbeat(ControlMessage):
    """I am alive; ``stats`` since the last one (empty from a busy thread: keep the last), and
    the global state's revision this worker has (None: it does not follow the state)."""

    stats: dict[str, Any]
    state_revision: int | None = None


@_kind("error")
class Error(ControlMessage):
    """The worker failed; ``fatal``: a restart cannot fix it (an unknown name, a bad argument)."""

    message: str
    traceback: str = ""
    type: str = ""
    fatal: bool = False


HUNG_POLL = "HungPoll"
"""The :attr:`Error.type` of a worker's report that one poll outlasted its role's liveness
bound (:mod:`system.run.busy_heartbeat`): the controller restarts it, and counts the time the
poll ran as no work (:func:`system.run.worker_record.worked_for_a_while`)."""


@_kind("signalled")
class Signalled(ControlMessage):
    """The worker was sent ``signal`` (``SIGTERM``) by someone else than its controller, and
    waits for a :class:`Stop` before it leaves, so that its stop does its work (a trainer's
    last version and state, a replay buffer) in the run's order: the controller's own stop, if
    the signal ended the whole job, or a stop of this worker alone, which it then restarts."""

    signal: str


@_kind("bye")
class Bye(ControlMessage):
    """The worker stopped as asked and is leaving; ``signal`` (``SIGTERM``): it is leaving
    because it was sent that signal, not because it was asked."""

    signal: str = ""


@_kind("state_write")
class StateWrite(ControlMessage):
    """A write of the global state (:mod:`system.run.coordination.state`), answered with
    :class:`StateResult`; ``expected_version``: a compare-and-set."""

    id: int
    key: str
    value: Any
    expected_version: int | None = None

    @classmethod
    def from_body(cls, body: Any) -> StateWrite:
        request = super().from_body(body)
        if request.expected_version is not None and request.expected_version < 0:
            raise WireError(
                f"'state_write' message: 'expected_version' must be >= 0, got "
                f"{request.expected_version}"
            )
        try:
            check_key(request.key)
            packed_value(request.value)
        except GlobalStateError as e:
            raise WireError(f"'state_write' message: {e}") from e
        return request


def packed_value(value: Any, path: str = "value") -> bytes:
    """``value`` as msgpack, after checking it is plain data of at most MAX_VALUE_BYTES."""
    data = msgpack.packb(check_value(value, path), use_bin_type=True)
    if len(data) > MAX_VALUE_BYTES:
        raise GlobalStateError(
            f"{path}: {len(data)} bytes encoded, more than the {MAX_VALUE_BYTES} a global state "
            "value may hold; keep large data in files or the parameter service"
        )
    return data


# ----------------------------------------------------------------- controller -> worker
@_kind("configure")
class Configure(ControlMessage):
    """What a worker is built from: the experiment, its run folder, its plan
    (:meth:`system.run.plan.WorkerPlan.to_wire`), the global state as it is now, and the
    run's shape."""

    config: dict[str, Any]
    run_dir: str
    plan: dict[str, Any]
    global_state: dict[str, Any]
    shape: dict[str, Any] | None = None
    """The run's spaces and message layouts (:mod:`system.run.shape`); None: resolve them."""


@_kind("lookup_result")
class LookupResult(ControlMessage):
    name: str
    address: str


@_kind("ack")
class Ack(ControlMessage):
    """The answer to a heartbeat (it proves the controller is there), with the global state's
    entries the worker lacks, if any."""

    state: dict[str, Any] | None = None


@_kind("moved")
class Moved(ControlMessage):
    """The owner of ``name``, which this worker looked up, was restarted at ``address``."""

    name: str
    address: str


@_kind("stop")
class Stop(ControlMessage):
    """Stop in order: finish the work in hand (a trainer's last checkpoint), say bye, leave.
    ``leave``: leave now, without that stop (a data-parallel trainer rank sent SIGTERM alone,
    whose stop would stop its whole group for good: gone, it fails the group, which restarts).
    ``alone``: a stop of this worker alone, after a signal someone else sent it (not the run's
    stop): its launcher or scheduler is to start it again, so it leaves with the signal's exit
    code (143). Stopped by the run's own stop it leaves with 0, signalled or not: a Docker
    engine's shutdown signals every container, and workers that left with 143 were started
    again, by the launcher at once and by Docker when the engine came back, with no run left."""

    leave: bool = False
    alone: bool = False


@_kind("state_result")
class StateResult(ControlMessage):
    """The answer to a :class:`StateWrite`; ``error``: refused, and why."""

    id: int | None
    ok: bool
    key: str | None = None
    version: int | None = None
    error: str | None = None


@_kind("refused")
class Refused(ControlMessage):
    """Sent to a peer that is not a worker of this run (then its messages are dropped)."""

    reason: str
