"""Where a worker's wall time goes: stage clocks in the workers, shares and a bottleneck line
in the controller.

A worker's :class:`StageClock` is a stopwatch that always runs for exactly one stage: ``enter``
charges the time since the last switch to the stage that was running and starts the next one.
So the stages a heartbeat reports add up to the wall time it covers, by construction, and what
no stage names is charged to ``control`` (heartbeats, stop checks: the worker loop's own time).
One ``perf_counter`` call and one dict update a switch: cheap enough to stay on in every run.

Stage names say what the time was spent on; those that start with ``wait_`` are waits for a
peer (actions, requests, samples), the time a faster peer would give back. A role's *busy* share
is everything else. :class:`RoleTimes` (the controller's tally) turns the heartbeats of every
worker into shares of wall time per role, and :func:`bottleneck` names the role that is
saturated and the one that waits most.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

CONTROL = "control"
"""The worker loop's own time: heartbeats, stats, stop checks, peer watching."""
WAIT_PREFIX = "wait_"
STAGE_KEY = "stage/"
"""Heartbeat stats ``stage/<name>``: seconds in that stage since the last heartbeat."""
WALL_KEY = "stage_wall_s"
"""Heartbeat stat: the wall-clock seconds those stages cover."""
BATCH_KEYS = ("batch_rows_mean", "batch_rows_p50", "batch_rows_p90", "batch_rows_max")
"""A policy worker's batch size distribution (rows a forward pass) since its last heartbeat."""

SIDE_ROLES = ("parameter_service", "eval_actor")
"""Roles off the frames' path: the parameter service waits for publishes by design, and
evaluation actors are held to a pace; neither limits how fast the run trains."""

_perf_counter = time.perf_counter


def is_wait(stage: str) -> bool:
    return stage.startswith(WAIT_PREFIX)


class StageClock:
    """Charges every moment of one thread's loop to exactly one stage (see the module doc)."""

    __slots__ = ("_seconds", "_since", "_stage", "_started")

    def __init__(self, first: str = CONTROL) -> None:
        self._seconds: dict[str, float] = {}
        self._stage = first
        self._since = self._started = _perf_counter()

    @property
    def stage(self) -> str:
        """The stage running now."""
        return self._stage

    def enter(self, stage: str) -> None:
        """End the running stage here and start ``stage``."""
        now = _perf_counter()
        seconds = self._seconds
        seconds[self._stage] = seconds.get(self._stage, 0.0) + (now - self._since)
        self._stage, self._since = stage, now

    def take(self, prefix: str = "") -> dict[str, float]:
        """Seconds per stage since the last ``take`` (or the start), as heartbeat stats
        (``stage/<name>``, and :data:`WALL_KEY` for the wall time they cover; both after
        ``prefix``, ``loader.`` for a worker's loader thread); the running stage goes on."""
        StageClock.enter(self, self._stage)  # this class's: a subclass may hold a lock here
        now = self._since
        stats = {f"{prefix}{STAGE_KEY}{name}": s for name, s in self._seconds.items()}
        stats[prefix + WALL_KEY] = now - self._started
        self._seconds, self._started = {}, now
        return stats


class SharedStageClock(StageClock):
    """A stage clock whose thread enters stages while another takes its seconds (a trainer's
    loader thread, reported by the worker loop): both under a lock, so no interval is lost or
    counted twice. A few switches a batch: the lock costs nothing that shows."""

    __slots__ = ("_lock",)

    def __init__(self, first: str = CONTROL) -> None:
        self._lock = threading.Lock()
        super().__init__(first)

    def enter(self, stage: str) -> None:
        with self._lock:
            super().enter(stage)

    def take(self, prefix: str = "") -> dict[str, float]:
        with self._lock:
            return super().take(prefix)


class BatchSizes:
    """Rows of each forward pass since the last ``take``: a policy worker's batch sizes."""

    __slots__ = ("_rows",)

    def __init__(self) -> None:
        self._rows: list[int] = []

    def add(self, rows: int) -> None:
        self._rows.append(rows)

    def take(self) -> dict[str, float]:
        if not self._rows:
            return {}
        rows = np.asarray(self._rows)
        self._rows = []
        p50, p90 = np.percentile(rows, (50, 90))
        values = (rows.mean(), p50, p90, rows.max())
        return {k: float(v) for k, v in zip(BATCH_KEYS, values)}


