"""Issue 26, item 3: MuJoCo tasks get the recipes the field's published figures come from
(``legacy/experiments/mujoco.py``), through ``troupe train ENV`` like any gymnasium id, and run
end to end as separate processes without MuJoCo's console noise or log file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from api.errors import UserError
from api.resolve import load_experiment
from legacy.environment.gym_adapter import is_mujoco
from legacy.experiments.mujoco import PPO_BATCH, mujoco_ppo, mujoco_sac

pytest.importorskip("mujoco", reason="the mujoco extra: pip install -e '.[mujoco]'")

ROOT = Path(__file__).resolve().parents[2]


def test_mujoco_tasks_are_told_apart_by_gymnasium_entry_point():
    assert is_mujoco("Hopper-v5") and is_mujoco("HalfCheetah-v5") and is_mujoco("Ant-v4")
    assert not is_mujoco("Pendulum-v1") and not is_mujoco("CartPole-v1")
    assert not is_mujoco("no-such-env") and not is_mujoco("pettingzoo:classic/rps_v2")


@pytest.mark.parametrize("algo", ["auto", "ppo", "mujoco-ppo"])
def test_troupe_train_runs_cleanrl_ppo_recipe_on_mujoco(algo):
    config = load_experiment(algo, ["env=Hopper-v5"])
    default = config.policies["default"]
    trainer, policy = default.trainer.args, default.policy.args
    per_step = default.batch_segments * config.actors.segment_length
    assert (default.policy.type, default.trainer.type) == ("actor-critic", "ppo")
    assert per_step == PPO_BATCH and PPO_BATCH // trainer["minibatches"] == 64
    assert trainer["total_steps"] == 1_000_000 // PPO_BATCH and trainer["lr_schedule"] == "linear"
    assert (trainer["lr"], trainer["gamma"], trainer["epochs"]) == (3e-4, 0.99, 10)
    assert (trainer["entropy_coef"], trainer["value_clip"]) == (0.0, 0.2)
    assert policy["normalize_obs"] and policy["normalize_returns"]
    assert config.name == "hopper-v5-ppo" and config.stop.env_frames == 1_000_000
    assert config.stop.eval_return == 3800.0  # gymnasium's reward_threshold for Hopper


def test_algo_sac_runs_cleanrl_sac_recipe_on_mujoco():
    config = load_experiment("sac", ["env=HalfCheetah-v5", "frames=300000"])
    default = config.policies["default"]
    assert (default.policy.type, default.trainer.type) == ("sac-policy", "sac")
    assert default.policy.args["hidden_sizes"] == [256, 256]
    assert default.replay.batch_size == 256 and default.replay.samples_per_insert == 256.0
    assert default.replay.capacity_frames == 300_000 and default.replay.min_size == 5000
    assert config.stop.env_frames == 300_000
    # elsewhere --algo sac keeps pendulum-sac's recipe
    assert load_experiment("sac", ["env=Pendulum-v1"]).policies["default"].replay.batch_size == 128


def test_the_recipes_refuse_what_they_cannot_train():
    with pytest.raises(UserError, match="Box actions"):
        mujoco_ppo("CartPole-v1")
    with pytest.raises(UserError, match="Box actions"):
        mujoco_sac("Acrobot-v1")


def test_troupe_train_hopper_runs_end_to_end_quietly(tmp_path):
    """Two trainer steps of the real recipe as a user starts it, from a working directory of
    their own: no ``MUJOCO_LOG.TXT`` left there and no MuJoCo warning on the console."""
    frames = 2 * PPO_BATCH
    result = subprocess.run(
        [sys.executable, "-m", "distributed.cli", "train", "Hopper-v5", f"frames={frames}",
         "evaluation.workers=0", "stop.eval_return=None",
         "--run-dir", str(tmp_path / "run"), "--no-display"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "env_frames" and summary["env_frames"] >= frames
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert max(r.get("trainer/default/steps") or 0 for r in records) >= 1
    assert any(r.get("episode_return") is not None for r in records)  # Hopper falls early
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
    assert "WARNING: compiler" not in output and "mujoco" not in output.lower()
