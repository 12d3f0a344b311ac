"""The local launcher: every worker is its own OS process on this machine, on loopback tcp.

Processes come from a ``forkserver``: one clean server process imports the heavy modules once
(torch, numpy, gymnasium, ZeroMQ) before any thread or socket exists, and forks each worker from
that state, so a worker starts in milliseconds instead of importing torch again (seconds of CPU
on a small machine, times the number of workers). Nothing that owns threads or sockets is ever
forked: each worker makes its own ZeroMQ context. Workers are children of the forkserver, which
exits once they have, and each worker exits by itself within seconds when the controller is gone
(its process ended, its connection closed, or its heartbeat answers stopped): see
:class:`~system.run.connection_watch.ConnectionWatch`.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import sys
import time
from multiprocessing.process import BaseProcess
from pathlib import Path

from distributed.launch.signals import signal_name
from distributed.launch.worker_output import WorkerOutput, write_to
from system.processes import (
    Offspring,
    command_line,
    descendants,
    process_alive,
    process_start,
)
from system.run import worker_process

logger = logging.getLogger(__name__)

OUTPUT_DRAIN_S = 1.0
"""How long the workers' last lines are waited for once they have all ended (a process one of
them left behind, and that nothing killed, may keep a pipe open)."""
UNCLOSED_GRACE_S = 3.0
"""How long what a worker's environments started may run on after the worker stopped in
order (a simulator told to quit by ``close`` and still quitting) before it is killed."""


class LocalLauncher:
    start_grace_s = 120.0
    restart_grace_s = 120.0
    restarts_workers = False
    survey_every_s = 5.0
    """How often what runs below each worker is looked up (:class:`Offspring`)."""

    PRELOAD = [
        "system.run.forkserver_guard",  # first: the forkserver dies with the controller
        *("numpy", "torch", "zmq", "gymnasium", "system.run.worker_process", "legacy.plugin"),
        "distributed.launch.local",  # the workers' entry point, run_worker
    ]

    def __init__(self) -> None:
        self._ctx = mp.get_context("forkserver")
        self._ctx.set_forkserver_preload(self.PRELOAD)
        self.processes: dict[str, BaseProcess] = {}
        self._oom_kills_at_start: dict[str, int | None] = {}
        self._started_at: dict[str, int | None] = {}
        self._offspring = Offspring(self.survey_every_s)
        self._output = WorkerOutput()

    def start(self, worker_id: str, role: str, controller: str) -> None:
        writers = self._output.pipes()  # what it prints reaches the console through us
        process = self._ctx.Process(
            target=run_worker,
            args=(worker_id, role, controller, None, os.getpid()),
            kwargs={"output": writers},
            name=f"troupe-{worker_id}",
            daemon=False,
        )
        try:
            process.start()
        finally:
            WorkerOutput.started(writers)
        self.processes[worker_id] = process
        self._oom_kills_at_start[worker_id] = oom_kills()
        self._started_at[worker_id] = start_time(process.pid)

    def is_alive(self, worker_id: str) -> bool:
        process = self.processes.get(worker_id)
        return process is not None and (process.is_alive() or self._orphaned(worker_id))

    def _orphaned(self, worker_id: str) -> bool:
        """Whether the worker runs on without its forkserver. Python reports exit code 255 for
        every worker of a forkserver that died (its status pipe closed), alive or not: each was
        then restarted beside itself (two trainers, two parameter services on one folder) and
        the originals left 30 s later saying their controller was gone. The process itself,
        the same one by its start time, says whether it still runs."""
        process = self.processes[worker_id]
        if process.exitcode != FORKSERVER_GONE or process.pid is None:
            return False
        started = self._started_at.get(worker_id)
        return started is not None and start_time(process.pid) == started

    def how_ended(self, worker_id: str) -> str:
        """How a worker's process ended, for the supervisor's line: a signal by name (for
        SIGKILL, whether the kernel's out-of-memory killer ran since it started), or its exit
        code."""
        process = self.processes.get(worker_id)
        before, now = self._oom_kills_at_start.get(worker_id), oom_kills()
        since = None if before is None or now is None else now - before
        if process is not None and process.exitcode == FORKSERVER_GONE:
            return "ended after its forkserver was gone (its exit code is unknown)"
        return ended_by(process.exitcode if process is not None else None, since)

    def pid(self, worker_id: str) -> int | None:
        process = self.processes.get(worker_id)
        return process.pid if process is not None else None

    def interrupt(self, worker_id: str) -> None:
        """SIGTERM: a worker still building when the run stops leaves at once, closing what
        it made (:func:`system.run.term_signal.leave`)."""
        process = self.processes.get(worker_id)
        if process is not None and process.is_alive():
            process.terminate()

    def survey(self, force: bool = False) -> None:
        """Note what runs below each worker (at most every ``survey_every_s``; ``force``: now,
        as the run stops): a worker killed from outside leaves it to init, where nothing says
        it was the worker's."""
        pids = {w: p.pid for w, p in self.processes.items() if self.is_alive(w)}
        self._offspring.survey(pids, time.monotonic(), force)  # a dead one's pid: another's

    def kill(self, worker_id: str) -> None:
        """SIGKILL the worker, then what its environments started (a simulator's process): a
        hung actor restarted, or one killed at the run's end, left those running. A worker
        already dead (killed from outside) has left them to init: the last survey names them."""
        process = self.processes.get(worker_id)
        if process is None:
            return
        alive = process.is_alive() or self._orphaned(worker_id)  # not a pid used again
        below = descendants(process.pid) if alive and process.pid is not None else []
        if process.is_alive():
            process.kill()
        elif self._orphaned(worker_id):  # not through its forkserver, which is gone
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            self._wait_gone(worker_id, 5.0)
        process.join(timeout=5)
        self._kill_left(worker_id, below, "it had started")

    def _kill_left(self, worker_id: str, below: list[int], how: str) -> None:
        """SIGKILL ``below`` and what the last survey saw below the worker and still runs."""
        below = list(dict.fromkeys([*below, *self._offspring.left(worker_id)]))
        for pid in below:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if below:
            logger.info("%s: killed %d process(es) %s", worker_id, len(below), how)

    def _wait_gone(self, worker_id: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self._orphaned(worker_id) and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop_all(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` in all for every worker process to end, then kill what is
        left. Each had its own ``timeout_s``: three actors hung in a step made a run's end
        30 s long, one after the other."""
        deadline = time.monotonic() + timeout_s
        unclosed: dict[str, dict[int, int | None]] = {}
        for worker_id, process in self.processes.items():
            left = max(0.0, deadline - time.monotonic())
            process.join(timeout=left)
            self._wait_gone(worker_id, left)
            if self.is_alive(worker_id):
                logger.warning("%s still running at shutdown; killing it", worker_id)
                self.kill(worker_id)
            elif process.exitcode != 0:  # killed from outside: it closed nothing
                self._kill_left(worker_id, [], "it had left running")
            else:
                unclosed[worker_id] = {p: process_start(p) for p in self._offspring.left(worker_id)}
        self._end_unclosed(unclosed)
        self._output.drain(OUTPUT_DRAIN_S)

    def _end_unclosed(self, unclosed: dict[str, dict[int, int | None]]) -> None:
        """Workers that stopped in order closed their environments, but a ``close`` that does
        not end what it started (a simulator's process) left it running after the run, run
        after run. What still runs :data:`UNCLOSED_GRACE_S` after the workers ended is killed,
        and said, naming it. ``unclosed``: by worker, what ran below it (pid: start time)."""
        deadline = time.monotonic() + UNCLOSED_GRACE_S
        while True:
            left = {w: pids for w, starts in unclosed.items() if (pids := _running(starts))}
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        for worker_id, pids in left.items():
            what = ", ".join(f"{pid} ({command_line(pid)})" for pid in pids)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            logger.warning(
                "%s stopped, but %d process(es) its environments had started still ran: %s; "
                "killed. An environment's close() should end what it started",
                worker_id, len(pids), what,
            )  # fmt: skip


def _running(starts: dict[int, int | None]) -> list[int]:
    """The processes of ``starts`` (pid: start time) still running."""
    return [pid for pid, start in starts.items() if process_alive(pid, start)]


def run_worker(*args, output=None) -> None:
    """A worker process's body: what ``worker_process.main`` returns becomes the process's exit
    code. (A multiprocessing target's return value is dropped: every worker exited 0, and one
    that had just reported a failure was said to have "exited with code 0".) ``output``: the
    pipes its stdout and stderr go to (:mod:`distributed.launch.worker_output`)."""
    write_to(output)
    sys.exit(worker_process.main(*args))


FORKSERVER_GONE = 255
"""The exit code Python gives every process of a forkserver that died, ended or not."""


def start_time(pid: int | None) -> int | None:
    """When process ``pid`` started (clock ticks after boot, ``/proc/PID/stat``): a pid used
    again by another process has another; None when no such process runs (or a zombie)."""
    if pid is None:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # after the name, which may hold spaces
    return None if fields[0] == "Z" else int(fields[19])


VMSTAT = Path("/proc/vmstat")


def oom_kills() -> int | None:
    """How many processes the kernel's out-of-memory killer has killed since boot (every
    cgroup's, Linux 4.13 on); None where that cannot be read."""
    try:
        for line in VMSTAT.read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def ended_by(exitcode: int | None, oom_kills_since: int | None = None) -> str:
    """``exited with code 3``, ``was killed by SIGKILL (...)``; ``exited`` where unknown.

    A SIGKILL is said to be the out-of-memory killer's only when that killer ran while the
    process lived (``oom_kills_since``: its kill count's rise, None where unknown): a
    ``kill -9`` from an operator was reported with the out-of-memory hint, sending them to look
    for a leak that was not there."""
    if exitcode is None:
        return "exited"
    if exitcode >= 0:
        return f"exited with code {exitcode}"
    name = signal_name(-exitcode)
    if -exitcode != signal.SIGKILL:
        return f"was killed by {name}"
    if oom_kills_since is None:
        return f"was killed by {name} (out of memory? the kernel's OOM killer sends it: see dmesg)"
    if oom_kills_since == 0:
        return (
            f"was killed by {name} (not by the out-of-memory killer, which killed nothing "
            "meanwhile: someone or something sent it, a kill -9, a supervisor, a limit)"
        )
    return (
        f"was killed by {name} (out of memory: the kernel's OOM killer killed "
        f"{oom_kills_since} process(es) meanwhile; see dmesg)"
    )


class ExternalLauncher:
    """For schedulers that start and restart workers themselves (Docker, Swarm, Kubernetes,
    Slurm): the controller only watches heartbeats. A worker the scheduler restarts says hello
    again and is configured again; the controller never starts or kills anything."""

    start_grace_s = 600.0
    """Image pulls and first imports on a fresh node take minutes."""
    restart_grace_s = 60.0
    """A worker that was running and died or went silent: its scheduler restarts it in seconds
    (a local image, a restart policy) or not at all; minutes of "waiting" would only hide that."""
    restarts_workers = True

    def start(self, worker_id: str, role: str, controller: str) -> None:
        """The scheduler starts every worker; nothing to do."""

    def is_alive(self, worker_id: str) -> bool:
        return True  # only heartbeats tell, and the controller watches those

    def kill(self, worker_id: str) -> None:
        """The scheduler owns the process; a silent worker is its to restart."""

    def stop_all(self, timeout_s: float) -> None:
        """Workers exit on the controller's stop message; nothing more to do."""
