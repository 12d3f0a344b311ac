"""What the controller knows of one worker of its plan, and how its restarts count toward a
crash loop (the supervisor's rule: :data:`MAX_RESTARTS` in a row, none running
:data:`PROGRESS_S`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from system.roles import WorkerState
from system.run.plan import WorkerPlan

MAX_RESTARTS = 5
"""Restarts in a row without progress after which a worker is given up on (a crash loop)."""
PROGRESS_S = 60.0
"""A worker that ran this long since its last restart made progress: its count starts over,
so a long run survives occasional crashes (a preempted node each hour) but not a loop."""


@dataclass
class WorkerRecord:
    """What the controller knows of one worker of its plan."""

    plan: WorkerPlan
    state: WorkerState = WorkerState.STARTING
    restarts: int = 0
    in_a_row: int = 0
    """Restarts since the worker last ran for :data:`PROGRESS_S` (what a crash loop counts)."""
    alive_since: float | None = None
    last_error: str | None = None
    """The message of its last failure: the same one again is a line, not a traceback."""
    pid: int | None = None
    peak_rss_mb: float = 0.0
    last_seen: float = field(default_factory=time.monotonic)
    stats: dict[str, float] = field(default_factory=dict)
    """Its last heartbeat's numeric stats (``version``: the parameters it serves or published)."""
    came_up: bool = False
    """Whether it ever became ready (in any of its processes)."""
    restart_cause: str | None = None  # its last restart's: its error's message, or how it ended
    left: str | None = None
    """Why it left unasked (``left on SIGTERM, ...``), until it is restarted."""
    evicted: str | None = None
    """The signal (``SIGTERM``) after which the controller stopped this worker alone, until it
    is restarted: its bye then means it left, not that the run is over."""
    awaited: bool = False
    """Its scheduler is to restart it (Docker, Swarm, Kubernetes): counted when it says hello,
    not when the wait begins, so a worker that never came back is not listed as restarted."""


def count_restart(record: WorkerRecord) -> None:
    """One restart more; one in a row more, unless it ran :data:`PROGRESS_S` since the last."""
    ran = record.alive_since is not None and time.monotonic() - record.alive_since >= PROGRESS_S
    record.in_a_row = 1 if ran else record.in_a_row + 1
    record.restarts += 1
    record.alive_since = None


def crash_looping(record: WorkerRecord) -> bool:
    """Restarted :data:`MAX_RESTARTS` times in a row, never running :data:`PROGRESS_S`."""
    ran = record.alive_since is not None and time.monotonic() - record.alive_since >= PROGRESS_S
    return not ran and record.in_a_row >= MAX_RESTARTS


def given_up(record: WorkerRecord, error: str) -> str:
    """Why a crash-looping worker is given up on, its last error with it."""
    return (
        f"given up after {record.in_a_row} restarts in a row, none of them running "
        f"{PROGRESS_S:.0f} s (a crash loop); its error: {error}"
    )
