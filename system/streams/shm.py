"""Weights through shared memory, for a publisher, parameter service and subscribers on one host.

A version travels as one file in a shared-memory directory (``/dev/shm`` by default), written
once by the publisher and then only mapped: the service keeps the read-only mapping as the stored
version, and each subscriber maps it privately (copy-on-write) and hands out arrays that are
views onto it. Only a small message crosses the sockets: the file's name and its layout
``{"name", "size", "header", "frames"}`` (``header``: the wire codec's header of the parameters,
``frames``: ``[offset, length]`` of each array). The arrays are decoded by the wire codec from
those frames, so a shared-memory version is checked exactly like one that came over a socket.

Files, all mode 0600, in the directory, ``<token>`` being 16 hex digits fresh for each service
(so one run's files share a prefix, and no two runs' names meet)::

    troupe-<token>.lock                             held (flock) by the live service; a probe
    troupe-<token>-<policy>-v00000042-<hex>.params  one version, never modified once named
    troupe-<token>-<hex>.part                       being written, or allocated for the next one

Who may use it: a peer decides from the service's ``hello`` (:meth:`ShmArea.info`): the same boot
id, the service's directory is the peer's own configured one (same device and inode), and the
service's lock file is readable there with the probe it holds. Anything else (another host,
another container's ``/dev/shm``, another user) uses the socket as before. ``TROUPE_SHM_DIR``
names another directory, or turns shared memory off (``off``).

Lifetime: the service owns every file once it acknowledged its publish. It unlinks a version when
the store drops it from memory, its own leftovers (unacknowledged publishes) after
:data:`STALE_AGE_S`, everything it made when it closes, and, when it starts and closes, the files
of services that died (their lock is free). A reader that still maps an unlinked file keeps
reading it (Linux semantics); a reader that comes too late to open one gets FileNotFoundError.

Every name and layout that arrives in a message is checked before a file is opened: a name must
be a plain file name of the expected service, policy and version (so no path, no ``..``), the
file must be a regular file of this user, of the announced size, starting with :data:`MAGIC`,
and every frame must lie inside it. What fails raises WireError (or OSError from the system).

Longer than 400 lines because the file format, the locking that tells a live file from a stale one,
and cleanup are one protocol; each half is wrong without the other.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import mmap
import os
import re
import secrets
import stat
import time
from pathlib import Path
from typing import Any

import numpy as np

from api.namedarray import NamedArray
from system.errors import WireError
from system.streams import wire

logger = logging.getLogger(__name__)

ENV_DIR = "TROUPE_SHM_DIR"
DEFAULT_DIR = "/dev/shm"
MAGIC = b"TRPSHM01"
ALIGN = 64
"""Every array starts at a multiple of this many bytes (a cache line; any dtype is aligned)."""
STALE_AGE_S = 60.0
"""A file of no live service (or an unacknowledged one of this service) older than this goes."""
MAX_FRAMES = 1 << 20
MAX_SIZE = 1 << 40
_OFF = frozenset(("", "0", "off", "no", "none", "false"))
_OWNED_RE = re.compile(r"troupe-([0-9a-f]{16})(?:[.-].*)?", re.DOTALL)
_LAYOUT_KEYS = frozenset(("name", "size", "header", "frames"))
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14


def configured_dir() -> Path | None:
    """The shared-memory directory to use: ``$TROUPE_SHM_DIR`` or ``/dev/shm``; None if that
    is turned off, missing or not writable."""
    value = os.environ.get(ENV_DIR)
    if value is not None and value.strip().lower() in _OFF:
        return None
    path = Path(value if value is not None else DEFAULT_DIR)
    return path if path.is_dir() and os.access(path, os.W_OK | os.X_OK) else None


def boot_id() -> str | None:
    """This kernel's boot id: equal for every process (and container) of one host boot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


