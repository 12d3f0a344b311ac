"""Global coordination: a small, versioned key/value state shared by every process of a run.

The controller holds the state; every worker keeps a copy that follows it (the heartbeat answers
carry what changed, so a change reaches every worker within a few heartbeats), and a worker
restarted after a failure gets the whole state in its configuration. The state is saved in the
run folder (``global_state.msgpack``) and restored when the run is resumed.

Every key has a version: 0 while it was never set, then one more at every write. A writer that
must not lose a concurrent update uses :meth:`GlobalState.compare_and_set` with the version it
read. Trainers and the controller's callbacks write; actors and policy workers only read (their
copy may lag by a heartbeat or two). Values are plain msgpack data: None, bool, int, float, str,
bytes, and lists and str-keyed dicts of these.

From user code (a trainer, a callback, an environment wrapper's owner)::

    from api.global_state import global_state
    stage, version = global_state().get("curriculum/stage")
    ok, version = global_state().compare_and_set("my/key", {"x": 1}, expected_version=version)
"""

from __future__ import annotations

import abc
from typing import Any

from api.errors import UserError

MAX_KEY_CHARS = 200
"""Longest key accepted."""
MAX_VALUE_BYTES = 64 << 10
"""Largest value accepted, msgpack-encoded: the state is for coordination, not for data."""


class GlobalStateError(UserError):
    """A key or value the global state does not accept, or a write from a process that may not
    write; the message says which and what to do."""


class GlobalState(abc.ABC):
    """What user code sees of the run's shared key/value state."""

    @abc.abstractmethod
    def get(self, key: str) -> tuple[Any, int]:
        """``(value, version)``; ``(None, 0)`` for a key never set."""

    @abc.abstractmethod
    def items(self) -> dict[str, tuple[Any, int]]:
        """Every key with its ``(value, version)``."""

    @abc.abstractmethod
    def set(self, key: str, value: Any) -> int:
        """Write ``value`` whatever the current version; returns the new version."""

    @abc.abstractmethod
    def compare_and_set(self, key: str, value: Any, expected_version: int) -> tuple[bool, int]:
        """Write only if ``key`` is still at ``expected_version`` (0: not set yet).

        Returns ``(written, version)``: the new version, or the current one when another
        writer came first (read again, then retry)."""


_current: GlobalState | None = None


def global_state() -> GlobalState:
    """The state of the run this process belongs to."""
    if _current is None:
        raise GlobalStateError(
            "no run is active in this process, so there is no global state; it exists in the "
            "controller and the workers of a run (`troupe run`, `troupe.train`)"
        )
    return _current


def install(state: GlobalState | None) -> None:
    """Make ``state`` the one :func:`global_state` returns (the runtime calls this)."""
    global _current
    _current = state


def check_key(key: Any) -> str:
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
        raise GlobalStateError(
            f"global state key {key!r}: must be a non-empty str of at most {MAX_KEY_CHARS} "
            "characters, e.g. 'curriculum/stage'"
        )
    return key


def check_value(value: Any, path: str = "value") -> Any:
    """``value`` if it is plain msgpack data; else an error naming where it is not."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 1 << 63:
            raise GlobalStateError(f"{path}: the int {value} does not fit in 64 bits")
        return value
    if isinstance(value, (list, tuple)):
        return [check_value(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        for k in value:
            if not isinstance(k, str):
                raise GlobalStateError(f"{path}: dict key {k!r} is not a str")
        return {k: check_value(v, f"{path}[{k!r}]") for k, v in value.items()}
    raise GlobalStateError(
        f"{path}: a {type(value).__name__} is not plain msgpack data; use None, bool, int, "
        "float, str, bytes, lists and str-keyed dicts (convert arrays with .tolist())"
    )
