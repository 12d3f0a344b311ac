"""SIGKILL of the local launcher's forkserver mid-run.

Python then gives every process the forkserver forked exit code 255, alive or not: each worker
was restarted beside itself (two trainers, two parameter services on one run folder), and the
originals left 30 s later saying their controller was gone. The workers run on, untouched; a
worker that really dies afterwards is still restarted, from a new forkserver.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
from lifecycle_support import SMALL, all_alive, children, end_run, finish, start, wait_for, workers

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess]


def forkservers(command: int) -> list[int]:
    """The forkserver(s) of a run: children of its controller (the command's child) that are
    forkservers, not the workers forked from them."""
    found = []
    for controller in children(command):
        for pid in children(controller):
            with contextlib.suppress(OSError):
                if b"multiprocessing.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
    return found


def running(pids) -> list[int]:
    alive = []
    for pid in pids:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
                alive.append(pid)
    return alive


def test_a_killed_forkserver_leaves_its_workers_running_and_restarts_only_the_dead(tmp_path):
    run_dir = tmp_path / "run"
    args = ["run", "cartpole-ppo", *SMALL, "stop.env_frames=150000", "--run-dir", str(run_dir)]
    proc = start([*args, "--no-display"])
    try:
        wait_for(lambda: all_alive(run_dir), proc, 300, "every worker alive")
        before = {wid: w["pid"] for wid, w in workers(run_dir).items()}
        (server,) = forkservers(proc.pid)
        os.kill(server, signal.SIGKILL)
        # a few supervision rounds: nothing is restarted, every worker is the same process
        wait_for(lambda: not running([server]), proc, 30, "the forkserver gone")
        frames = (run_dir / "metrics.jsonl").stat().st_size
        wait_for(lambda: (run_dir / "metrics.jsonl").stat().st_size > frames + 2000, proc, 120,
                 "more records")  # fmt: skip
        table = workers(run_dir)
        assert {wid: w["pid"] for wid, w in table.items()} == before
        assert all(w["restarts"] == 0 and w["state"] == "alive" for w in table.values()), table
        # one that really dies now is seen to, and restarted (from a new forkserver)
        os.kill(before["actor/0"], signal.SIGKILL)
        wait_for(lambda: workers(run_dir)["actor/0"]["restarts"] == 1 and all_alive(run_dir),
                 proc, 120, "actor/0 restarted")  # fmt: skip
        pids = [w["pid"] for w in workers(run_dir).values()]
        assert workers(run_dir)["actor/0"]["pid"] != before["actor/0"]
        out = finish(proc)
    finally:
        end_run(proc)
    assert proc.returncode == 0, out[-3000:]
    assert "gone, so this worker exits" not in out, out[-3000:]
    assert running([*before.values(), *pids]) == [], "a worker outlived its run"
