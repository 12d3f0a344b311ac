"""Issue 15, item 3: a trainer whose step outlasts the controller's heartbeat timeout is not taken
for dead. Before the busy heartbeat thread, the worker loop beat only between polls, so a trainer
silent for longer than the timeout (a CNN update on a loaded machine) was restarted. The same
thread beats through a worker's stop: a last save longer than the 15 s every stop was given is
waited for, where it was killed and the run failed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from api import registry
from api.config import make_experiment
from distributed.launch.local import LocalLauncher
from system.run.controller import Controller
from system.run.report import read_metrics

pytestmark = pytest.mark.multiprocess

SLOW = Path(__file__).resolve().parent / "user_code" / "slow_trainer.py"
HEARTBEAT_TIMEOUT_S = 2.0
"""Much shorter than one trainer step (``slow_trainer.STEP_S`` = 5 s plus PPO itself)."""


def _cartpole_with(trainer: str, cls: str, *overrides: str):
    """cartpole-ppo, one actor, no evaluation, trained by ``slow_trainer``'s ``cls``."""
    registry.register_trainer(trainer, f"slow_trainer:{cls}", source=str(SLOW), override=True)
    try:
        return make_experiment("cartpole-ppo", [
            f"policies.default.trainer.type={trainer}", "actors.workers=1",
            "evaluation.workers=0", "stop.eval_return=None", *overrides,
        ])  # fmt: skip
    finally:
        registry.trainers.unregister(trainer)


def test_a_trainer_step_longer_than_the_heartbeat_timeout_is_not_restarted(tmp_path):
    config = _cartpole_with(
        "slow-ppo", "SlowPPOTrainer", "actors.envs_per_worker=16", "stop.env_frames=6000"
    )
    assert [r.name for r in config.code.registrations] == ["slow-ppo"]
    controller = Controller(
        config, tmp_path, LocalLauncher(), display=False, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S
    )
    summary = controller.run()
    assert summary["stop_reason"] == "env_frames", summary
    workers = json.loads((tmp_path / "workers.json").read_text())
    assert {w: s["restarts"] for w, s in workers.items() if s["restarts"]} == {}, workers
    steps = [r["trainer/default/step_s"] for r in read_metrics(tmp_path)
             if r.get("trainer/default/step_s") is not None]  # fmt: skip
    assert steps and min(steps) > 2 * HEARTBEAT_TIMEOUT_S, steps  # the steps were that long


def test_a_last_save_longer_than_the_stop_bound_is_waited_for(tmp_path):
    config = _cartpole_with("slow-save-ppo", "SlowSavePPOTrainer", "stop.env_frames=3000")
    controller = Controller(config, tmp_path, LocalLauncher(), display=False)
    summary = controller.run()
    assert summary["stop_reason"] == "env_frames" and "failure" not in summary, summary
    assert summary["policy_versions"]["default"] >= 1  # the last version, saved slowly, is there