# ------------------------------------------------------------------------------------- peers
class ShmPeer:
    """One service's shared-memory files, as a publisher, subscriber or the service sees them."""

    def __init__(self, directory: str | os.PathLike, prefix: str):
        if not re.fullmatch(r"troupe-[0-9a-f]{16}", prefix):
            raise ValueError(f"not a shared-memory prefix: {prefix!r}")
        self.dir = Path(directory)
        self.prefix = prefix
        self._spare: tuple[int, Path] | None = None  # see prepare()

    def __repr__(self) -> str:
        return f"ShmPeer({str(self.dir)!r}, {self.prefix!r})"

    # ------------------------------------------------------------------------------- write
    def write(self, policy: str, version: int, params: Any) -> dict[str, Any]:
        """Write ``params`` into a new file; return its layout (what a message carries).

        ``policy`` and ``version`` must already be valid (they become part of the name). Raises
        WireError for parameters the wire codec refuses, OSError when the file cannot be
        written (the directory full, say); no file is left behind then.
        """
        return self.write_frames(policy, version, wire.encode("params", params))

    def write_frames(self, policy: str, version: int, frames: list) -> dict[str, Any]:
        """:meth:`write` for parameters already encoded (``wire.encode("params", ...)``)."""
        header, arrays = frames[0], frames[1:]
        placed, offset = [], ALIGN
        for array in arrays:
            placed.append([offset, int(array.nbytes)])
            offset = _aligned(offset + int(array.nbytes))
        size = offset
        name = f"{self.prefix}-{policy}-v{version:08d}-{secrets.token_hex(8)}.params"
        fd, tmp = self._blank(size)
        try:
            try:
                _write_all(fd, MAGIC, 0)
                for (at, _), array in zip(placed, arrays, strict=True):
                    _write_all(fd, memoryview(array).cast("B"), at)
            finally:
                os.close(fd)
            os.rename(tmp, self.dir / name)
        except BaseException:
            _unlink(tmp)
            raise
        return {"name": name, "size": size, "header": bytes(header), "frames": placed}

    def prepare(self, size: int) -> None:
        """Allocate now the file that the next :meth:`write` of ``size`` bytes fills, so that
        it only copies then (allocating shared-memory pages costs about a third of filling
        them). Best effort; call it when nothing is waiting, after a publish."""
        if self._spare is None:
            with contextlib.suppress(OSError):
                self._spare = self._create(size)

    def close(self) -> None:
        """Remove the file :meth:`prepare` allocated, if unused."""
        spare, self._spare = self._spare, None
        if spare is not None:
            os.close(spare[0])
            _unlink(spare[1])

    def _blank(self, size: int) -> tuple[int, Path]:
        """An open, allocated file of ``size`` bytes under a temporary name: the prepared one
        if it fits and is still there (the service removes files unused for long), else new."""
        spare, self._spare = self._spare, None
        if spare is not None:
            fd, tmp = spare
            try:
                info = os.fstat(fd)
                if info.st_nlink > 0 and info.st_size == size:
                    return fd, tmp
            except OSError:
                pass
            os.close(fd)
            _unlink(tmp)
        return self._create(size)

    def _create(self, size: int) -> tuple[int, Path]:
        tmp = self.dir / f"{self.prefix}-{secrets.token_hex(8)}.part"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(tmp, flags, 0o600)
        try:
            _allocate(fd, size)
        except BaseException:
            os.close(fd)
            _unlink(tmp)
            raise
        return fd, tmp

    # -------------------------------------------------------------------------------- read
    def check(self, layout: Any, policy: str, version: int) -> tuple[str, int, bytes, list]:
        """``(name, size, header, frames)`` of a layout from a message, or WireError."""
        if type(layout) is not dict or set(layout) != _LAYOUT_KEYS:
            keys = sorted(map(str, layout)) if isinstance(layout, dict) else type(layout).__name__
            raise WireError(f"shared-memory layout must have keys {sorted(_LAYOUT_KEYS)}: {keys}")
        name, size, header, frames = (layout[k] for k in ("name", "size", "header", "frames"))
        expected = f"{self.prefix}-{policy}-v{version:08d}-"
        if (
            type(name) is not str
            or not name.startswith(expected)
            or not re.fullmatch(r"[0-9a-f]{16}\.params", name[len(expected) :])
        ):
            raise WireError(
                f"shared-memory file name {name!r} is not one of this service's files for "
                f"version {version} of '{policy}' ({expected}<16 hex>.params)"
            )
        if type(size) is not int or not ALIGN <= size <= MAX_SIZE:
            raise WireError(f"shared-memory file size {size!r} is out of range")
        if type(header) is not bytes:
            raise WireError("shared-memory layout has no bytes 'header'")
        if type(frames) is not list or len(frames) > MAX_FRAMES:
            raise WireError("shared-memory layout 'frames' is not a list of [offset, length]")
        end = len(MAGIC)
        for frame in frames:
            if (
                type(frame) is not list
                or len(frame) != 2
                or any(type(x) is not int for x in frame)
                or frame[0] < end
                or frame[1] < 0
                or frame[0] + frame[1] > size
            ):
                raise WireError(
                    f"shared-memory frame {frame!r} overlaps another or lies outside the "
                    f"{size}-byte file"
                )
            end = frame[0] + frame[1]
        return name, size, header, frames

    def open(self, layout: Any, policy: str, version: int, *, writable: bool) -> Any:
        """The parameters a layout describes, as arrays onto the mapped file.

        ``writable``: a private copy-on-write mapping, so the arrays are writable and writing
        changes nobody else's view; else a shared read-only mapping and read-only arrays.
        Raises WireError for a malformed layout or file, OSError (FileNotFoundError when the
        version was dropped meanwhile) when it cannot be opened.
        """
        name, size, header, frames = self.check(layout, policy, version)
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        fd = os.open(self.dir / name, flags)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                raise WireError(f"shared-memory file {name} is not a regular file of this user")
            if info.st_size != size:
                raise WireError(
                    f"shared-memory file {name} holds {info.st_size} bytes, layout says {size}"
                )
            if writable:
                mapping = mmap.mmap(
                    fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
                )
            else:
                mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        if mapping[: len(MAGIC)] != MAGIC:
            raise WireError(f"shared-memory file {name} does not start with {MAGIC!r}")
        if writable:
            _populate(mapping)
        view = memoryview(mapping)
        try:
            params = wire.decode([header, *(view[at : at + n] for at, n in frames)]).body
        except WireError as e:
            raise WireError(f"shared-memory file {name}: {e}") from e
        return make_writable(params) if writable else params

    def discard(self, layout: Any) -> None:
        """Unlink the file of a layout this process wrote (best effort, names checked)."""
        name = layout.get("name") if isinstance(layout, dict) else None
        if type(name) is str and _OWNED_RE.fullmatch(name) and name.startswith(self.prefix + "-"):
            _unlink(self.dir / name)


