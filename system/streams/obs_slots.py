"""Large observation arrays through shared memory, between processes of one host.

An actor's rollout requests and sample chunks carry its observations: on Pong, 28 KiB a frame,
which over a socket the kernel copies in and out again, and ZeroMQ once more on receive. When
sender and receiver share a host, the sender writes the array once into a *slot* of a ring file
of its own in the parameter service's shared-memory directory (:mod:`system.streams.shm`: the
same directory, lock files and cleanup of dead owners' files) and the message carries only a
small descriptor ``{ring, slot, stamp, offset, dtype, shape}``.

Who owns what: each actor process has one :class:`SlotWriter` holding a :class:`ShmArea` (its
lock and file prefix). Its ring files are ``<prefix>-obs-<16 hex>.ring``; the writer unlinks them
when it closes, and a killed actor's files go when the next area is created or closed on this
host (the restarted actor's, the parameter service's at the end of the run): their lock is free.

Safe reuse of a slot. A slot's header holds a *stamp*: the writer zeroes it, writes the data,
then writes the new stamp; the descriptor carries that stamp. A reader that copies the data out
checks the stamp before and after (:meth:`SlotReader.copy`): if it changed, the slot was reused
meanwhile and the chunk is dropped (counted), never trained on. The streams free slots by their
protocol: an inference slot (one per environment group and policy) is rewritten only after the
reply to its request came; a sample slot only after its chunk was acked (or given up as lost).

Whether to use it is decided per connection, by an offer: until the receiver has answered that it
can map the sender's area (:func:`system.streams.shm.peer_from_info`: same boot, same directory,
the lock readable with its probe), messages carry frames and the offer; across hosts or
containers the answer is no, and frames it stays. ``TROUPE_SHM_DIR=off`` turns it off, and
arrays below ``TROUPE_SHM_OBS_MIN_BYTES`` (default :data:`OBS_MIN_BYTES`) always go as frames.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import mmap
import os
import re
import secrets
import stat
from typing import Any

import numpy as np

from system.errors import WireError
from system.streams import shm

logger = logging.getLogger(__name__)

OBS_MIN_BYTES = 64 * 1024
"""Arrays smaller than this go as socket frames (pyzmq copies such frames anyway, and a slot's
bookkeeping costs about what copying 64 KiB does)."""
HEADER = 64
"""Bytes before the first slot: magic, slot count, slot size. Each slot then starts with a
:data:`HEADER`-byte header (its stamp) before its data."""
MAX_OPEN_RINGS = 64
"""Mappings a reader keeps open (rings of restarted actors fall out of it)."""
_DESC_KEYS = frozenset(("ring", "slot", "stamp", "dtype", "shape"))
_RING_RE = re.compile(r"(troupe-[0-9a-f]{16})-obs-[0-9a-f]{16}\.ring")


def min_bytes() -> int:
    value = os.environ.get("TROUPE_SHM_OBS_MIN_BYTES", "").strip()
    try:
        return int(value) if value else OBS_MIN_BYTES
    except ValueError:
        logger.warning("ignoring TROUPE_SHM_OBS_MIN_BYTES=%r: not an integer", value)
        return OBS_MIN_BYTES


# --------------------------------------------------------------------------------- writer
class Ring:
    """One file of ``count`` slots of ``slot_bytes``, mapped read-write by its writer."""

    def __init__(self, area: shm.ShmArea, count: int, slot_bytes: int):
        self.count, self.slot_bytes = count, _aligned(slot_bytes)
        self.stride = HEADER + self.slot_bytes
        size = HEADER + count * self.stride
        self.name = f"{area.prefix}-obs-{secrets.token_hex(8)}.ring"
        self.path = area.dir / self.name
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(self.path, flags, 0o600)
        try:
            shm._allocate(fd, size)
            self.map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        except BaseException:
            os.close(fd)
            shm._unlink(self.path)
            raise
        os.close(fd)
        head = np.frombuffer(self.map, np.uint64, 3, len(shm.MAGIC))
        self.map[: len(shm.MAGIC)] = shm.MAGIC
        head[:] = (count, self.slot_bytes, 0)
        self.stamps = [np.frombuffer(self.map, np.uint64, 1, self._base(i)) for i in range(count)]
        self.next_stamp = 1

    def _base(self, slot: int) -> int:
        return HEADER + slot * self.stride

    def put(self, slot: int, array: np.ndarray) -> dict[str, Any]:
        """Copy ``array`` into ``slot`` (stamped); its descriptor."""
        stamp, self.next_stamp = self.next_stamp, self.next_stamp + 1
        self.stamps[slot][0] = 0  # a reader that overlaps this write sees the stamp change
        start = self._base(slot) + HEADER
        out = np.frombuffer(self.map, np.uint8, array.nbytes, start)
        np.copyto(out, np.ascontiguousarray(array).reshape(-1).view(np.uint8))
        self.stamps[slot][0] = stamp
        shape = [int(n) for n in array.shape]
        return {"ring": self.name, "slot": slot, "stamp": stamp, "dtype": array.dtype.str,
                "shape": shape}  # fmt: skip

    def close(self) -> None:
        self.stamps = []
        with contextlib.suppress(BufferError):  # a view still exported: it keeps the mapping
            self.map.close()
        shm._unlink(self.path)


class SlotWriter:
    """An actor's rings: one per purpose (``inference``, ``samples``), made on first use and
    remade larger when an array outgrows its slots."""

    def __init__(self, directory: os.PathLike | str | None = None):
        directory = directory if directory is not None else shm.configured_dir()
        if directory is None:
            raise OSError("shared memory is off (TROUPE_SHM_DIR) or its directory is missing")
        self.area = shm.ShmArea(directory)
        self.info = self.area.info()
        """What an offer carries: the area's identity, for :func:`shm.peer_from_info`."""
        self.min_bytes = min_bytes()
        self.rings: dict[str, Ring] = {}
        self.bytes_written = 0

    def wants(self, array: Any) -> bool:
        return isinstance(array, np.ndarray) and array.nbytes >= max(1, self.min_bytes)

    def put(self, purpose: str, slots: int, slot: int, array: np.ndarray) -> dict | None:
        """Write ``array`` into slot ``slot`` of the ``purpose`` ring (of ``slots`` slots);
        None when shared memory fails (the caller sends frames)."""
        ring = self.rings.get(purpose)
        try:
            if ring is None or ring.count < slots or ring.slot_bytes < array.nbytes:
                if ring is not None:
                    ring.close()
                ring = self.rings[purpose] = Ring(self.area, slots, array.nbytes)
            described = ring.put(slot, array)
        except OSError as e:  # a full directory: frames it is
            logger.warning("observations go over the socket: shared memory failed: %s", e)
            self.rings.pop(purpose, None)
            return None
        self.bytes_written += array.nbytes
        return described

    def close(self) -> None:
        for ring in self.rings.values():
            ring.close()
        self.rings.clear()
        self.area.close()