@dataclass
class RoleShares:
    """One role's wall time over a report interval, summed over its workers."""

    role: str
    workers: int
    """Workers of the role that reported in the interval."""
    shares: dict[str, float]
    """Stage -> share of the workers' wall time (0..1; they add up to 1)."""

    @property
    def busy(self) -> float:
        """The share spent on anything but waiting for a peer."""
        return 1.0 - sum(s for stage, s in self.shares.items() if is_wait(stage))

    @property
    def largest_wait(self) -> tuple[str, float] | None:
        waits = [(stage, s) for stage, s in self.shares.items() if is_wait(stage)]
        return max(waits, key=lambda w: w[1]) if waits else None

    @property
    def largest_stage(self) -> tuple[str, float]:
        """The largest stage that is work, not a wait (the largest wait where all are): what a
        role said to be busy is busy with, e.g. ``policy busy 21% (forward 15%)``, not
        ``(wait_requests 79%)``."""
        work = [(stage, s) for stage, s in self.shares.items() if not is_wait(stage)]
        return max(work or self.shares.items(), key=lambda w: w[1])


class _Interval:
    """Stage seconds, wall seconds, reporting workers and batch figures summed since a start."""

    def __init__(self) -> None:
        self.seconds: dict[str, dict[str, float]] = {}
        self.wall: dict[str, float] = {}
        self.workers: dict[str, set[str]] = {}
        self.batches: dict[str, list[float]] = {}
        """``<role>/<batch key>`` -> [sum, count, max] over heartbeats (bounded however long)."""

    def add(self, role: str, worker_id: str, stats: Mapping[str, object]) -> None:
        for key, value in stats.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            if key.endswith(WALL_KEY):
                part = _part(role, key[: -len(WALL_KEY)])
                self.wall[part] = self.wall.get(part, 0.0) + float(value)
                self.workers.setdefault(part, set()).add(worker_id)
            elif STAGE_KEY in key:
                thread, _, stage = key.partition(STAGE_KEY)
                seconds = self.seconds.setdefault(_part(role, thread), {})
                seconds[stage] = seconds.get(stage, 0.0) + float(value)
            elif key in BATCH_KEYS:
                figures = self.batches.setdefault(f"{role}/{key}", [0.0, 0, float(value)])
                figures[0] += float(value)
                figures[1] += 1
                figures[2] = max(figures[2], float(value))

    def shares(self) -> dict[str, RoleShares]:
        out = {}
        for role, wall in self.wall.items():
            if wall > 0:
                seconds = self.seconds.get(role, {})
                shares = {s: v / wall for s, v in sorted(seconds.items())}
                out[role] = RoleShares(role, len(self.workers[role]), shares)
        return out

    def batch_figures(self) -> dict[str, float]:
        """The mean over the heartbeats of each figure (the max of their maxima)."""
        return {
            key: (top if key.endswith("_max") else total / count)
            for key, (total, count, top) in self.batches.items()
        }


class RoleTimes:
    """The controller's tally of stage seconds by role, between two records.

    ``add`` takes each heartbeat's stats; ``take`` returns every role's shares over the interval
    and starts the next. A role that sent no timing in an interval (its heartbeats and the
    records need not keep step) keeps the shares it had, so the panel does not flicker. A worker
    inside one long poll, a trainer's step, still sends its stage seconds: the busy-heartbeat
    thread takes them (:class:`~system.run.busy_heartbeat.BusyHeartbeat`).

    A record is made every second but, as a run ages, written to its file less often
    (``metrics.thin``): :meth:`take_written` gives the figures over the whole time since the
    last written one, so a record a minute says where that minute went, not its last second.
    """

    def __init__(self) -> None:
        self._shown = _Interval()
        self._written = _Interval()
        self._last: dict[str, RoleShares] = {}

    def add(self, role: str, worker_id: str, stats: Mapping[str, object]) -> None:
        """One heartbeat's stats; a thread's stages (``loader.stage/...``) count as a part of
        the role of their own (``trainer.loader``)."""
        self._shown.add(role, worker_id, stats)
        self._written.add(role, worker_id, stats)

    def take(self) -> dict[str, RoleShares]:
        self._last.update(self._shown.shares())
        self._shown.seconds, self._shown.wall, self._shown.workers = {}, {}, {}
        return dict(self._last)

    def take_batches(self) -> dict[str, float]:
        """Each role's batch size figures over the interval: the mean over its heartbeats
        (the max of their maxima)."""
        out = self._shown.batch_figures()
        self._shown.batches = {}
        return out

    def take_written(self) -> dict[str, float]:
        """The metric keys (:func:`record`, ``timing/<role>/batch_rows_*``) over the time since
        the previous call, for the record written now; a role that sent no timing meanwhile
        keeps the shares last taken."""
        roles = {**self._last, **self._written.shares()}
        out = record(roles)
        out.update({f"timing/{k}": v for k, v in self._written.batch_figures().items()})
        self._written = _Interval()
        return out