def peer_from_info(info: Any) -> ShmPeer | None:
    """The service's files if this process shares its shared-memory directory, else None.

    ``info`` is what the service's ``hello`` carries (:meth:`ShmArea.info`); every check must
    hold: shared memory on here too, the same boot id, the service's directory is this
    process's configured one (same device and inode), and the service's lock file is readable
    here with the probe the service put in it. Files are then only ever opened in this
    process's own configured directory, whatever path the service named.
    """
    mine = configured_dir()
    if not isinstance(info, dict) or mine is None:
        return None
    prefix, probe = info.get("prefix"), info.get("probe")
    if not (type(prefix) is str and type(probe) is str and probe):
        return None
    if info.get("boot") != boot_id() or not re.fullmatch(r"troupe-[0-9a-f]{16}", prefix):
        return None
    try:
        here = os.stat(mine)
        if (here.st_dev, here.st_ino) != (info.get("dev"), info.get("ino")):
            return None
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        fd = os.open(mine / f"{prefix}.lock", flags)
        try:
            content = os.read(fd, 4096)
        finally:
            os.close(fd)
        if json.loads(content).get("probe") != probe:
            return None
    except (OSError, ValueError, AttributeError):
        return None
    return ShmPeer(mine, prefix)


# -------------------------------------------------------------------------------- service
class ShmArea:
    """The parameter service's side: its lock, its files, their cleanup.

    Creating one removes the files of dead services from ``directory`` and takes a fresh token
    and lock; :meth:`close` removes every file of this service. Raises OSError if the directory
    cannot hold the lock (the service then goes without shared memory).
    """

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        boot = boot_id()
        if boot is None:
            raise OSError(errno.ENOENT, "no boot id: cannot tell which processes share this host")
        self.boot = boot
        self.probe = secrets.token_hex(16)
        self.peer = ShmPeer(self.dir, f"troupe-{secrets.token_hex(8)}")
        self.prefix = self.peer.prefix
        self.adopted: set[str] = set()
        self.removed_stale = remove_stale(self.dir)
        self._lock_fd: int | None = self._lock()
        here = os.stat(self.dir)
        self._dev, self._ino = here.st_dev, here.st_ino

    def _lock(self) -> int:
        # Locked before it gets its real name, so no one ever sees it unlocked while we live.
        tmp = self.dir / f"{self.prefix}.lock.part"
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(tmp, flags, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _write_all(fd, json.dumps({"probe": self.probe, "pid": os.getpid()}).encode(), 0)
            os.rename(tmp, self.dir / f"{self.prefix}.lock")
        except BaseException:
            os.close(fd)
            _unlink(tmp)
            raise
        return fd

    def info(self) -> dict[str, Any]:
        """What a ``hello`` reply carries, for :func:`peer_from_info`."""
        return {
            "boot": self.boot,
            "dir": str(self.dir),
            "dev": self._dev,
            "ino": self._ino,
            "prefix": self.prefix,
            "probe": self.probe,
        }

    def open(self, layout: Any, policy: str, version: int) -> Any:
        """Map a published file read-only; refuse (WireError) anything else, missing included."""
        try:
            return self.peer.open(layout, policy, version, writable=False)
        except OSError as e:
            raise WireError(
                f"shared-memory file {layout.get('name')!r} cannot be opened: {e.strerror or e}"
            ) from e

    def adopt(self, name: str) -> None:
        self.adopted.add(name)

    def release(self, name: str) -> None:
        """Unlink a file of this service (adopted or not); readers that map it keep it."""
        self.adopted.discard(name)
        _unlink(self.dir / name)

    def sweep(self, min_age_s: float = STALE_AGE_S) -> int:
        """Unlink this service's files that it never adopted (a publisher died or timed out
        mid-publish) once older than ``min_age_s``; returns how many."""
        now, removed = time.time(), 0
        for name in _names(self.dir):
            if not name.startswith(self.prefix + "-") or name in self.adopted:
                continue
            try:
                if now - os.lstat(self.dir / name).st_mtime >= min_age_s:
                    removed += _unlink(self.dir / name)
            except OSError:
                continue
        return removed

    def close(self) -> None:
        """Unlink every file of this service and its lock; then sweep dead services' too."""
        if self._lock_fd is None:
            return
        for name in _names(self.dir):
            if name.startswith(self.prefix + "-") or name == f"{self.prefix}.lock.part":
                _unlink(self.dir / name)
        self.adopted.clear()
        _unlink(self.dir / f"{self.prefix}.lock")
        os.close(self._lock_fd)
        self._lock_fd = None
        remove_stale(self.dir)


def remove_stale(directory: str | os.PathLike, min_age_s: float = STALE_AGE_S) -> int:
    """Unlink the files of parameter services that are gone; returns how many.

    A service is gone when its lock file can be locked (the kernel releases a dead process's
    lock, SIGKILL included); files with no lock file at all go once older than ``min_age_s``.
    Live services' files are never touched.
    """
    directory = Path(directory)
    groups: dict[str, list[str]] = {}
    for name in _names(directory):
        match = _OWNED_RE.fullmatch(name)
        if match:
            groups.setdefault(match.group(1), []).append(name)
    removed, now = 0, time.time()
    for token, names in groups.items():
        lock = f"troupe-{token}.lock"
        if lock not in names:
            for name in names:
                try:
                    old = now - os.lstat(directory / name).st_mtime >= min_age_s
                except OSError:
                    continue
                if old:
                    removed += _unlink(directory / name)
            continue
        fd = _lock_if_free(directory / lock)
        if fd is None:
            continue  # its service is alive
        try:
            for name in names:
                if name != lock:
                    removed += _unlink(directory / name)
            removed += _unlink(directory / lock)
        finally:
            os.close(fd)
    if removed:
        logger.info("removed %d shared-memory file(s) of stopped runs from %s", removed, directory)
    return removed


# ------------------------------------------------------------------------------------ helpers
def _lock_if_free(path: Path) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _names(directory: Path) -> list[str]:
    try:
        return [entry.name for entry in os.scandir(directory) if entry.name.startswith("troupe-")]
    except OSError:
        return []


def _unlink(path: Path) -> int:
    try:
        os.unlink(path)
        return 1
    except OSError:
        return 0


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


def _allocate(fd: int, size: int) -> None:
    """Reserve the file's pages in one go (faster than page by page, and a full directory
    fails here rather than as SIGBUS later)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, size)


def _write_all(fd: int, data: Any, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view.nbytes:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _populate(mapping: mmap.mmap) -> None:
    """Map every page now, in one call, instead of a fault per page as the arrays are read."""
    with contextlib.suppress(OSError, ValueError):
        mapping.madvise(_MADV_POPULATE_READ)


def make_writable(value: Any) -> Any:
    """``value`` with every decoded array in it writable: arrays whose memory is this process's
    own (a private mapping, a received message) are only marked so; the rest (small arrays the
    codec decoded from the header's bytes) are copied."""
    if isinstance(value, np.ndarray):
        if not value.flags.writeable:
            try:
                value.flags.writeable = True
            except ValueError:
                return value.copy()
        return value
    if type(value) is dict:
        return {k: make_writable(v) for k, v in value.items()}
    if type(value) is list:
        return [make_writable(v) for v in value]
    if type(value) is tuple:
        return tuple(make_writable(v) for v in value)
    if isinstance(value, NamedArray):
        return value.apply(make_writable)
    return value
