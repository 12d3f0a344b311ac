"""A run folder's layout and its one way of writing a file.

Every file a run leaves is named here, so the controller that writes it, the tools that read it
(``troupe status``, the bench, the deploy commands) and a user's script agree on one spelling.
The parameter store names its own files inside :data:`CHECKPOINTS`
(:mod:`system.parameters.store`).

:func:`write_atomically` is how every file of a run is written: a reader (a tool polling
``metrics.jsonl``'s neighbours, a resumed run, a crash) sees the old file or the whole new one,
never half of one, and a full disk or read-only mount is a :class:`RunFolderError` naming the
file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from api.errors import RunFolderError

logger = logging.getLogger(__name__)

CONFIG = "config.json"
"""The resolved experiment, as the run was started (a resume checks against it)."""
METRICS = "metrics.jsonl"
"""The run's records: frames, returns, trainer stats, timings; one a second, fewer as the run
ages (``metrics.thin``)."""
LATEST = "latest.json"
"""The record of the run's last second, replaced each second whether or not ``metrics.jsonl``
keeps it: what ``troupe status`` shows, and what a resumed run counts on from."""
SUMMARY = "summary.json"
"""How the run ended (stop reason, solved, failure), written at its end."""
WORKERS = "workers.json"
"""Who runs where: role, pid, state, restarts, peak memory, version; refreshed each second."""
ENDPOINTS = "endpoints.json"
"""The controller's address and every registered endpoint's."""
GLOBAL_STATE = "global_state.msgpack"
"""The run's shared key/value state (:mod:`api.global_state`), restored on resume."""
LEARNING_CURVE = "learning_curve.png"
WIN_RATES = "win_rates.png"
RATINGS = "ratings.json"
"""Self-play ratings of every player of the league."""
PBT_EVENTS = "pbt.jsonl"
"""Every PBT decision: scores, exploits, explored hyperparameters."""
RESUMES = "resumes.jsonl"
"""Each resume's changed settings."""
LOCK = ".troupe.lock"
"""Held (``flock``) by the run that uses the folder."""
CHECKPOINTS = "checkpoints"
"""The parameter store's folder: versions, trainer state, replay buffer."""
TAGS = "tags.json"
"""In each policy's checkpoint folder: version tags (``{"eval": 40}``), what ``troupe eval``
plays."""
LOGS = "logs"
"""Each process's rotated INFO log, ``logs/<worker>.log`` (:mod:`system.logs`)."""
CONTROLLER_STARTS = "controller_starts.json"
"""How many times a cluster launch's controller has started and bound its sockets: what tells
its workers that a scheduler which restarts it no more has nothing left to start
(:mod:`system.run.launch_end`)."""
LAUNCH = "launch.json"
"""Who launched the run and how to reach it (launcher, host, pid, namespace, job id): what
``troupe status|logs|stop|ps`` read to find a run's processes (:mod:`distributed.ops`)."""

REMOVAL_WAIT_S = 2.0
"""How long a write that found a path of the run gone waits for the whole folder to go (an
``rm -rf`` under way) before it reports that one path."""


