"""Whole runs for ``troupe bench``: start ``troupe run`` as a user would, and watch it.

A :class:`WatchedRun` is one ``troupe run EXPERIMENT overrides --run-dir DIR`` subprocess in a
session of its own (so a signal to it reaches the controller and every worker, and the bench's own
Ctrl+C does not). While it runs, the bench process reads ``metrics.jsonl`` as it grows and notes,
on its own clock, when frames first arrived, and how far the controller's clock (the records'
``wall_s``) lags it; and it samples the peak resident memory (``VmHWM``) of every process in the
run's session. A solved run's moment is the summary's ``wall_s_to_target`` (when the stopping
rule found the target met, confirmed) moved onto the bench's clock.

Every wait has a deadline. A run past its deadline is interrupted (SIGINT to its session: the
controller stops in order), then killed if it does not exit; :func:`stop_all` does the same for
every run still going, for the bench's ``finally``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from system import run_folder

logger = logging.getLogger(__name__)

POLL_S = 0.05
MEMORY_EVERY_S = 0.5
INTERRUPT_GRACE_S = 30.0

_live: dict[int, subprocess.Popen] = {}


def troupe_command() -> list[str]:
    """The ``troupe`` console script beside this Python, else ``python -m distributed.cli``."""
    script = Path(sys.executable).parent / "troupe"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "distributed.cli"]


@dataclass
class RunResult:
    """What one watched run did; times are seconds from the subprocess start."""

    experiment: str
    overrides: list[str]
    run_dir: str
    exit_code: int | None
    exit_s: float | None
    first_frames_s: float | None
    solved_s: float | None
    """When the stopping rule found the target met (None: not solved)."""
    timed_out: bool
    records: list[dict[str, Any]] = field(default_factory=list, repr=False)
    summary: dict[str, Any] = field(default_factory=dict, repr=False)
    workers: dict[str, Any] = field(default_factory=dict, repr=False)
    config: dict[str, Any] = field(default_factory=dict, repr=False)
    """The run's resolved config (``config.json``)."""
    session_peak_rss_mb: dict[int, float] = field(default_factory=dict, repr=False)
    """Peak RSS (MiB) by pid of every process seen in the run's session."""
    session_labels: dict[int, str] = field(default_factory=dict, repr=False)
    """What each sampled pid is: command, controller, or a worker role."""


def watch_run(
    experiment: str,
    overrides: list[str],
    run_dir: Path,
    *,
    deadline_s: float,
    target: float | None = None,
) -> RunResult:
    """Run ``troupe run`` to its end (or its deadline) and report what it did."""
    run_dir = Path(run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = [*troupe_command(), "run", experiment, *overrides, "--run-dir", str(run_dir)]
    cmd.append("--no-display")
    with (run_dir.parent / f"{run_dir.name}.log").open("wb") as log:
        started = time.monotonic()
        process = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # our signals reach the whole run; the user's Ctrl+C does not
        )
    _live[process.pid] = process
    tail = _MetricsTail(run_dir / run_folder.METRICS)
    peaks: dict[int, float] = {}
    procs: dict[int, tuple[int, str]] = {}
    first_frames = None
    clock_offset: float | None = None
    """The least seen (bench clock - record's wall_s): where the controller's clock starts."""
    timed_out = False
    next_memory = 0.0
    try:
        while process.poll() is None:
            now = time.monotonic()
            for record in tail.read_new():
                if first_frames is None and (record.get("env_frames") or 0) > 0:
                    first_frames = now - started
                wall = record.get("wall_s")
                if isinstance(wall, (int, float)):
                    offset = now - started - wall
                    clock_offset = offset if clock_offset is None else min(clock_offset, offset)
            if now >= next_memory:
                next_memory = now + MEMORY_EVERY_S
                _sample_session(process.pid, peaks, procs)
            if now - started > deadline_s:
                timed_out = True
                logger.warning(
                    "%s passed its %.0fs deadline; interrupting it", experiment, deadline_s
                )
                _stop(process)
                break
            time.sleep(POLL_S)
        exit_s = time.monotonic() - started
    finally:
        if process.poll() is None:
            _stop(process)
        _live.pop(process.pid, None)
    records = tail.records
    summary = _read_json(run_dir / run_folder.SUMMARY)
    workers = _read_json(run_dir / run_folder.WORKERS)
    solved = _solved_s(summary, clock_offset, exit_s) if target is not None else None
    return RunResult(
        experiment=experiment,
        overrides=overrides,
        run_dir=str(run_dir),
        exit_code=process.returncode,
        exit_s=exit_s,
        first_frames_s=first_frames,
        solved_s=solved,
        timed_out=timed_out,
        records=records,
        summary=summary,
        workers=workers,
        config=_read_json(run_dir / run_folder.CONFIG),
        session_peak_rss_mb=peaks,
        session_labels=_labels(process.pid, procs, workers),
    )


def steady_fps(records: list[dict[str, Any]], warmup_s: float) -> dict[str, Any]:
    """Frames/s over the steady-state window of a run's metrics records.

    The window opens ``warmup_s`` after the first record with frames (start-up and the first
    trainer steps excluded) and closes at the last record written while the run was still going
    (the very last record is written after the workers stopped, so it is left out).
    """
    going = [r for r in records[:-1] if (r.get("env_frames") or 0) > 0]
    if len(going) < 2:
        return {"fps": None, "window_s": 0.0, "frames": 0}
    opens = float(going[0]["wall_s"]) + warmup_s
    window = [r for r in going if float(r["wall_s"]) >= opens] or going[-2:]
    if len(window) < 2:
        window = going[-2:]
    first, last = window[0], window[-1]
    seconds = float(last["wall_s"]) - float(first["wall_s"])
    frames = int(last["env_frames"]) - int(first["env_frames"])
    return {
        "fps": frames / seconds if seconds > 0 else None,
        "window_s": seconds,
        "frames": frames,
        "window_start_s": float(first["wall_s"]),
    }


