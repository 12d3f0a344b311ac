"""The run's shared key/value state (:mod:`api.global_state`): the controller's copy, the workers'
copies, and the control messages between them.

The controller holds the authoritative :class:`StateStore`. Each key has a version (writes to that
key) and the last *revision* that changed it (revisions count every write of the whole store), so
a worker that says which revision it has gets exactly the entries changed since.

Messages on the control channel (:mod:`system.run.control_channel`):
  worker -> controller: heartbeat {..., state_revision: int}
                        state_write {id: int, key: str, value, expected_version: int | None}
  controller -> worker: ack {state: {revision, entries: {key: [value, version]}}} (when behind)
                        state_result {id, ok, key, version, error?}
                        configure {..., global_state: {revision, entries}}

The messages are :class:`~system.run.control_protocol.StateWrite` and
:class:`~system.run.control_protocol.StateResult`. A malformed ``state_write`` is counted as a bad
message by the controller and never reaches the store; a refused one is answered with ``ok:
false`` and the reason.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from api.global_state import GlobalState, GlobalStateError, check_key
from system import run_folder
from system.errors import WireError
from system.run.control_protocol import StateResult, StateWrite, packed_value

logger = logging.getLogger(__name__)

STATE_FILE = run_folder.GLOBAL_STATE
"""The state's file in the run folder."""


@dataclass
class Entry:
    value: Any
    version: int
    revision: int


class StateStore(GlobalState):
    """The controller's state: the one every write goes through."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.revision = 0
        self.dirty = False
        """Changed since the last :meth:`save`."""

    def get(self, key: str) -> tuple[Any, int]:
        entry = self.entries.get(check_key(key))
        return (None, 0) if entry is None else (entry.value, entry.version)

    def items(self) -> dict[str, tuple[Any, int]]:
        return {k: (e.value, e.version) for k, e in self.entries.items()}

    def set(self, key: str, value: Any) -> int:
        return self._write(key, value, None)[1]

    def compare_and_set(self, key: str, value: Any, expected_version: int) -> tuple[bool, int]:
        return self._write(key, value, expected_version)

    def _write(self, key: str, value: Any, expected: int | None) -> tuple[bool, int]:
        check_key(key)
        value = msgpack.unpackb(packed_value(value), raw=False)  # checked; tuples become lists
        current = self.get(key)[1]
        if expected is not None and expected != current:
            return False, current
        self.revision += 1
        self.entries[key] = Entry(value, current + 1, self.revision)
        self.dirty = True
        return True, current + 1

    def changes_since(self, revision: int) -> dict[str, Any] | None:
        """The entries a worker at ``revision`` lacks (all of them if ``revision`` is not one
        of ours, e.g. from before a controller restart); None when it is up to date."""
        if revision == self.revision:
            return None
        newer = revision if 0 <= revision < self.revision else -1
        return {
            "revision": self.revision,
            "entries": {
                k: [e.value, e.version] for k, e in self.entries.items() if e.revision > newer
            },
        }

    def snapshot(self) -> dict[str, Any]:
        return self.changes_since(-1) or {"revision": self.revision, "entries": {}}

    def save(self, run_dir: Path) -> None:
        """Write the state to the run folder atomically (only when it changed)."""
        if not self.dirty:
            return
        table = {k: [e.value, e.version, e.revision] for k, e in self.entries.items()}
        data = msgpack.packb({"revision": self.revision, "entries": table}, use_bin_type=True)
        run_folder.write_bytes(Path(run_dir) / STATE_FILE, data, sync=False)
        self.dirty = False

    @classmethod
    def load(cls, run_dir: Path) -> StateStore:
        """The state saved in ``run_dir`` (a resumed run), or an empty one."""
        store = cls()
        path = Path(run_dir) / STATE_FILE
        if not path.exists():
            return store
        try:
            saved = msgpack.unpackb(path.read_bytes(), raw=False)
            store.revision = int(saved["revision"])
            for key, (value, version, revision) in saved["entries"].items():
                store.entries[check_key(key)] = Entry(value, int(version), int(revision))
        except (ValueError, KeyError, TypeError, GlobalStateError, msgpack.UnpackException) as e:
            raise GlobalStateError(
                f"{path} is damaged ({e!r}); delete it to resume with an empty global state"
            ) from e
        return store


# ----------------------------------------------------------------------- messages
def answer_write(
    store: StateStore, request: StateWrite, may_write: bool
) -> tuple[StateResult, WireError | None]:
    """The answer to a (checked) write request, and the error when it was refused."""
    if not may_write:
        error = WireError(
            f"state_write of '{request.key}' refused: only trainers and the controller's "
            "callbacks write the global state; actors and policy workers read it"
        )
        return StateResult(request.id, False, request.key, error=str(error)), error
    ok, version = store._write(request.key, request.value, request.expected_version)
    return StateResult(request.id, ok, request.key, version), None


# ----------------------------------------------------------------------- a worker's copy
class StateReplica(GlobalState):
    """A worker's copy of the state: reads are local, writes go to the controller and wait for
    its answer (they are for trainers; a few per training step at most)."""

    def __init__(self, request: Callable[[StateWrite], StateResult] | None = None):
        """``request``: sends a write to the controller and returns its answer (the worker's
        control channel); None for a copy that is not part of a run."""
        self.request = request
        self.entries: dict[str, tuple[Any, int]] = {}
        self.revision = -1
        """The controller's revision this copy has caught up with (-1: none yet)."""
        self._ids = itertools.count(1)

    def apply(self, update: Any) -> None:
        """Take the entries of a configure's snapshot or a heartbeat answer."""
        if not isinstance(update, dict) or type(update.get("revision")) is not int:
            raise WireError(f"global state update without an int 'revision': {update!r}")
        entries = update.get("entries")
        if not isinstance(entries, dict):
            raise WireError("global state update without an 'entries' mapping")
        for key, item in entries.items():
            if not (isinstance(item, list) and len(item) == 2 and type(item[1]) is int):
                raise WireError(f"global state entry '{key}' is not [value, version]: {item!r}")
        for key, (value, version) in entries.items():
            if version >= self.entries.get(key, (None, 0))[1]:
                self.entries[key] = (value, version)
        self.revision = update["revision"]

    def get(self, key: str) -> tuple[Any, int]:
        return self.entries.get(check_key(key), (None, 0))

    def items(self) -> dict[str, tuple[Any, int]]:
        return dict(self.entries)

    def set(self, key: str, value: Any) -> int:
        return self._write(key, value, None)[1]

    def compare_and_set(self, key: str, value: Any, expected_version: int) -> tuple[bool, int]:
        return self._write(key, value, expected_version)

    def _write(self, key: str, value: Any, expected: int | None) -> tuple[bool, int]:
        if self.request is None:
            raise GlobalStateError("this copy of the global state is not connected to a run")
        check_key(key)
        packed_value(value)
        reply = self.request(StateWrite(next(self._ids), key, value, expected))
        if reply.error or reply.version is None:
            raise GlobalStateError(reply.error or f"state_write of '{key}' got no version")
        if reply.ok:  # seen at once here; the other workers get it with their heartbeats
            self.entries[key] = (msgpack.unpackb(packed_value(value), raw=False), reply.version)
        return reply.ok, reply.version