def write_atomically(path: Path, write: Callable[[IO[bytes]], Any], *, sync: bool = True) -> None:
    """Write ``path`` through ``write(f)`` on a temporary file renamed over it; ``sync``: fsync
    first (a version that must survive a power cut), else only a crash of this process."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise RunFolderError.from_os_error(path, e) from e
    finally:
        with contextlib.suppress(OSError):  # gone after the rename; or never made
            tmp.unlink(missing_ok=True)


def write_bytes(path: Path, data: bytes, *, sync: bool = True) -> None:
    write_atomically(path, lambda f: f.write(data), sync=sync)


def write_json(path: Path, data: Any, *, indent: int = 1, sync: bool = False) -> None:
    """``data`` as JSON; not synced by default (a table refreshed every second)."""
    write_bytes(path, json.dumps(data, indent=indent).encode("utf-8"), sync=sync)


def last_lines(path: Path, n: int, block: int = 8192) -> list[str]:
    """The last ``n`` lines of a text file, reading only as much of its end as they need (a
    long run's ``metrics.jsonl`` or log is large). A last line without its newline yet is one
    of them: a log's line is shown as far as it is written. Reads back in doubling blocks, each
    byte once, so many lines cost about as much as reading them."""
    if n <= 0:
        return []
    try:
        with open(path, "rb") as f:
            pos = end = f.seek(0, os.SEEK_END)
            chunks: list[bytes] = []
            newlines = 0
            while pos > 0 and newlines <= n:
                start = max(0, pos - max(block, end - pos))
                f.seek(start)
                chunks.append(f.read(pos - start))
                newlines += chunks[-1].count(b"\n")
                pos = start
    except OSError:
        return []
    return b"".join(reversed(chunks)).decode("utf-8", errors="replace").splitlines()[-n:]


_NAME_GONE = (errno.ENOENT, errno.ENOTDIR, errno.ESTALE)
"""How ``stat`` says a path names nothing (ESTALE: removed on the NFS server)."""


class FolderGuard:
    """Runs the controller's writes to a run folder. The first one that fails (a full disk, a
    read-only mount) is logged once, in one line naming the file, and ``on_error(error, by)``
    decides what follows (the controller stops the run with it, naming ``by``, the worker whose
    write failed, or the controller); later ones are quiet.

    A folder removed while the run goes on (``rm -rf`` of the wrong folder, a cleanup job) fails
    the same way, and nothing more is written: before, ``metrics.jsonl`` went on into its
    unlinked file, the next writes made a new folder of the same name holding a summary and a
    few files, and the run exited 0 as if its record were whole. The guard holds the folder
    open, so one removed and made again under its name (the parameter service's next checkpoint
    makes its folders) is not taken for it: the held one's inode cannot be reused meanwhile.
    It also holds the files :meth:`keep` names, for an ``rm -rf`` that empties the folder but
    cannot remove it (a worker wrote a checkpoint in it meanwhile): the run then went on for
    ever, writing its record into an unlinked file."""

    def __init__(self, run_dir: Path, on_error: Callable[[RunFolderError, str], None]):
        self.run_dir = Path(run_dir)
        self.on_error = on_error
        self.error: RunFolderError | None = None
        """The first failure, if any: what a run that stops for it reports."""
        self.gone = False
        """The folder was removed: nothing more is written (a write would make it again)."""
        try:  # held open, the folder's inode is never reused by another while the run goes on
            self._fd: int | None = os.open(self.run_dir, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            self._fd = None
        self._kept: dict[Path, int] = {}

    def keep(self, path: Path) -> None:
        """Hold ``path``, a file the run keeps writing (``metrics.jsonl``): once its name no
        longer leads to it, the folder is taken as emptied."""
        with contextlib.suppress(OSError):  # not there: nothing to hold
            self._kept[Path(path)] = os.open(path, os.O_RDONLY)

    def write(self, write: Callable[[], Any]) -> bool:
        """Do one write; False when the folder refused it, or is no longer the run's."""
        if self.gone:
            return False
        where = self._where()
        if where in ("missing", "emptied"):
            return self._gone(where)
        try:
            write()
        except RunFolderError as e:  # an atomic write already named its file
            self.failed(e)
            return False
        except OSError as e:
            self.failed(RunFolderError.from_os_error(self.run_dir, e))
            return False
        # Another folder under the name (one the parameter service's next checkpoint made, a
        # mount over it): its own refusal, if it refuses (read-only), says more; else this.
        if where == "another":
            return self._gone(where)
        return True

    def _where(self) -> str:
        """``"here"``, ``"missing"`` (nothing at its path), ``"another"`` folder there, or
        ``"emptied"`` (here, but a kept file was removed)."""
        if self._fd is None:
            return "here"  # it did not exist when the guard was made: nothing to compare
        held = os.fstat(self._fd)
        try:
            now = os.stat(self.run_dir)
        except OSError:
            return "missing"
        if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            return "another"
        return "emptied" if self._unlinked() else "here"

    def _unlinked(self) -> list[str]:
        """Kept files no longer at their paths. By name, not by link count: NFS keeps a removed
        file that is still open linked (as ``.nfsXXXX``)."""
        return [path.name for path, fd in self._kept.items() if not _same(path, fd)]

    def _removal(self, error: RunFolderError) -> str | None:
        """How the folder is gone, or going, if it is: a path of the run that vanished under a
        write (``logs/`` emptied and unlinked first) is how ``rm -rf`` of the folder starts, so
        such a failure waits a moment for the rest of it before it is taken at its word."""
        where = self._where()
        if where in ("missing", "emptied"):
            return where
        if os.strerror(errno.ENOENT) not in str(error):
            return None
        deadline = time.monotonic() + REMOVAL_WAIT_S
        while where == "here" and time.monotonic() < deadline:
            time.sleep(0.05)
            where = self._where()
        return None if where == "here" else where

    def close(self) -> None:
        for fd in [self._fd, *self._kept.values()]:
            if fd is not None:
                os.close(fd)
        self._fd, self._kept = None, {}

    def _gone(self, where: str, by: str = "controller") -> bool:
        self.gone = True
        lost = "its metrics, logs and checkpoints went with it"
        what = "was removed while the run went on"
        if where == "emptied":  # perhaps only the kept file went: say what is known
            gone = ", ".join(self._unlinked())
            what = f"was emptied while the run went on ({gone} removed)"
            lost = f"the run's record is no longer whole ({gone} cannot be written again)"
        elif where == "another":
            what += " (a folder of that name is there again, not the run's)"
        self.failed(RunFolderError(
            f"the run folder {self.run_dir} {what}: {lost}; the run stops (start it again)"
        ), by)  # fmt: skip
        return False

    def failed(self, error: RunFolderError, by: str = "controller") -> None:
        """A write failed here, or in worker ``by`` (which reported it). A folder removed while
        the write ran (``rm -rf`` takes a while) fails it with a bare "No such file" that hides
        the cause: the removal is named instead. (A mount over it says more in its own words.)"""
        removal = None if self.gone or self.error is not None else self._removal(error)
        if removal is not None:
            self._gone(removal, by)
            return
        if self.error is None:
            self.error = error
            logger.error("%s", error)
        self.on_error(error, by)


def _same(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``. A ``stat`` that fails for another
    reason than the name being gone (a disk error, a permission changed) proves nothing: the
    write that follows reports its own failure."""
    try:
        now = os.stat(path)
    except OSError as e:
        return e.errno not in _NAME_GONE
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)
