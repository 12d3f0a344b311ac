"""Fault injection at process level: a real ``troupe run`` under malformed traffic and a stopped
worker. Marked ``faults`` (CI runs them as a stage of their own: ``pytest -m faults``).

Each test starts the real command in its own process group (as tests/system/test_runtime_e2e.py
does), discovers every socket from the run folder's ``endpoints.json``, and checks the outcome an
operator sees: the run goes on and ends cleanly, ``workers.json`` counts no restart, and no
worker read a 50 MB frame or kept what it was sent. Every wait is on a condition with a
deadline; the one sleep is the fault itself (how long a worker stays stopped).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_support import ROOT, finish, frames, read_json, start, wait_for
from lifecycle_support import end_run

from distributed.launch.signals import EXIT_INTERRUPTED

pytestmark = pytest.mark.faults

FLOOD = Path(__file__).with_name("flood.py")
MESSAGES = 2000
"""Messages of each kind to each socket."""
BIG_MESSAGES = 2000
"""50 MB messages to each socket: one buffer, sent without copies, each refused at its size
header (a dropped connection; the sender reconnects within a millisecond)."""
BIG_FRAME_MIB = 50_000_000 / 2**20
SMALL_RUN = [
    "cartpole-ppo",
    "stop.eval_return=None",
    "evaluation.workers=1",
    "evaluation.envs_per_worker=2",
    "actors.envs_per_worker=8",
]
REPLAY_RUN = ["cartpole-dqn", "stop.eval_return=None", "evaluation.workers=0"]
"""An off-policy run: its actors send to a replay worker, which serves its trainer."""


def start_run(run_dir: Path, *overrides: str, run: list[str] = SMALL_RUN) -> subprocess.Popen:
    args = ["run", *run, *overrides, "--run-dir", str(run_dir), "--no-display"]
    return start(args)


def memory_mb(pid: int) -> dict[str, float]:
    """Resident (VmRSS) and peak resident (VmHWM) memory of a process, from /proc."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024.0
    return out


def worker_pids(run_dir: Path) -> dict[str, int]:
    return {wid: w["pid"] for wid, w in read_json(run_dir / "workers.json").items()}


@pytest.mark.parametrize(
    ("run", "sockets", "count"),
    [(SMALL_RUN, "", 5), (REPLAY_RUN, "replay/", 2)],
    ids=["every-socket-of-cartpole-ppo", "replay-worker-of-cartpole-dqn"],
)
def test_malformed_traffic_crashes_nothing(tmp_path, run, sockets, count):
    """``sockets``: the names flooded (a prefix); ``count``: how many the run has (at least)."""
    run_dir = tmp_path / "run"
    proc = start_run(run_dir, "stop.env_frames=1000000000", run=run)
    try:
        out = flood_and_stop(run_dir, proc, sockets, count)
    finally:
        end_run(proc)
    assert proc.returncode == EXIT_INTERRUPTED, out[-3000:]
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "interrupted" and "failure" not in summary, out[-3000:]
    assert "dropped" in out  # the workers said what they dropped


def flood_and_stop(run_dir: Path, proc: subprocess.Popen, sockets: str, count: int) -> str:
    """Warm up, flood the ``count`` (or more) sockets whose names start with ``sockets``, check
    the workers, see the run go on, stop it (Ctrl+C)."""

    def flooded() -> list[str]:
        return [n for n in read_json(run_dir / "endpoints.json") if n.startswith(sockets)]

    def warmed_up() -> bool:
        return len(flooded()) >= count and frames(run_dir) > 5000

    wait_for(warmed_up, proc, what=f"{count} endpoints '{sockets}*' registered and 5000 frames")
    endpoints = flooded()
    pids = worker_pids(run_dir)
    before = {wid: memory_mb(pid) for wid, pid in pids.items()}

    flood = subprocess.run(
        [sys.executable, str(FLOOD), str(run_dir), str(MESSAGES), str(BIG_MESSAGES), sockets],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    workers = read_json(run_dir / "workers.json")
    assert {wid: w["restarts"] for wid, w in workers.items()} == dict.fromkeys(pids, 0)
    assert {wid: w["pid"] for wid, w in workers.items()} == pids  # the same processes
    assert flood.returncode == 0, flood.stderr[-3000:]
    sent = json.loads(flood.stdout.strip().splitlines()[-1])
    assert sorted(sent) == sorted(endpoints)
    for name, kinds in sent.items():
        expected = {k: MESSAGES for k in kinds} | {
            "oversized_claims": 2 * MESSAGES,
            "frames_50mb": BIG_MESSAGES,
        }
        assert kinds == expected, f"{name}: not every message went: {kinds}"

    after_flood = frames(run_dir)
    wait_for(lambda: frames(run_dir) > after_flood + 5000, proc, what="5000 frames more")
    after = {wid: memory_mb(pid) for wid, pid in pids.items()}
    # The flood's messages wait in ZeroMQ's queues (up to its receive high-water mark) before a
    # worker drops them: the peak rises by a few MiB (20 seen on CI, 10% of a policy worker),
    # then falls back. So the peak is checked against what a 50 MB frame would add, and what
    # stays resident against the 10%.
    peaked = {  # a 50 MB frame read whole, even once, lifts the peak by 47.7 MiB
        wid: (before[wid]["VmRSS"], after[wid]["VmHWM"])
        for wid in pids
        if after[wid]["VmHWM"] - before[wid]["VmRSS"] >= BIG_FRAME_MIB
    }
    assert not peaked, f"a 50 MB frame was read whole (resident before, peak after): {peaked}"
    kept = {  # still resident after the run went on (issue 10: RSS growth < 10%)
        wid: (before[wid]["VmRSS"], after[wid]["VmRSS"])
        for wid in pids
        if after[wid]["VmRSS"] > 1.10 * before[wid]["VmRSS"]
    }
    assert not kept, f"resident memory (MiB) grew by 10% or more: {kept}"
    workers = read_json(run_dir / "workers.json")
    assert {wid: w["restarts"] for wid, w in workers.items()} == dict.fromkeys(pids, 0)
    os.killpg(proc.pid, signal.SIGINT)
    return finish(proc, timeout=120)


def test_a_stopped_policy_worker_holds_the_run_up_but_does_not_end_it(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_run(run_dir, "stop.env_frames=40000")
    try:
        wait_for(lambda: frames(run_dir) > 5000, proc, what="5000 frames")
        victim = worker_pids(run_dir)["policy/default/0"]
        os.kill(victim, signal.SIGSTOP)
        try:
            time.sleep(3.0)  # the fault: a worker descheduled for a few seconds
        finally:
            os.kill(victim, signal.SIGCONT)
        out = finish(proc)
    finally:
        end_run(proc)
    assert proc.returncode == 0, out[-3000:]
    assert read_json(run_dir / "summary.json")["stop_reason"] == "env_frames"
    workers = read_json(run_dir / "workers.json")
    assert workers["policy/default/0"]["pid"] == victim
    assert all(w["restarts"] == 0 for w in workers.values()), workers
