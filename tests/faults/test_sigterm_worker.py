"""A worker sent SIGTERM by someone else than its controller (``kill PID``, a supervisor, an
operator) is restarted, as a SIGKILLed one is, and the run says so at its end.

It used to say bye as if its controller had stopped it: the controller took it for stopped,
never restarted it, and the run went on without it. With the trainer gone, the actors made
frames no one trained on, and the run still ended by its budget with exit 0 and no word of it.
"""

from __future__ import annotations

import os
import signal

import pytest
from lifecycle_support import SMALL, all_alive, finish, read_json, start, wait_for, workers

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess]

VICTIMS = ["trainer/default/0", "actor/0"]


def test_a_worker_sent_sigterm_is_restarted_and_named_at_the_end(tmp_path):
    run_dir = tmp_path / "run"
    args = ["run", "cartpole-ppo", *SMALL, "stop.env_frames=60000", "--run-dir", str(run_dir)]
    proc = start([*args, "--no-display"])
    wait_for(lambda: all_alive(run_dir), proc, 300, "every worker alive")
    before = workers(run_dir)
    for wid in VICTIMS:
        os.kill(before[wid]["pid"], signal.SIGTERM)

    def restarted() -> bool:
        now = workers(run_dir)
        return all(
            now[w]["restarts"] == 1 and now[w]["pid"] != before[w]["pid"] and
            now[w]["state"] == "alive" for w in VICTIMS
        )  # fmt: skip

    wait_for(restarted, proc, 120, "both workers restarted")
    out = finish(proc)  # the run ends by itself, on its frame budget
    assert proc.returncode == 0, out[-3000:]
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "env_frames", summary
    cause = "left on SIGTERM, which its controller did not send"
    assert {w: r["last_cause"] for w, r in summary["restarts"].items()} == dict.fromkeys(
        VICTIMS, cause
    ), summary
    assert f"trainer/default/0 1 time (last: {cause})" in out, out[-3000:]
    assert {w: s["state"] for w, s in workers(run_dir).items() if s["state"] != "stopped"} == {}
