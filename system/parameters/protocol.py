"""The parameter service's protocol: message types both ends share, and their checks.

Requests (client DEALER -> server ROUTER), each with an int ``id`` the reply repeats:

- ``hello {}`` -> ``hello {shm}``: the server's shared-memory directory, or None;
- ``publish`` (:class:`Publish`) -> ``ack {version}``;
- ``get`` (:class:`Get`) -> ``params {policy, version, params}``;
- ``tag`` (:class:`Tag`) -> ``ack {version}``;
- ``trainer_state`` (:class:`GetTrainerState`) -> ``trainer_state {policy, version, state}``
  (both None when no trainer state was saved);
- any of them -> ``error {type, error}`` when refused (``type`` is one of :data:`REMOTE_ERRORS`).

Pushes (server XPUB -> client SUB), kind ``params``: on topic ``<policy>`` the full parameters
``{policy, version, params}``; on ``@<policy>`` (:data:`SHM_TOPIC`), for subscribers sharing the
server's shared memory, ``{policy, version, shm}`` (the file's layout) or the full parameters
when the version came over a socket.

Each request type parses a received body with ``from_body``, raising :class:`WireError` naming
the request and the field, so a malformed request is refused the same way wherever it lands.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

from api.errors import RunFolderError, TroupeError, UserError
from system.errors import (
    ParameterNotFoundError,
    PolicyNameError,
    SharedMemoryRefused,
    VersionError,
    WireError,
)

PUSH_HWM = 16
"""Pushes queued per subscriber. Only the newest one matters to a subscriber, so a short queue is
enough; a subscriber that fell this far behind still gets every later push, or can ``get``."""
SHM_TOPIC = b"@"
"""Prefix of a policy's shared-memory topic; no policy name starts with it, so neither kind of
subscription can match the other's topic."""
DEFAULT_TIMEOUT_S = 10.0
"""How long a client waits for a reply before it gives up on the request."""

REMOTE_ERRORS: dict[str, type[TroupeError]] = {
    cls.__name__: cls
    for cls in (
        VersionError,
        ParameterNotFoundError,
        PolicyNameError,
        RunFolderError,
        SharedMemoryRefused,
        UserError,
        WireError,
    )
}
"""The only error types a reply may name; a client raises anything else as OperationalError."""


def ms_left(deadline: float) -> int:
    """Milliseconds left until ``deadline`` (a :func:`time.monotonic` time), never negative,
    as ZeroMQ's poll timeouts take them."""
    return max(0, int((deadline - time.monotonic()) * 1000))


def _field(body: dict, name: str, kinds: tuple[type, ...], request: str) -> Any:
    value = body.get(name)
    if type(value) not in kinds:
        wanted = " or ".join(k.__name__ for k in kinds)
        article = "an" if wanted[0] in "aeiou" and len(kinds) > 1 else "a"
        raise WireError(f"'{request}' request needs {article} {wanted} '{name}', got {value!r}")
    return value


@dataclass(frozen=True)
class Publish:
    """Store a new version (or, with ``persist`` and the latest version, save it to disk).

    Exactly one of ``params`` (the parameters themselves) and ``shm`` (the layout of a file in
    the server's shared memory holding them) is given. ``trainer_state`` (only with
    ``persist``): the trainer's own state at this version, in the form of
    :func:`system.parameters.trainer_state.to_wire`, saved beside the checkpoint."""

    kind: ClassVar[str] = "publish"
    policy: str
    version: int
    persist: bool = False
    params: Any = None
    shm: dict | None = None
    trainer_state: Any = None

    def body(self) -> dict[str, Any]:
        body = {"policy": self.policy, "version": self.version, "persist": self.persist}
        if self.trainer_state is not None:
            body["trainer_state"] = self.trainer_state
        if self.shm is not None:
            return {**body, "shm": self.shm}
        return {**body, "params": self.params}

    @classmethod
    def from_body(cls, body: dict) -> Publish:
        shm = body.get("shm")
        if shm is None and "params" not in body:
            raise WireError("'publish' request has no 'params'")
        request = cls(
            _field(body, "policy", (str,), cls.kind),
            _field(body, "version", (int,), cls.kind),
            _field(body, "persist", (bool,), cls.kind),
            body.get("params"),
            shm,
            body.get("trainer_state"),
        )
        if request.trainer_state is not None and not request.persist:
            raise WireError("'publish' request has a 'trainer_state' but does not persist")
        return request


@dataclass(frozen=True)
class Get:
    """Ask for a version by number or by tag (``latest``, ``eval``, ...)."""

    kind: ClassVar[str] = "get"
    policy: str
    version: int | str

    def body(self) -> dict[str, Any]:
        return {"policy": self.policy, "version": self.version}

    @classmethod
    def from_body(cls, body: dict) -> Get:
        return cls(
            _field(body, "policy", (str,), cls.kind), _field(body, "version", (int, str), cls.kind)
        )


@dataclass(frozen=True)
class Tag:
    """Point a tag at a version."""

    kind: ClassVar[str] = "tag"
    policy: str
    version: int
    tag: str

    def body(self) -> dict[str, Any]:
        return {"policy": self.policy, "version": self.version, "tag": self.tag}

    @classmethod
    def from_body(cls, body: dict) -> Tag:
        return cls(
            _field(body, "policy", (str,), cls.kind),
            _field(body, "version", (int,), cls.kind),
            _field(body, "tag", (str,), cls.kind),
        )


@dataclass(frozen=True)
class GetTrainerState:
    """Ask for the trainer's own state saved with the newest persisted version (a restarted
    trainer restores its optimiser from it)."""

    kind: ClassVar[str] = "trainer_state"
    policy: str

    def body(self) -> dict[str, Any]:
        return {"policy": self.policy}

    @classmethod
    def from_body(cls, body: dict) -> GetTrainerState:
        return cls(_field(body, "policy", (str,), cls.kind))
