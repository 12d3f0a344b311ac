"""The versioned parameter store behind the parameter service.

Per policy name the store holds monotonic integer versions of a checkpoint (a nested dict of
numpy arrays, scalars or torch tensors, stored as given: the parameter service stores read-only
arrays onto a received message or a mapped shared-memory file), the tags ``latest`` (automatic)
and any explicit ones such as ``eval``, the newest ``keep`` versions in memory (tagged versions
are kept too; :meth:`ParameterStore.on_evict` tells when one leaves), and, when a publish asks
for it, a checkpoint file on disk so a run can resume::

    root_dir/checkpoints/<policy>/v00000042.ckpt
    root_dir/checkpoints/<policy>/tags.json       {"eval": 40}
    root_dir/checkpoints/<policy>/latest.ckpt     (``durable=True``: every version, see below)
    root_dir/checkpoints/<policy>/trainer.ckpt    the trainer's own state, newest persisted
    root_dir/checkpoints/<policy>/trainer.prev.ckpt   the one before it

``trainer.ckpt`` is the optimiser state (and schedules) of the trainer that published the newest
version it sent with ``persist=True`` (:meth:`ParameterStore.publish`'s ``trainer_state``): the
trainer ships it here rather than writing a file itself, so a trainer needs no run folder of its
own and a restarted one (or every rank of a data-parallel group) reads it back from the service
(:meth:`ParameterStore.trainer_state`). The newest is kept, and the one before it for a resume
that finds the newest damaged.

Every file proves itself (a checksum, :mod:`system.parameters.checkpoint_file`): a damaged one is
named in a warning and skipped for the newest good one. The run's service keeps the newest
``keep_files`` numbered checkpoints (``checkpoint.keep_last``), so a long run's folder stays
bounded.

``durable=True`` (the parameter service of a run) writes every version to ``latest.ckpt`` before
:meth:`ParameterStore.publish` returns, that is before the service announces it, so a service
that is killed and restarted loses no version it ever announced. It is written by rename but not
fsynced: a killed process loses nothing the kernel has, and the fsynced ``v*.ckpt`` files are
what survives a lost machine; the cost is one write of the parameters to the page cache.

Files are written atomically (temporary file, fsync, ``os.replace``) so a crash never leaves a
half-written checkpoint under a real name. A checkpoint file holds the wire codec's frames (a
msgpack header and raw arrays), so reading one never runs code and needs no torch: the
parameter service starts and saves without importing it.

Longer than 400 lines because what a run can resume from is decided in one place: which version
is in memory, which is on disk and under which name, and the trainer state saved with it are one
consistency rule (durable before announced), easier to check read together than split.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from api.errors import UserError
from system import run_folder
from system.errors import ParameterNotFoundError, PolicyNameError, VersionError
from system.parameters.checkpoint_file import (
    CHECKPOINT_SUFFIX,
    load_checkpoint_file,
    write_checkpoint,
)
from system.processes import process_exists
from system.run_folder import write_atomically

logger = logging.getLogger(__name__)

LATEST = "latest"
_POLICY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
_CHECKPOINT_RE = re.compile(r"v(\d{8,})\.ckpt")
_TMP_RE = re.compile(r"\..+\.tmp-(\d+)-\d+")
LATEST_FILE = "latest.ckpt"
TRAINER_FILE = "trainer.ckpt"
TRAINER_PREVIOUS_FILE = "trainer.prev.ckpt"


def check_policy_name(policy: Any) -> str:
    if type(policy) is not str or not _POLICY_RE.fullmatch(policy):
        raise PolicyNameError(
            f"policy name {policy!r} is not allowed: use 1-128 letters, digits, '_', '.' or '-', "
            "not starting with '.' or '-'"
        )
    return policy


class _Policy:
    """Everything the store knows about one policy."""

    def __init__(self) -> None:
        self.latest: int | None = None
        self.memory: dict[int, Any] = {}  # version -> params, oldest first
        self.tags: dict[str, int] = {}
        self.on_disk: set[int] = set()
        self.tag_only: set[int] = set()
        """Versions whose file was written only because a tag named them: it goes when no tag
        does any more (evaluation tags a version per window; one file is kept, not all)."""


class ParameterStore:
    """Versions, tags, in-memory cache and on-disk checkpoints of every policy's parameters.

    ``root_dir=None`` keeps everything in memory (publishing with ``persist=True`` is then an
    error). Thread-safe: one lock guards every method.
    """

    def __init__(
        self,
        root_dir: str | os.PathLike | None = None,
        *,
        keep: int = 3,
        durable: bool = False,
        keep_files: int = 0,
        keep_every: int = 0,
    ):
        """``keep``: versions held in memory. ``keep_files`` (the run's service: its
        ``checkpoint.keep_last``): numbered checkpoint files kept, newest first, besides tagged
        ones and multiples of ``keep_every``; 0 keeps every file."""
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        if durable and root_dir is None:
            raise UserError("ParameterStore(durable=True) needs a root_dir to write versions to")
        self.root_dir = None if root_dir is None else Path(root_dir)
        self.durable = durable
        self.keep = keep
        self.keep_files = keep_files
        self.keep_every = keep_every
        self._policies: dict[str, _Policy] = {}
        self._lock = threading.Lock()
        self._published = threading.Condition(self._lock)
        self._evict_listeners: list[Callable[[str, int], None]] = []

    def on_evict(self, listener: Callable[[str, int], None]) -> None:
        """Call ``listener(policy, version)`` whenever a version leaves memory (the newest
        ``keep`` and tagged ones stay). It runs under the store's lock: it must be quick and
        must not call the store. The parameter service unlinks shared-memory files with it."""
        with self._lock:
            self._evict_listeners.append(listener)

    # -------------------------------------------------------------------------------- queries
    def policies(self) -> list[str]:
        with self._lock:
            return sorted(name for name, p in self._policies.items() if p.latest is not None)

    def latest_version(self, policy: str) -> int | None:
        """The newest version of ``policy``, or None if nothing was published for it."""
        with self._lock:
            entry = self._policies.get(policy)
            return None if entry is None else entry.latest

    def versions_in_memory(self, policy: str) -> list[int]:
        with self._lock:
            entry = self._policies.get(policy)
            return [] if entry is None else sorted(entry.memory)

    def tags(self, policy: str) -> dict[str, int]:
        """Every tag of ``policy`` and the version it points at, ``latest`` included."""
        with self._lock:
            entry = self._entry(policy)
            return {LATEST: entry.latest, **entry.tags}

    def get(self, policy: str, version: int | str = LATEST) -> tuple[int, Any]:
        """``(version, params)`` for a version number or a tag; the params are not copied."""
        with self._lock:
            entry = self._entry(policy)
            number = self._resolve(policy, entry, version)
            if number in entry.memory:
                return number, entry.memory[number]
            if number in entry.on_disk:
                return number, self._load(policy, number)
            raise ParameterNotFoundError(
                f"version {number} of policy '{policy}' is no longer in memory and was not "
                f"persisted; versions in memory: {sorted(entry.memory)}"
            )

    # ------------------------------------------------------------------------------- updates
    def publish(
        self,
        policy: str,
        version: int,
        params: Any,
        *,
        persist: bool = False,
        trainer_state: Any = None,
    ) -> None:
        """Add ``version`` of ``policy``; it must be newer than the latest one.

        ``persist=True`` also writes the checkpoint file (the caller chooses the cadence), and
        ``trainer_state`` (only with ``persist``), the trainer's own state at that version, to
        ``trainer.ckpt`` after it. Publishing the latest version again with ``persist=True``
        only writes to disk: that is how a trainer saves its final version when the run stops.
        """
        check_policy_name(policy)
        if type(version) is not int or version < 0:
            raise VersionError(f"version of policy '{policy}' must be an int >= 0, got {version!r}")
        if persist and self.root_dir is None:
            raise UserError("publish(persist=True) needs a ParameterStore with a root_dir")
        if trainer_state is not None and not persist:
            raise UserError("publish(trainer_state=...) needs persist=True")
        with self._lock:
            entry = self._policies.setdefault(policy, _Policy())
            if persist:
                entry.tag_only.discard(version)  # a checkpoint now, whatever tags say
            if persist and version == entry.latest:
                if version not in entry.on_disk:
                    self._save(policy, version, params)
                    entry.on_disk.add(version)
                if trainer_state is not None:
                    self._save_trainer_state(policy, version, trainer_state)
                self._prune_files(policy, entry)
                return
            if entry.latest is not None and version <= entry.latest:
                raise VersionError(
                    f"policy '{policy}' is already at version {entry.latest}; version {version} "
                    "must be newer (versions only go up)"
                )
            if persist:
                self._save(policy, version, params)
                entry.on_disk.add(version)
                if trainer_state is not None:
                    self._save_trainer_state(policy, version, trainer_state)
            if self.durable:  # every version, persisted ones too: latest.ckpt is the newest
                self._save_latest(policy, version, params)
            entry.memory[version] = params
            entry.latest = version
            self._evict(policy, entry)
            if persist:
                self._prune_files(policy, entry)
            self._published.notify_all()

    def wait_newer(self, policy: str, version: int | None, timeout_s: float) -> int | None:
        """Wait up to ``timeout_s`` until ``policy`` has a version newer than ``version``
        (None: any version); return the latest version then, or None if none came in time.
        """

        def newer() -> int | None:
            entry = self._policies.get(policy)
            latest = None if entry is None else entry.latest
            return latest if latest is not None and (version is None or latest > version) else None

        with self._published:
            self._published.wait_for(lambda: newer() is not None, timeout=max(timeout_s, 0.0))
            return newer()

    def tag(self, policy: str, version: int, tag: str) -> None:
        """Point ``tag`` (e.g. ``"eval"``) at an existing ``version`` of ``policy``; with a
        ``root_dir``, that version's checkpoint file is written if it was not yet (and the file
        of the version the tag named before goes, if only tags had kept it)."""
        if type(tag) is not str or not tag or tag == LATEST or tag.isdigit():
            raise UserError(
                f"tag {tag!r} is not allowed: 'latest' is automatic, and tags are "
                "non-empty names that are not numbers"
            )
        with self._lock:
            entry = self._entry(policy)
            if type(version) is not int or (
                version not in entry.memory and version not in entry.on_disk
            ):
                raise ParameterNotFoundError(
                    f"cannot tag version {version!r} of policy '{policy}': no such version "
                    f"(latest is {entry.latest})"
                )
            previous = entry.tags.get(tag)
            entry.tags[tag] = version
            self._evict(policy, entry)
            if self.root_dir is not None:
                # A tag names a version to keep: its file is written, so the tag outlives a
                # restart (restore drops tags whose file is missing) and the run's end.
                if version not in entry.on_disk:
                    self._save(policy, version, entry.memory[version])
                    entry.on_disk.add(version)
                    entry.tag_only.add(version)
                self._save_tags(policy, entry)
                if previous in entry.tag_only and previous not in entry.tags.values():
                    self.checkpoint_path(policy, previous).unlink(missing_ok=True)
                    entry.on_disk.discard(previous)
                    entry.tag_only.discard(previous)

    # ----------------------------------------------------------------------------- internals
    def _entry(self, policy: str) -> _Policy:
        entry = self._policies.get(policy)
        if entry is None or entry.latest is None:
            known = sorted(n for n, p in self._policies.items() if p.latest is not None)
            raise ParameterNotFoundError(f"no parameters for policy '{policy}'; known: {known}")
        return entry

    def _resolve(self, policy: str, entry: _Policy, version: int | str) -> int:
        if version == LATEST:
            return entry.latest
        if type(version) is int:
            if version in entry.memory or version in entry.on_disk:
                return version
            raise ParameterNotFoundError(
                f"policy '{policy}' has no version {version} (latest is {entry.latest})"
            )
        if type(version) is str and version in entry.tags:
            return entry.tags[version]
        raise ParameterNotFoundError(
            f"policy '{policy}' has no tag {version!r}; tags: {[LATEST, *entry.tags]}"
        )

    def _evict(self, policy: str, entry: _Policy) -> None:
        keep = set(sorted(entry.memory)[-self.keep :]) | set(entry.tags.values())
        for version in [v for v in entry.memory if v not in keep]:
            del entry.memory[version]
            for listener in self._evict_listeners:
                try:
                    listener(policy, version)
                except Exception:  # a listener's trouble must not undo the publish
                    logger.exception(
                        "eviction listener failed for version %d of %s", version, policy
                    )

    def _prune_files(self, policy: str, entry: _Policy) -> None:
        """Remove numbered checkpoints beyond the newest ``keep_files`` (the run's own service
        only; a reader never removes a file). Kept whatever their age, beyond those: tagged
        versions and multiples of ``keep_every``."""
        if not (self.durable and self.keep_files > 0):
            return
        kept = set(entry.tags.values())  # the latest is the newest: never among the pruned
        numbered = sorted(
            v
            for v in entry.on_disk - entry.tag_only - kept
            if not (self.keep_every and v % self.keep_every == 0)
        )
        for version in numbered[: max(0, len(numbered) - self.keep_files)]:
            try:
                self.checkpoint_path(policy, version).unlink(missing_ok=True)
            except OSError as e:  # the next prune tries again; the run goes on
                logger.warning("could not remove old checkpoint of version %d: %s", version, e)
                continue
            entry.on_disk.discard(version)

    def _folder(self, policy: str) -> Path:
        assert self.root_dir is not None
        return self.root_dir / run_folder.CHECKPOINTS / policy

    def checkpoint_path(self, policy: str, version: int) -> Path:
        return self._folder(policy) / f"v{version:08d}{CHECKPOINT_SUFFIX}"

    def _save(self, policy: str, version: int, params: Any) -> None:
        record = {"policy": policy, "version": version, "params": params}
        path = self.checkpoint_path(policy, version)
        write_atomically(path, lambda f: write_checkpoint(f, record))

    def _save_trainer_state(self, policy: str, version: int, state: Any) -> None:
        """The new state replaces ``trainer.ckpt``; the one it replaces stays one save longer
        as ``trainer.prev.ckpt``, for a resume that finds the newest damaged."""
        record = {"policy": policy, "version": version, "trainer": state}
        path = self._folder(policy) / TRAINER_FILE
        if path.is_file():
            os.replace(path, path.with_name(TRAINER_PREVIOUS_FILE))
        write_atomically(path, lambda f: write_checkpoint(f, record))

    def trainer_state(self, policy: str) -> tuple[int, Any] | None:
        """``(version, state)``: the trainer's own state saved with the newest persisted
        version that carried one; None when there is none (no root_dir, or nothing saved yet).
        An unreadable file is logged and taken for none: the trainer then starts afresh. A
        state newer than the parameters in memory is skipped too: it was saved with parameters
        that could not be read back (a damaged ``v*.ckpt``); handed over, version 47's optimiser
        moments and step count went with version 17's weights."""
        check_policy_name(policy)
        if self.root_dir is None:
            return None
        held = self.latest_version(policy)
        for name in (TRAINER_FILE, TRAINER_PREVIOUS_FILE):
            path = self._folder(policy) / name
            if not path.is_file():
                continue
            try:
                record = load_checkpoint_file(path, field="trainer")
            except (OSError, ValueError) as e:
                logger.warning("skipping unreadable trainer state: %s", e)
                continue
            version = record.get("version")
            if record.get("policy") != policy or type(version) is not int:
                logger.warning("ignoring %s: it holds another policy or no version", path)
                continue
            if held is not None and version > held:
                logger.warning("ignoring %s: the trainer state of version %d, newer than the "
                               "parameters restored (version %d)", path, version, held)  # fmt: skip
                continue
            return version, record["trainer"]
        return None

    def _save_latest(self, policy: str, version: int, params: Any) -> None:
        record = {"policy": policy, "version": version, "params": params}
        path = self._folder(policy) / LATEST_FILE
        write_atomically(path, lambda f: write_checkpoint(f, record), sync=False)

    def _load(self, policy: str, version: int, path: Path | None = None) -> Any:
        path = path or self.checkpoint_path(policy, version)
        try:
            record = load_checkpoint_file(path)
        except Exception as e:
            raise ParameterNotFoundError(f"cannot load checkpoint {path}: {e}") from e
        if record.get("policy") != policy or record.get("version") != version:
            raise ParameterNotFoundError(f"checkpoint {path} holds another policy or version")
        return record["params"]

    def _save_tags(self, policy: str, entry: _Policy) -> None:
        text = json.dumps(entry.tags, sort_keys=True).encode()
        write_atomically(self._folder(policy) / run_folder.TAGS, lambda f: f.write(text))

    # ------------------------------------------------------------------------------- restore
    @classmethod
    def restore(cls, root_dir: str | os.PathLike, *, keep: int = 3) -> ParameterStore:
        """A store resumed from ``root_dir``'s checkpoints (see :meth:`load_from_disk`)."""
        store = cls(root_dir, keep=keep)
        store.load_from_disk()
        return store

    def load_from_disk(self) -> dict[str, int]:
        """Resume every policy found under ``root_dir/checkpoints``: its newest loadable
        checkpoint becomes ``latest`` (in memory), older files stay available to ``get``, and
        tags pointing at files that exist are restored. Returns ``{policy: latest version}``.
        """
        if self.root_dir is None:
            raise UserError("load_from_disk needs a ParameterStore with a root_dir")
        folder = self.root_dir / run_folder.CHECKPOINTS
        found: dict[str, int] = {}
        if not folder.is_dir():
            return found
        for policy_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
            version = self._restore_policy(policy_dir)
            if version is not None:
                found[policy_dir.name] = version
        return found

    def _restore_policy(self, policy_dir: Path) -> int | None:
        policy = policy_dir.name
        if not _POLICY_RE.fullmatch(policy):
            logger.warning("skipping %s: not a policy name", policy_dir)
            return None
        versions = sorted(_checkpoint_versions(policy_dir), reverse=True)
        if self.durable:  # the run's own service; a reader (troupe eval) leaves files alone
            _remove_partial_files(policy_dir)
        with self._lock:
            entry = self._policies.setdefault(policy, _Policy())
            entry.on_disk.update(versions)
            self._restore_latest_file(policy, policy_dir, entry)
            for version in versions:
                try:
                    params = self._load(policy, version)
                except ParameterNotFoundError as e:
                    logger.warning("skipping unreadable checkpoint: %s", e)
                    entry.on_disk.discard(version)
                    continue
                if entry.latest is None or version > entry.latest:
                    entry.memory[version] = params
                    entry.latest = version
                break
            entry.tags.update(self._read_tags(policy_dir, entry))
            self._evict(policy, entry)
            return entry.latest

    def _restore_latest_file(self, policy: str, policy_dir: Path, entry: _Policy) -> None:
        """``latest.ckpt``, if it is newer than every numbered checkpoint, becomes ``latest``."""
        path = policy_dir / LATEST_FILE
        if not path.is_file():
            return
        try:
            record = load_checkpoint_file(path)
        except (OSError, ValueError) as e:
            logger.warning("ignoring unreadable %s: %s", path, e)
            return
        version = record.get("version")
        if record.get("policy") != policy or type(version) is not int:
            logger.warning("ignoring %s: it holds another policy or no version", path)
        elif entry.latest is None or version > entry.latest:
            entry.memory[version] = record["params"]
            entry.latest = version

    def _read_tags(self, policy_dir: Path, entry: _Policy) -> dict[str, int]:
        path = policy_dir / run_folder.TAGS
        if not path.is_file():
            return {}
        try:
            tags = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            logger.warning("ignoring unreadable %s: %s", path, e)
            return {}
        kept = {}
        for tag, version in tags.items() if isinstance(tags, dict) else ():
            if type(version) is int and version in entry.on_disk:
                kept[tag] = version
            else:
                logger.warning(
                    "dropping tag %r of %s: version %r has no checkpoint",
                    tag,
                    policy_dir.name,
                    version,
                )
        return kept


def _checkpoint_versions(policy_dir: Path) -> Iterator[int]:
    for path in policy_dir.iterdir():
        match = _CHECKPOINT_RE.fullmatch(path.name)
        if match:
            yield int(match.group(1))


def _remove_partial_files(policy_dir: Path) -> None:
    """Temporary files of a process killed while writing: never a real checkpoint."""
    for path in policy_dir.iterdir():
        match = _TMP_RE.fullmatch(path.name)
        if match and not process_exists(int(match.group(1))):
            logger.info("removing %s, left by a process killed while writing it", path)
            path.unlink(missing_ok=True)
