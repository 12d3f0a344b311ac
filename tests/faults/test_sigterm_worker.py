"""A worker sent SIGTERM by someone else than its controller (``kill PID``, a supervisor, an
operator) is stopped (its stop does its work: a trainer's last version) and restarted, as a
SIGKILLed one is restarted, and the run says so at its end.

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


TERM_ONCE = '''
import os
import signal
from pathlib import Path

import gymnasium as gym
import numpy as np

from api.environment import Environment, StepResult, register

SENT = Path(__file__).with_suffix(".sent")


class TermOnce(Environment):
    """Counts to 10; on its 300th step anywhere, once, its process is sent SIGTERM."""

    def __init__(self):
        self.t = self.steps = 0

    agent_count = 1
    observation_spaces = [gym.spaces.Box(0.0, 1.0, (1,), np.float32)]
    action_spaces = [gym.spaces.Discrete(2)]

    def seed(self, seed):
        pass

    def reset(self):
        self.t = 0
        return [StepResult(np.zeros(1, np.float32))]

    def step(self, actions):
        self.t, self.steps = self.t + 1, self.steps + 1
        if self.steps == 300:
            try:
                os.close(os.open(SENT, os.O_CREAT | os.O_EXCL))
                os.kill(os.getpid(), signal.SIGTERM)  # arrives inside this step
            except FileExistsError:
                pass
        done = self.t >= 10
        return [StepResult(np.full(1, self.t / 10, np.float32), float(actions[0]), done)]


register("TermOnce-v0", TermOnce)
'''


def test_sigterm_during_an_environment_step_is_not_taken_for_the_environments_error(tmp_path):
    """A signal arrives wherever the process is, most often inside an environment's step,
    whose errors the actor catches (``except Exception``). Its exception was raised there and
    taken for the environment's error; now the first one is only noted, and the actor is
    stopped and restarted as for any SIGTERM."""
    env_file = tmp_path / "term_once.py"
    env_file.write_text(TERM_ONCE)
    run_dir = tmp_path / "run"
    args = ["run", "TermOnce-v0", "--import", str(env_file), "frames=200000", "target=None",
            "evaluation.workers=0", "--run-dir", str(run_dir), "--no-display"]  # fmt: skip
    out = finish(start(args))
    assert (tmp_path / "term_once.sent").exists(), out[-3000:]
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "env_frames", out[-3000:]
    causes = {r["last_cause"] for r in summary["restarts"].values()}
    assert causes == {"left on SIGTERM, which its controller did not send"}, summary
    assert "Terminated" not in out, out[-3000:]  # the exception, taken for an error
