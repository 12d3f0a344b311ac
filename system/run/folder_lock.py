"""One owner per run folder: an exclusive ``flock`` on a file inside it, held for the whole run.

Two controllers writing one folder interleave ``metrics.jsonl`` (frames go backwards), race for
the same checkpoints and both print one summary. So ``troupe run``, ``--resume`` and
``troupe.train`` take this lock before they write anything, and a second one on a held folder is
refused at once, naming the process that holds it.

The lock belongs to the open file, so the controller process forked from the launching one
holds it too: it stays held while either lives, and the kernel releases it when both are gone,
whatever killed them (no stale lock file to clean up after a crash: the file may remain, the
lock does not). A process that launches several runs (a notebook) holds each folder's lock once
and releases it with :func:`release` when that run ends; taking a folder it holds already, for
a run it started that still goes on, is refused as from another process. On a filesystem
without ``flock`` (some network mounts) the lock is skipped with a warning, as nothing can be
promised there.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from api.errors import RunFolderError, UserError
from system import run_folder

logger = logging.getLogger(__name__)

LOCK_FILE = run_folder.LOCK
ENV_HELD = "TROUPE_RUN_FOLDER_LOCKED"
"""Set (to 1) for a controller whose launcher holds the folder's lock for it: ``troupe run
--launcher docker`` holds it on the host while the controller runs in a container."""

_held: dict[Path, IO[str]] = {}
"""The locks this process holds, by resolved folder."""
_runs: dict[Path, Callable[[], bool]] = {}
"""For a held folder whose run this process started in the background: whether it still runs."""


class RunFolderBusyError(UserError):
    """Another process holds the run folder's lock."""


SCHEDULER_WAIT_S = 180.0
"""How long a controller started by a scheduler (``troupe controller``) waits for a held lock.
One started again on another node after its node was lost finds the lock of the controller
that ran there held by the file server (NFS) until that client's lease expires (90 s by
default); it was refused at once, and its scheduler's restarts spent on that. A lock still held
after the wait is a live controller: refused, as ever."""
LOCK_RETRY_S = 1.0


def acquire(folder: Path, wait_s: float = 0.0) -> None:
    """Hold ``folder``'s lock from now until :func:`release` or this process (and the
    processes it forks) end; raise :class:`RunFolderBusyError` naming the holder's pid.
    ``wait_s``: how long a lock another process holds is waited for (0: refused at once)."""
    key = folder.resolve()
    if os.environ.get(ENV_HELD) == "1":
        return
    if key in _held:
        running = _runs.get(key)
        if running is None or running():  # a second controller in this process: refused too
            raise RunFolderBusyError(
                f"run folder {folder} is in use by a run this process (pid {os.getpid()}) "
                "started; wait for it to end (result.wait()) or stop it (result.stop()) first"
            )
        release(folder)  # a background run that ended without anyone waiting for it
    path = folder / LOCK_FILE
    try:
        f = open(path, "a+")  # noqa: SIM115 - held open for the run's whole life
    except OSError as e:  # the folder is named: the lock file is ours, not the user's
        raise RunFolderError.from_os_error(folder, e) from e
    try:
        _flock_within(f, folder, wait_s)
    except BlockingIOError:
        holder = _holder(f)
        f.close()
        raise RunFolderBusyError(
            f"run folder {folder} is in use by {holder} (another `troupe run` or `--resume` of "
            "it); wait for that run to end or stop it, or pick another --run-dir"
        ) from None
    except OSError as e:
        if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            f.close()
            raise RunFolderError.from_os_error(folder, e) from e
        logger.warning("%s cannot be locked here (%s); make sure one run uses it", folder, e)
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    _held[key] = f


def _flock_within(f: IO[str], folder: Path, wait_s: float) -> None:
    """Take the exclusive lock, trying again for up to ``wait_s`` while another holds it
    (raises ``BlockingIOError`` once that is over)."""
    deadline, said = time.monotonic() + wait_s, False
    while True:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            if said:
                logger.info("took the lock of run folder %s", folder)
            return
        except BlockingIOError:
            if time.monotonic() + LOCK_RETRY_S > deadline:
                raise
            if not said:
                logger.warning(
                    "run folder %s is locked by %s: waiting up to %.0fs for it (a controller "
                    "lost with its node holds it until its file server's lease expires)",
                    *(folder, _holder(f), wait_s),
                )
                said = True
            time.sleep(LOCK_RETRY_S)


def held_by_run(folder: Path, running: Callable[[], bool]) -> None:
    """The run holding ``folder`` (taken by this process) runs in the background: once
    ``running()`` says it has ended, this process may take the folder again."""
    _runs[folder.resolve()] = running


def release(folder: Path) -> None:
    """Give ``folder``'s lock up (the run it was taken for has ended)."""
    _runs.pop(folder.resolve(), None)
    f = _held.pop(folder.resolve(), None)
    if f is not None:
        f.close()


def _holder(f: IO[str], wait_s: float = 1.0) -> str:
    """Who holds the lock, as its pid in the file says. The holder writes its pid just after
    it takes the lock, so a run started at the same instant may find the file still empty:
    it reads again for up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        f.seek(0)
        text = f.read().strip()
        if text.isdigit():
            return f"process {text}"
        if time.monotonic() >= deadline:
            return "another process"
        time.sleep(0.02)


def holder(folder: Path) -> int | None:
    """The pid of the process holding ``folder``'s lock, or None when nobody holds it (what
    ``troupe status`` tells a run that still goes on from one that has ended)."""
    path = Path(folder) / LOCK_FILE
    if not path.exists() or Path(folder).resolve() in _held:
        return None
    try:
        with open(path) as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                text = f.read().strip()
                return int(text) if text.isdigit() else None
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    except OSError:
        return None
    return None