def window_timing(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each role's stage shares (and ``busy``), averaged over the records of a window."""
    sums: dict[str, dict[str, list[float]]] = {}
    for record in records:
        for key, value in record.items():
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "timing" and isinstance(value, (int, float)):
                sums.setdefault(parts[1], {}).setdefault(parts[2], []).append(float(value))
    return {
        role: {stage: sum(v) / len(v) for stage, v in stages.items()}
        for role, stages in sums.items()
    }


def role_utilisation(timing: dict[str, dict[str, float]]) -> str:
    """``actor 41% (wait_actions 55%), policy 30% (wait_requests 70%), ...``."""
    parts = []
    for role, stages in sorted(timing.items()):
        if "busy" not in stages:
            continue
        waits = {k: v for k, v in stages.items() if k.startswith("wait_")}
        part = f"{role} {stages['busy']:.0%}"
        if waits:
            wait, share = max(waits.items(), key=lambda w: w[1])
            part += f" ({wait} {share:.0%})"
        parts.append(part)
    return ", ".join(parts) or "-"


def stop_all() -> None:
    """Interrupt, then kill, every run still going (the bench is exiting)."""
    for process in list(_live.values()):
        _stop(process)
        _live.pop(process.pid, None)


# --------------------------------------------------------------------- internals
class _MetricsTail:
    """Reads the complete lines appended to ``metrics.jsonl`` since the last read."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.records: list[dict[str, Any]] = []

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        new = []
        for line in data[: end + 1].splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                new.append(record)
        self.records.extend(new)
        return new


def _stop(process: subprocess.Popen) -> None:
    """SIGINT to the run's session (an orderly stop), then SIGKILL if it outlives the grace."""
    for sig, grace in ((signal.SIGINT, INTERRUPT_GRACE_S), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=grace)
            _kill_session_leftovers(process.pid)
            return
        except subprocess.TimeoutExpired:
            continue


def _kill_session_leftovers(session: int) -> None:
    """Workers that outlived the command (they exit on their own when orphaned; be sure)."""
    for pid in _session_pids(session):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _session_pids(session: int) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = _proc_stat(int(entry.name))
        if stat is not None and stat[1] == session:
            pids.append(int(entry.name))
    return pids


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """``(ppid, session)`` of a process, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return int(fields[1]), int(fields[3])


def _sample_session(
    session: int, peaks: dict[int, float], procs: dict[int, tuple[int, str]]
) -> None:
    """Update ``peaks`` (MiB by pid) and ``procs`` (pid -> parent pid, command line)."""
    for pid in _session_pids(session):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            # Read every time: just after the fork, a child still shows its parent's command line;
            # but keep the last one seen if it is gone (an exiting process shows an empty one).
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            cmdline = raw.replace(b"\0", b" ").decode(errors="replace").strip()
            # The first parent seen: a process whose parent exits first is moved to another one.
            parent, known = procs.get(pid) or ((_proc_stat(pid) or (0, 0))[0], "")
            procs[pid] = (parent, cmdline or known)
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                peaks[pid] = max(peaks.get(pid, 0.0), int(line.split()[1]) / 1024.0)


def peak_rss_by_role(run: RunResult) -> dict[str, float | None]:
    """The largest peak RSS of each role's processes: what its workers reported, or what this
    bench read of their processes itself; None where neither saw one. A worker of a 10 s
    ``--quick`` run that ended before it reported was shown as 0 MiB."""
    per_role: dict[str, float | None] = {}

    def seen(role: str, mb: float | None) -> None:
        known = [v for v in (per_role.get(role), mb) if v]
        per_role[role] = max(known) if known else None

    for worker in run.workers.values():
        seen(str(worker.get("role")), float(worker.get("peak_rss_mb") or 0.0))
    for pid, label in run.session_labels.items():
        if label != "other":  # the command, controller, fork server, launcher or a worker's role
            seen(label, run.session_peak_rss_mb.get(pid))
    return per_role


def _labels(
    root: int, procs: dict[int, tuple[int, str]], workers: dict[str, Any]
) -> dict[int, str]:
    by_pid = {w.get("pid"): w.get("role", "?") for w in workers.values() if isinstance(w, dict)}
    # The controller is the command's child that the workers descend from, however they were
    # started (directly, or through a fork server); a worker's parent other than it is a server.
    ancestors: set[int] = set()
    for pid in by_pid:
        while pid in procs and procs[pid][0] != root:
            pid = procs[pid][0]
            ancestors.add(pid)
        if pid in procs:
            ancestors.add(pid)
    labels = {}
    for pid, (parent, cmdline) in procs.items():
        if pid == root:
            labels[pid] = "command"
        elif pid in by_pid:
            labels[pid] = str(by_pid[pid])
        elif parent == root and pid in ancestors:
            labels[pid] = "controller"
        elif pid in ancestors:
            labels[pid] = "forkserver" if "forkserver" in cmdline else "launcher"
        else:
            labels[pid] = "other"
    return labels


def _solved_s(summary: dict[str, Any], clock_offset: float | None, exit_s: float) -> float | None:
    """A solved run's moment on the bench's clock (the exit, where no record was read)."""
    at = summary.get("wall_s_to_target")
    if not summary.get("solved") or not isinstance(at, (int, float)):
        return None
    return exit_s if clock_offset is None else min(exit_s, clock_offset + at)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
