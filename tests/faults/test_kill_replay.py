"""SIGKILL of an off-policy run's replay worker: it is restarted, refills from the actors, and
its trainer and actors follow it to its new address, so training goes on (cartpole-dqn)."""

from __future__ import annotations

import os
import signal

import pytest
from lifecycle_support import SMALL, all_alive, finish, group, start, wait_for, workers

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess]


def _trained(run_dir) -> int:
    return int(workers(run_dir).get("trainer/default/0", {}).get("version") or 0)


def test_a_killed_replay_worker_is_restarted_and_training_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    args = ["run", "cartpole-dqn", *SMALL, "stop.env_frames=100000000", "--run-dir", str(run_dir)]
    proc = start([*args, "--no-display"])
    wait_for(lambda: all_alive(run_dir) and _trained(run_dir) > 3, proc, 300, "DQN training")
    before = workers(run_dir)["replay/default"]
    trained = _trained(run_dir)
    os.kill(before["pid"], signal.SIGKILL)

    def restarted():
        w = workers(run_dir)["replay/default"]
        return w["restarts"] == before["restarts"] + 1 and w["pid"] != before["pid"]

    wait_for(restarted, proc, 120, "the replay worker restarted")
    # the new buffer fills up to min_size again, then the trainer gets batches from it
    wait_for(lambda: _trained(run_dir) > trained + 20, proc, 300, "training after the restart")
    os.killpg(proc.pid, signal.SIGINT)
    out = finish(proc)
    assert proc.returncode == 130, out
    table = workers(run_dir)
    assert table["replay/default"]["restarts"] == 1
    assert {w: s["restarts"] for w, s in table.items() if w != "replay/default"} == dict.fromkeys(
        [w for w in table if w != "replay/default"], 0
    ), out
    assert {w: s["state"] for w, s in table.items() if s["state"] != "stopped"} == {}, out
    assert not group(proc.pid), "processes outlived the run"
