"""The shared-memory side of a parameter client, for a client on the service's own host.

When ``hello`` says this process shares the service's shared-memory directory (same host, same
``/dev/shm``, same user), a publish of at least ``min_bytes`` of arrays writes them once into a
file there and sends only its layout; the service maps the file as the stored version (no copy)
and pushes the layout; a subscriber maps the file privately (copy-on-write) and hands out arrays
onto it. Any failure falls back to the socket: a refused file, a full directory, or a notice that
cannot be mapped :data:`SHM_FAILURES` times in a row (then for good).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

from system.errors import PolicyNameError, WireError
from system.parameters.store import check_policy_name
from system.streams import shm, wire

logger = logging.getLogger(__name__)

SHM_MIN_BYTES = 1 << 20
"""Versions whose arrays hold fewer bytes go over the socket even when shared memory is there:
below about a megabyte a file's system calls cost more than the copies they save. The
environment variable ``TROUPE_SHM_MIN_BYTES`` overrides it (0: every version)."""
SHM_FAILURES = 3
"""Consecutive notices a subscriber cannot map before it goes back to full pushes."""


class ShmLink:
    """Whether and how this client uses the service's shared memory.

    ``on_switch(to_shm)`` is called when the client should move its push subscription to the
    shared-memory topic (True) or back to full pushes (False).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        wanted: bool,
        min_bytes: int | None,
        stats: Counter[str],
        bad: Callable[[Exception], None],
        on_switch: Callable[[bool], None],
    ):
        self.endpoint = endpoint
        self.wanted = wanted
        self.min_bytes = _min_bytes() if min_bytes is None else min_bytes
        self.known = not wanted
        """True once ``hello`` was answered (or shared memory is off)."""
        self.peer: shm.ShmPeer | None = None
        """The service's shared memory, once ``hello`` found this process shares it."""
        self.stats = stats
        self._bad = bad
        self._on_switch = on_switch
        self._failures = 0

    def on_hello(self, info: Any) -> None:
        self.known = True
        peer = shm.peer_from_info(info) if self.wanted else None
        if peer is None:
            logger.debug("parameters from %s come over the socket", self.endpoint)
            return
        logger.debug("parameters from %s come through %s", self.endpoint, peer.dir)
        self.peer = peer
        self._on_switch(True)

    def failed(self, reason: str) -> None:
        """Use the socket until ``hello`` is answered again; after SHM_FAILURES failures in a
        row, for good (a failure that would only repeat)."""
        self._failures += 1
        self.stats["shm_failures"] += 1
        final = self._failures >= SHM_FAILURES
        logger.warning(
            "parameter client of %s %s shared memory: %s",
            *(self.endpoint, "stops using" if final else "asks again about", reason),
        )
        self.wanted = self.wanted and not final
        self.known = not self.wanted
        if self.peer is not None:
            self.peer.close()
            self.peer = None
            self._on_switch(False)

    # ------------------------------------------------------------------ publishing
    def write(self, policy: Any, version: Any, params: Any, persist: Any) -> dict | None:
        """The layout of ``params`` written to shared memory; None when they go by socket
        (no shared memory, too small to be worth it, not nameable, or the write failed)."""
        peer = self.peer
        if peer is None or not _nameable(policy, version, persist):
            return None
        if _array_bytes(params) < self.min_bytes:
            return None  # decided before encoding: a publish is encoded once, either way
        frames = wire.encode("params", params)
        try:
            return peer.write_frames(policy, version, frames)
        except OSError as e:  # a full or vanished directory: this version goes by socket
            self.stats["shm_write_errors"] += 1
            logger.warning(
                "cannot write version %d of '%s' to %s (%s); it goes over the socket",
                *(version, policy, peer.dir, e),
            )
            return None

    def published(self, layout: dict) -> None:
        self.stats["shm_publishes"] += 1
        self._failures = 0
        if self.peer is not None:
            self.peer.prepare(layout["size"])  # the next version's pages, while idle

    def discard(self, layout: dict) -> None:
        if self.peer is not None:
            self.peer.discard(layout)

    # ------------------------------------------------------------------ subscribing
    def map_notice(self, policy: str, version: int, layout: Any, writable: bool) -> Any | None:
        """The parameters of a shared-memory notice, or None (counted; after SHM_FAILURES in a
        row this client goes back to full pushes for good)."""
        if self.peer is None:
            return None  # a notice still queued from before a fallback
        try:
            params = self.peer.open(layout, policy, version, writable=writable)
        except FileNotFoundError:  # dropped by the service: a newer version is on its way
            self.stats["shm_missed"] += 1
            failed = f"the file of version {version} is gone"
        except (WireError, OSError) as e:
            self._bad(e)
            failed = str(e)
        else:
            self._failures = 0
            self.stats["shm_pushes"] += 1
            return params
        if self._failures + 1 >= SHM_FAILURES:
            self.failed(f"{SHM_FAILURES} notices in a row could not be mapped ({failed})")
        else:
            self._failures += 1
        return None

    def close(self) -> None:
        if self.peer is not None:
            self.peer.close()


def _min_bytes() -> int:
    value = os.environ.get("TROUPE_SHM_MIN_BYTES", "")
    try:
        return int(value) if value.strip() else SHM_MIN_BYTES
    except ValueError:
        logger.warning("ignoring TROUPE_SHM_MIN_BYTES=%r: not an integer", value)
        return SHM_MIN_BYTES


def _nameable(policy: Any, version: Any, persist: Any) -> bool:
    """Whether a publish may go through a file (else the socket path lets the service refuse
    what is wrong with it, as always)."""
    try:
        check_policy_name(policy)
    except PolicyNameError:
        return False
    return type(version) is int and version >= 0 and type(persist) is bool


def _array_bytes(value: Any) -> int:
    """Bytes of the arrays in a parameter tree, without encoding it."""
    if isinstance(value, dict):
        return sum(_array_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_array_bytes(v) for v in value)
    nbytes = getattr(value, "nbytes", None)  # numpy arrays (and scalars)
    if isinstance(nbytes, int):
        return nbytes
    if hasattr(value, "element_size") and hasattr(value, "numel"):  # torch tensors
        return int(value.element_size() * value.numel())
    if hasattr(value, "items"):  # mapping-like structures (NamedArray)
        return sum(_array_bytes(v) for _, v in value.items())
    return 0
