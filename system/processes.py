"""Whether a process of this machine is alive, asked by its pid, and what runs below it.

The parameter store (temporary files of a killed writer), the control channel (a controller on
this machine) and ``troupe status|stop`` (a run's process) all ask; one answer serves them. The
local launcher asks what runs below a worker it kills (:func:`descendants`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def process_exists(pid: int) -> bool:
    """``kill(pid, 0)``: a process of someone else's also exists (the call is refused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command name (which may hold spaces), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks after boot (None without ``/proc``)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def process_alive(pid: int | None, start: int | None = None) -> bool:
    """Whether ``pid`` is a live process (a zombie is not), and the one that started at
    ``start`` when that is known (a pid the kernel gave to another process since is not)."""
    if not pid or not process_exists(pid):
        return False
    if start is not None and process_start(pid) not in (start, None):
        return False
    fields = _stat_fields(pid)
    return fields is None or fields[0] != "Z"


def command_line(pid: int, width: int = 80) -> str:
    """What process ``pid`` runs, as ``ps`` shows it, cut to ``width`` ("?" when unknown)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace") or "?"
    return text if len(text) <= width else text[: width - 3] + "..."


def children_map() -> dict[int, list[int]]:
    """Every process's children, by parent pid, from one pass over ``/proc`` (empty
    without it): :func:`descendants` of several processes read it once."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            fields = _stat_fields(int(entry.name)) if entry.name.isdigit() else None
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def descendants(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """Every process below ``pid`` (its children, theirs, ...), from ``/proc``: what a
    worker's environments started (a simulator's process), which a SIGKILL of the worker would
    leave running, reparented. ``children``: a :func:`children_map` already read. Empty without
    ``/proc``."""
    children = children_map() if children is None else children
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


class Offspring:
    """What runs below each of several processes (a launcher's workers), as last seen.

    A worker killed from outside (the kernel's out-of-memory killer, a ``kill -9``) has left
    its children to init by the time anyone sees it dead, and nothing then says they were its:
    a simulator its environment had started ran on, restart after restart. So they are looked
    up while it lives, every ``every_s`` (one pass over ``/proc``: 1.4 ms for 75 processes on
    a 2-core VM), and :meth:`left` names those still running, by pid and start time (a pid the
    kernel gave to another process since is not one of them)."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._seen: dict[str, dict[int, int | None]] = {}
        self._next = 0.0

    def survey(self, pids: dict[str, int | None], now: float, force: bool = False) -> None:
        """Note what runs below each process of ``pids`` (name to pid), if ``every_s`` passed
        since the last look (``force``: now). A process not alive keeps what was last seen
        below it."""
        if now < self._next and not force:
            return
        self._next = now + self.every_s
        children = children_map()
        for name, pid in pids.items():
            if pid is not None and process_alive(pid):
                below = descendants(pid, children)
                self._seen[name] = {p: process_start(p) for p in below}

    def left(self, name: str) -> list[int]:
        """What was last seen below ``name`` and still runs; forgotten once asked."""
        seen = self._seen.pop(name, {})
        return [pid for pid, start in seen.items() if process_alive(pid, start)]
