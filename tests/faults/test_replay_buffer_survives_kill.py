"""SIGKILL of an off-policy run's replay worker loses at most the frames since its last periodic
save: the restarted worker loads ``checkpoints/<policy>/replay.ckpt`` and starts with those frames
instead of an empty buffer (cartpole-dqn, saving every half second), and with at least min_size
frames when the trainer had been training, so the trainer gets batches without waiting for a
refill.

The run's output goes to a file (logged at INFO, which a pipe nobody reads could fill), and the
restored size is read from the restarted worker's own log line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from lifecycle_support import (
    ROOT,
    SMALL,
    TROUPE,
    all_alive,
    end_run,
    group,
    leftovers,
    workers,
)

from api.config import make_experiment

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess]

RESUMED = re.compile(r"replay/default: resumed (\d+) replay frames from ")
MIN_SIZE = make_experiment("cartpole-dqn").policies["default"].replay.min_size


def _trained(run_dir: Path) -> int:
    return int(workers(run_dir).get("trainer/default/0", {}).get("version") or 0)


def _wait(condition, proc: subprocess.Popen, log: Path, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if proc.poll() is not None:
            pytest.fail(f"troupe exited ({proc.returncode}) before {what}:\n{log.read_text()}")
        time.sleep(0.1)
    pytest.fail(f"timed out ({timeout}s) waiting for {what}:\n{log.read_text()[-3000:]}")


def test_a_killed_replay_worker_restarts_from_its_saved_buffer(tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "troupe.log"
    saved = run_dir / "checkpoints" / "default" / "replay.ckpt"
    args = [
        *("run", "cartpole-dqn", *SMALL, "stop.env_frames=100000000"),
        *("policies.default.replay.save_every_s=0.5", "--run-dir", str(run_dir), "--no-display"),
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*TROUPE, *args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: every process of the run is in it
            env={**os.environ, "TROUPE_LOG_LEVEL": "INFO"},
        )
    try:
        # the trainer trains once min_size frames are in; the next save holds at least those
        _wait(lambda: all_alive(run_dir) and _trained(run_dir) > 3, proc, log, "DQN training")
        _wait(saved.exists, proc, log, "a periodic save")
        first = saved.stat().st_mtime_ns
        _wait(lambda: saved.stat().st_mtime_ns != first, proc, log, "a save after training began")
        assert not RESUMED.search(log.read_text())  # the first replay worker started empty
        before = workers(run_dir)["replay/default"]
        os.kill(before["pid"], signal.SIGKILL)

        def restarted():
            w = workers(run_dir).get("replay/default", {})
            return w.get("restarts") == before["restarts"] + 1 and w.get("state") == "alive"

        _wait(restarted, proc, log, "the replay worker restarted")
        _wait(lambda: RESUMED.search(log.read_text()), proc, log, "the restored buffer's log line")
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        end_run(proc)
    out = log.read_text()
    (restored,) = [int(n) for n in RESUMED.findall(out)]
    assert restored >= MIN_SIZE, out[-3000:]  # so the trainer need not wait for a refill
    assert proc.returncode == 130, out[-3000:]
    assert workers(run_dir)["replay/default"]["restarts"] == 1
    assert not leftovers(run_dir)
    assert not group(proc.pid), "processes outlived the run"
