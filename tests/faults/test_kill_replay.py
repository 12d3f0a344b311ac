"""SIGKILL of an off-policy run's replay worker: it is restarted, refills from the actors, and
its trainer and actors follow it to its new address, so training goes on (cartpole-dqn) and the
run finishes by itself on its frame budget, exit 0, with no version lost or gone backwards."""

from __future__ import annotations

import os
import signal

import pytest
from lifecycle_support import (
    SMALL,
    all_alive,
    assert_no_version_lost,
    finish,
    group,
    latest_version,
    read_json,
    start,
    wait_for,
    workers,
)

from system.run.report import read_metrics

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess]

FRAME_BUDGET = 20_000
"""The run's stopping rule: room for the kill, the restart and the refill (training went on
again by 4k frames on a shared 2-core machine), then the run ends by itself. Should a much
slower machine use it up first, the wait for training after the restart says so."""


def _trained(run_dir) -> int:
    return int(workers(run_dir).get("trainer/default/0", {}).get("version") or 0)


def test_a_killed_replay_worker_is_restarted_and_training_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    budget = f"stop.env_frames={FRAME_BUDGET}"
    args = ["run", "cartpole-dqn", *SMALL, budget, "--run-dir", str(run_dir)]
    proc = start([*args, "--no-display"])
    wait_for(lambda: all_alive(run_dir) and _trained(run_dir) > 3, proc, 300, "DQN training")
    before = workers(run_dir)["replay/default"]
    trained = _trained(run_dir)
    announced = [latest_version(run_dir) or 0]
    os.kill(before["pid"], signal.SIGKILL)

    def restarted():
        w = workers(run_dir)["replay/default"]
        return w["restarts"] == before["restarts"] + 1 and w["pid"] != before["pid"]

    wait_for(restarted, proc, 120, "the replay worker restarted")
    # the new buffer fills up to min_size again, then the trainer gets batches from it
    wait_for(lambda: _trained(run_dir) > trained + 20, proc, 300, "training after the restart")
    announced.append(latest_version(run_dir) or 0)
    out = finish(proc)  # the run ends by itself, on its frame budget
    assert proc.returncode == 0, out
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "env_frames", summary
    table = workers(run_dir)
    assert table["replay/default"]["restarts"] == 1
    assert {w: s["restarts"] for w, s in table.items() if w != "replay/default"} == dict.fromkeys(
        [w for w in table if w != "replay/default"], 0
    ), out
    assert {w: s["state"] for w, s in table.items() if s["state"] != "stopped"} == {}, out
    versions = [r["policy/default/version"] for r in read_metrics(run_dir)
                if r.get("policy/default/version") is not None]  # fmt: skip
    assert versions == sorted(versions), "a version went backwards in metrics.jsonl"
    assert announced == sorted(announced), f"latest.ckpt went backwards: {announced}"
    final = latest_version(run_dir)
    assert_no_version_lost(run_dir, final, [*versions, *announced])
    assert summary["policy_versions"]["default"] <= final
    assert not group(proc.pid), "processes outlived the run"
