"""A policy worker of a DQN run that is SIGKILLed and restarted goes on with the run's epsilon.

Each policy worker counts the frames it explores; the restarted one starts from zero and takes
its count from the first checkpoint it loads. That count comes from the replay worker (its
inserted frames, through the trainer's copy), so the restarted worker does not start the
epsilon schedule again: before it did, and the run acted at random again for ``decay_frames``
frames (the same happened to every policy worker of a resumed run)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from lifecycle_support import SMALL, all_alive, end_run, finish, group, start, wait_for, workers

from system.run.report import read_metrics

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess]

EPSILON = "policy/default/epsilon"
DECAY = 100_000
"""Slow enough that a few seconds of frames after the restart cannot bring a fresh schedule
down to where the run had got."""


def _epsilon(run_dir: Path) -> float | None:
    known = [r[EPSILON] for r in read_metrics(run_dir) if EPSILON in r]
    return known[-1] if known else None


def test_a_restarted_policy_worker_goes_on_with_the_runs_epsilon(tmp_path):
    run_dir = tmp_path / "run"
    proc = start([
        "run", "cartpole-dqn", *SMALL, "stop.env_frames=100000000", "--run-dir", str(run_dir),
        "--no-display", f"policies.default.policy.args.epsilon.decay_frames={DECAY}",
    ])  # fmt: skip
    try:
        wait_for(lambda: (_epsilon(run_dir) or 1.0) < 0.75, proc, 300, "epsilon below 0.75")
        reached = _epsilon(run_dir)
        before = workers(run_dir)["policy/default/0"]
        os.kill(before["pid"], signal.SIGKILL)

        def restarted() -> bool:
            now = workers(run_dir)["policy/default/0"]
            return now["restarts"] == before["restarts"] + 1 and all_alive(run_dir)

        wait_for(restarted, proc, 120, "the policy worker restarted")
        seen = len(read_metrics(run_dir))
        wait_for(lambda: len(read_metrics(run_dir)) >= seen + 5, proc, 120, "five more records")
        after = [r[EPSILON] for r in read_metrics(run_dir)[seen:] if EPSILON in r]
        os.killpg(proc.pid, signal.SIGINT)
        out = finish(proc)
    finally:
        end_run(proc)
    assert after, out[-3000:]
    # a fresh schedule would be back near 1.0 (0.94 before the fix, where the run had reached
    # 0.74); the run's goes on from where its published version's count was (a few hundred
    # frames behind the worker's own: 0.05 of epsilon is 5,000 frames here)
    assert max(after) <= reached + 0.05, (reached, after)
    assert workers(run_dir)["policy/default/0"]["restarts"] == 1
    assert not group(proc.pid), "processes outlived the run"
