"""A run whose workers are all up but none moves fails (exit 1) naming what waits, instead of
running idle for ever (system/run/stall_watch.py).

The stall here is real: the only actor's environment (CartPole) blocks in ``step`` for 45 s
(inside the 60 s a poll may take before the worker counts as hung), so no frame is stepped and
the trainer waits for samples, every worker alive. With ``stop.stall_seconds=6`` the run fails
within seconds of it. Before the watch, it went on idle, then on to its frame budget and exit 0.
"""

from __future__ import annotations

import pytest
from lifecycle_support import SMALL, end_run, finish, read_json, start

pytestmark = pytest.mark.faults

SLEEPY = """
import time

import gymnasium as gym


class Sleepy(gym.Wrapper):
    \"\"\"CartPole whose steps block for 45 s once the process has stepped 3000 times.\"\"\"

    steps = 0

    def step(self, action):
        Sleepy.steps += 1
        if Sleepy.steps == 3000:
            time.sleep(45)
        return self.env.step(action)


gym.register("Sleepy-v0", entry_point=lambda **kw: Sleepy(gym.make("CartPole-v1", **kw)))
"""


def test_a_run_in_which_nothing_moves_fails_naming_the_waits(tmp_path):
    code = tmp_path / "sleepy.py"
    code.write_text(SLEEPY)
    run_dir = tmp_path / "run"
    proc = start(["train", "Sleepy-v0", "--import", str(code), "--run-dir", str(run_dir),
                  "--no-display", *SMALL, "actors.workers=1", "stop.env_frames=1000000",
                  "stop.stall_seconds=6"])  # fmt: skip
    try:
        out = finish(proc, timeout=120)
    finally:
        end_run(proc)
    assert proc.returncode == 1, out[-3000:]
    assert "the run is stalled: no training frames" in out, out[-3000:]
    # every role, not the one waiter the panel's bottleneck line picks among those that tie
    assert "actor busy" in out and "policy waits" in out and "trainer waits" in out, out[-3000:]
    assert "stop.stall_seconds" in out, out[-3000:]
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "failed" and 0 < summary["env_frames"] < 1_000_000