def _part(role: str, thread: str) -> str:
    """``trainer`` for the worker loop's stages (no prefix), ``trainer.loader`` for a thread's."""
    return f"{role}.{thread.rstrip('.')}" if thread else role


def without_timing(stats: Mapping[str, object]) -> dict[str, object]:
    """Heartbeat stats less the timing ones (which :class:`RoleTimes` takes)."""
    return {
        k: v
        for k, v in stats.items()
        if not (STAGE_KEY in k or k.endswith(WALL_KEY) or k in BATCH_KEYS)
    }


def record(roles: Mapping[str, RoleShares]) -> dict[str, float]:
    """Metric keys: ``timing/<role>/<stage>`` (share of wall time) and ``timing/<role>/busy``."""
    out: dict[str, float] = {}
    for role, shares in roles.items():
        for stage, share in shares.shares.items():
            out[f"timing/{role}/{stage}"] = round(share, 4)
        out[f"timing/{role}/busy"] = round(shares.busy, 4)
    return out


def bottleneck(roles: Iterable[RoleShares]) -> str:
    """One line: the busiest role (saturated, with its largest stage) and the role that waits
    most (with what it waits for), e.g. ``trainer busy 97% (compute 81%); actor waits 58%
    (wait_actions)``. Only roles on the data path are named (not :data:`SIDE_ROLES`). Empty
    before any role reported."""
    roles = [r for r in roles if r.shares and r.role not in SIDE_ROLES]
    if not roles:
        return ""
    busiest = max(roles, key=lambda r: r.busy)
    stage, share = busiest.largest_stage
    line = f"{busiest.role} busy {busiest.busy:.0%} ({stage} {share:.0%})"
    waiting = [  # a worker's own thread waiting for its loop says nothing of the others
        r for r in roles if r is not busiest and "." not in r.role and r.largest_wait is not None
    ]
    if waiting:
        waiter = max(waiting, key=lambda r: 1.0 - r.busy)
        wait, _ = waiter.largest_wait
        line += f"; {waiter.role} waits {1.0 - waiter.busy:.0%} ({wait})"
    return line


PATH_ORDER = ("actor", "policy", "replay", "trainer")
"""The order the frames go through the roles: how :func:`every_role` lists them."""


def every_role(roles: Iterable[RoleShares]) -> str:
    """One clause per role on the data path, in :data:`PATH_ORDER` (others after, by name):
    ``busy`` with its largest stage where it works at least half its time, else ``waits`` with
    its largest wait, e.g. ``actor busy 100% (env_step 100%); policy waits 100%
    (wait_requests); trainer waits 100% (wait_samples)``.

    What a stalled run says: there every role but one may wait fully, and :func:`bottleneck`
    names only one of those that tie, whichever a rounding puts first."""
    shown = [r for r in roles if r.shares and r.role not in SIDE_ROLES and "." not in r.role]
    rank = {role: i for i, role in enumerate(PATH_ORDER)}
    shown.sort(key=lambda r: (rank.get(r.role, len(rank)), r.role))
    return "; ".join(_state(r) for r in shown)


def _state(role: RoleShares) -> str:
    wait = role.largest_wait
    if role.busy >= 0.5 or wait is None:
        stage, share = role.largest_stage
        return f"{role.role} busy {role.busy:.0%} ({stage} {share:.0%})"
    return f"{role.role} waits {1.0 - role.busy:.0%} ({wait[0]})"