# --------------------------------------------------------------------------------- reader
class SlotReader:
    """The receiving side: answers offers, maps rings (read-only, cached), reads slots."""

    def __init__(self) -> None:
        self.enabled = shm.configured_dir() is not None
        self._peers: dict[str, shm.ShmPeer | None] = {}
        self._probes: dict[str, str] = {}
        self._rings: collections.OrderedDict[str, tuple[mmap.mmap, int, int]] = (
            collections.OrderedDict()
        )
        self.bytes_copied = 0

    def accepts(self, offer: Any) -> bool:
        """Whether this process can map the area an offer describes (cached per prefix)."""
        if not self.enabled or not isinstance(offer, dict):
            return False
        prefix, probe = offer.get("prefix"), offer.get("probe")
        if type(prefix) is not str or type(probe) is not str:
            return False
        if self._probes.get(prefix) != probe:  # checked once per area (and its probe)
            if len(self._peers) > 4 * MAX_OPEN_RINGS:
                self._peers.clear()
                self._probes.clear()
            self._peers[prefix] = shm.peer_from_info(offer)
            self._probes[prefix] = probe
        return self._peers[prefix] is not None

    def view(self, desc: Any) -> np.ndarray:
        """The array a descriptor names, read-only, onto the mapped slot (no copy). Raises
        WireError for a descriptor that is malformed, foreign or out of bounds."""
        if type(desc) is not dict or set(desc) != _DESC_KEYS:
            raise WireError(f"observation descriptor must have keys {sorted(_DESC_KEYS)}")
        mapping, count, slot_bytes = self._ring(desc["ring"])
        slot, dtype, shape = desc["slot"], desc["dtype"], desc["shape"]
        if type(slot) is not int or not 0 <= slot < count:
            raise WireError(f"observation slot {slot!r} is not one of the ring's {count}")
        try:
            dtype = np.dtype(dtype) if type(dtype) is str else None
        except TypeError:
            dtype = None
        if dtype is None or dtype.kind not in "biuf" or type(shape) is not list:
            raise WireError("observation descriptor needs a numeric 'dtype' and a 'shape' list")
        if any(type(n) is not int or n < 0 for n in shape) or len(shape) > 32:
            raise WireError(f"observation shape {shape!r} is not a list of sizes")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes > slot_bytes:
            raise WireError(f"observation of {nbytes} bytes does not fit a {slot_bytes}-byte slot")
        start = HEADER + slot * (HEADER + slot_bytes) + HEADER
        return np.frombuffer(mapping, dtype, nbytes // dtype.itemsize, start).reshape(shape)

    def stamp(self, desc: dict) -> int:
        mapping, _, slot_bytes = self._ring(desc["ring"])
        at = HEADER + desc["slot"] * (HEADER + slot_bytes)
        return int(np.frombuffer(mapping, np.uint64, 1, at)[0])

    def copy(self, desc: Any) -> np.ndarray | None:
        """A private copy of the array a descriptor names; None when the slot was reused
        before the copy was complete (its stamp changed)."""
        view = self.view(desc)
        if self.stamp(desc) != desc["stamp"]:
            return None
        out = view.copy()
        if self.stamp(desc) != desc["stamp"]:
            return None
        self.bytes_copied += out.nbytes
        return out

    def _ring(self, name: Any) -> tuple[mmap.mmap, int, int]:
        if name in self._rings:
            self._rings.move_to_end(name)
            return self._rings[name]
        match = _RING_RE.fullmatch(name) if type(name) is str else None
        peer = self._peers.get(match.group(1)) if match else None
        if peer is None:
            raise WireError(f"observation ring {name!r} is not one of an accepted sender's")
        try:
            fd = os.open(peer.dir / name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as e:
            raise WireError(f"observation ring {name} cannot be opened: {e.strerror}") from e
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                raise WireError(f"observation ring {name} is not a regular file of this user")
            mapping = mmap.mmap(fd, info.st_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        if info.st_size < HEADER or mapping[: len(shm.MAGIC)] != shm.MAGIC:
            raise WireError(f"observation ring {name} does not start with {shm.MAGIC!r}")
        count, slot_bytes, _ = (int(x) for x in np.frombuffer(mapping, np.uint64, 3, 8))
        if HEADER + count * (HEADER + slot_bytes) > info.st_size:
            raise WireError(f"observation ring {name} is smaller than its header says")
        self._rings[name] = (mapping, count, slot_bytes)
        while len(self._rings) > MAX_OPEN_RINGS:
            self._rings.popitem(last=False)  # the arrays still viewing it keep it mapped
        return self._rings[name]


def _aligned(n: int) -> int:
    return -(-n // shm.ALIGN) * shm.ALIGN
