"""What the controller knows of one worker of its plan, how its restarts count toward a crash
loop (the supervisor's rule: :data:`MAX_RESTARTS` in a row, none running :data:`PROGRESS_S`),
and which roles never came up."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from system.roles import Role, WorkerState
from system.run.plan import WorkerPlan

MAX_RESTARTS = 5
"""Restarts in a row without progress after which a worker is given up on (a crash loop)."""
PROGRESS_S = 60.0
"""A worker that worked this long since its last restart made progress: its count starts over,
so a long run survives occasional crashes (a preempted node each hour) but not a loop. Worked:
from ready to the last moment it was known to work (:attr:`WorkerRecord.worked_until`), not
the time stuck in a hung poll or silent before it was restarted."""
LAST_WORDS_S = 1.5
"""How long a worker found dead is given for its last message (its error, its bye) to come: a
worker sends it, then exits, and on a loaded machine the controller can see the exit first.
One whose error no restart fixes was restarted for it, to fail again."""


@dataclass
class WorkerRecord:
    """What the controller knows of one worker of its plan."""

    plan: WorkerPlan
    state: WorkerState = WorkerState.STARTING
    restarts: int = 0
    in_a_row: int = 0
    """Restarts since the worker last ran for :data:`PROGRESS_S` (what a crash loop counts)."""
    alive_since: float | None = None
    worked_until: float | None = None
    """When it was last known to work, once found failed: a hung poll's start, its last
    message if it went silent; None: until it was found so (it crashed: then)."""
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
    failed_with: str | None = None
    """The error it reported when it last failed, until it is restarted: one that failed as
    the run stopped, and was not restarted, is said to have failed so, not to have gone."""
    left: str | None = None
    """Why it left unasked (``left on SIGTERM, ...``), until it is restarted."""
    evicted: str | None = None
    """The signal (``SIGTERM``) after which the controller stopped this worker alone, until it
    is restarted: its bye then means it left, not that the run is over."""
    awaited: bool = False
    """Its scheduler is to restart it (Docker, Swarm, Kubernetes): counted when it says hello,
    not when the wait begins, so a worker that never came back is not listed as restarted."""
    found_dead: float | None = None
    """When its process was first found gone, while its last message was awaited."""
    greeted: bool = False
    """Whether a process of it said hello to this controller. One that speaks without it is a
    worker of the run's earlier controller, which its scheduler started again (Swarm,
    Kubernetes): it found the new one at the same address, and is told to leave
    (:data:`REJOIN`)."""


REJOIN = (
    "the run's controller was started again and resumes the run; this worker, of its earlier "
    "controller, leaves, for its scheduler to start it again to say hello"
)


def worked_for_a_while(record: WorkerRecord) -> bool:
    """Whether it worked :data:`PROGRESS_S` between becoming ready and failing. An environment
    whose step never returns after a few seconds was taken for hung only after its role's
    liveness bound (60 s): counting that as running began its count again at each restart, and
    a run restarted it for ever at 0 frames/s."""
    if record.alive_since is None:
        return False
    until = record.worked_until if record.worked_until is not None else time.monotonic()
    return until - record.alive_since >= PROGRESS_S


def count_restart(record: WorkerRecord) -> None:
    """One restart more; one in a row more, unless it worked :data:`PROGRESS_S` before."""
    record.in_a_row = 1 if worked_for_a_while(record) else record.in_a_row + 1
    record.restarts += 1
    record.alive_since = record.found_dead = record.worked_until = None


def last_words_due(record: WorkerRecord, now: float) -> bool:
    """Whether a worker found dead now may still have its last message on its way: until
    :data:`LAST_WORDS_S` after it was first found so."""
    if record.found_dead is None:
        record.found_dead = now
    return now - record.found_dead < LAST_WORDS_S


def crash_looping(record: WorkerRecord) -> bool:
    """Restarted :data:`MAX_RESTARTS` times in a row, never working :data:`PROGRESS_S`."""
    return not worked_for_a_while(record) and record.in_a_row >= MAX_RESTARTS


def given_up(record: WorkerRecord, error: str) -> str:
    """Why a crash-looping worker is given up on, its last error with it."""
    return (
        f"given up after {record.in_a_row} restarts in a row, none of them running "
        f"{PROGRESS_S:.0f} s before it failed (a crash loop); its error: {error}"
    )


TRAINING_ROLES = frozenset(str(r) for r in Role)
"""The roles without which a run trains nothing (evaluation actors are actors)."""


def never_came_up(workers: Iterable[WorkerRecord]) -> list[str]:
    """The workers of each role (a policy's trainers, its policy workers, the actors, ...)
    none of which ever became ready: a run whose trainer's container was killed before its
    hello ran to its wall-clock limit with nothing trained, and exited 0."""
    groups: dict[tuple[str, str | None], list[WorkerRecord]] = {}
    for record in workers:
        if str(record.plan.role) not in TRAINING_ROLES:  # a role of the user's: theirs
            continue
        key = (str(record.plan.role), getattr(record.plan, "policy", None))
        groups.setdefault(key, []).append(record)
    return [
        record.plan.worker_id
        for records in groups.values()
        if not any(r.came_up for r in records)
        for record in records
    ]
