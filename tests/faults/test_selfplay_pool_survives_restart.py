"""A self-play opponent worker that is SIGKILLed and restarted plays the same past versions.

Its pool of the learner's snapshots was only in its memory: the restarted worker (and every
opponent worker of a resumed run) started from the learner's newest version alone, so the
learner met none of its past again until new snapshots had piled up. Each snapshot is now
tagged at the parameter service, and a new worker reads the tags back."""

from __future__ import annotations

import os
import signal

import pytest
from lifecycle_support import end_run, finish, group, start, wait_for, workers

pytest.importorskip("pettingzoo", reason="connect four needs pip install -e '.[multiagent]'")
pytestmark = [pytest.mark.faults, pytest.mark.multiprocess]

OPPONENT, LEARNER = "policy/past/0", "policy/main/0"


def test_a_restarted_opponent_plays_versions_from_before_its_restart(tmp_path):
    run_dir = tmp_path / "run"
    proc = start([
        "run", "connect4-selfplay", "stop.eval_return=None", "evaluation.workers=0",
        "actors.envs_per_worker=4", "selfplay.snapshot_every=1", "selfplay.sampling=uniform",
        "selfplay.swap_every_s=0.5", "stop.wall_seconds=600", "--run-dir", str(run_dir),
        "--no-display",
    ])  # fmt: skip
    try:
        wait_for(lambda: (workers(run_dir).get(LEARNER, {}).get("version") or 0) >= 6, proc, 300,
                 "the learner at version 6")  # fmt: skip
        killed_at = workers(run_dir)[LEARNER]["version"]
        os.kill(workers(run_dir)[OPPONENT]["pid"], signal.SIGKILL)
        played = set()

        def plays_the_past() -> bool:
            now = workers(run_dir)[OPPONENT]
            # None until the restarted worker's first heartbeat: workers.json always has the key
            if now["restarts"] == 1 and now["state"] == "alive" and now["version"] is not None:
                played.add(now["version"])
            return any(0 < v < killed_at for v in played)

        # before the fix its pool began at the learner's newest version (>= killed_at), and
        # every version it could draw was newer still; until that first version came it
        # played its own untrained weights, which said "version 0" (so 0 does not count)
        wait_for(plays_the_past, proc, 120, f"the restarted opponent playing a version before "
                 f"{killed_at}")  # fmt: skip
        os.killpg(proc.pid, signal.SIGINT)
        finish(proc)
    finally:
        end_run(proc)
    assert workers(run_dir)[OPPONENT]["restarts"] == 1
    assert not group(proc.pid), "processes outlived the run"
