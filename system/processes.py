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


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (its children, theirs, ...), from ``/proc``: what a
    worker's environments started (a simulator's process), which a SIGKILL of the worker would
    leave running, reparented. Empty without ``/proc``."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            fields = _stat_fields(int(entry.name)) if entry.name.isdigit() else None
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found
