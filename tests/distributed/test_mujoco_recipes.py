"""Issue 26, item 3: MuJoCo tasks get the recipes the field's published figures come from
(``legacy/experiments/mujoco.py``), through ``troupe train ENV`` like any gymnasium id, and run
end to end as separate processes without MuJoCo's console noise or log file."""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from api.errors import ConfigError, UserError
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


def test_a_small_sac_budget_is_told_by_its_budget_not_by_the_buffer():
    """``troupe train InvertedPendulum-v5 --algo sac frames=5000``, a user's first try, was
    refused as "5000 frames can never be in a buffer of capacity_frames=5000", two keys the
    user never set: the buffer was as large as the budget. It now runs; a budget below the
    recipe's first batch is refused by the budget's own words."""
    load_experiment("sac", ["env=InvertedPendulum-v5", "frames=5000"])  # valid: it loads
    with pytest.raises(ConfigError, match=r"stop.env_frames=3000 ends the run before that"):
        load_experiment("sac", ["env=InvertedPendulum-v5", "frames=3000"])


def test_the_recipes_refuse_what_they_cannot_train():
    with pytest.raises(UserError, match="Box actions"):
        mujoco_ppo("CartPole-v1")
    with pytest.raises(UserError, match="Box actions"):
        mujoco_sac("Acrobot-v1")


@pytest.fixture(scope="module")
def hopper_run(tmp_path_factory):
    """Two trainer steps of the real recipe as a user starts it, from a working directory of
    their own; the folder and the run's console output."""
    cwd = tmp_path_factory.mktemp("hopper")
    frames = 2 * PPO_BATCH
    result = subprocess.run(
        [sys.executable, "-m", "distributed.cli", "train", "Hopper-v5", f"frames={frames}",
         "evaluation.workers=0", "stop.eval_return=None",
         "--run-dir", str(cwd / "run"), "--no-display"],
        capture_output=True, text=True, timeout=300, cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    return cwd, output


def test_troupe_train_hopper_runs_end_to_end_quietly(hopper_run):
    """No ``MUJOCO_LOG.TXT`` left in the user's directory and no MuJoCo warning on the
    console."""
    cwd, output = hopper_run
    summary = json.loads((cwd / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "env_frames" and summary["env_frames"] >= 2 * PPO_BATCH
    records = [json.loads(line) for line in (cwd / "run" / "metrics.jsonl").open()]
    assert max(r.get("trainer/default/steps") or 0 for r in records) >= 1
    assert any(r.get("episode_return") is not None for r in records)  # Hopper falls early
    assert not (cwd / "MUJOCO_LOG.TXT").exists()
    assert "WARNING: compiler" not in output and "mujoco" not in output.lower()


def test_a_mujoco_models_deprecation_note_stays_off_the_console(tmp_path):
    """HalfCheetah's model makes MuJoCo say "'settotalmass' is deprecated": five console lines
    of `troupe test-env` and `troupe train`, which the user cannot act on."""
    result = subprocess.run(
        [sys.executable, "-m", "distributed.cli", "test-env", "HalfCheetah-v5"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "HalfCheetah-v5: passed" in result.stdout
    assert "mujoco" not in (result.stdout + result.stderr).lower()


def test_eval_video_of_a_mujoco_run_draws_without_a_display(hopper_run, tmp_path):
    """``troupe eval RUN --video`` on a machine without a display (CI, a server, a container)
    ended in MuJoCo's "an OpenGL platform library has not been loaded": gymnasium tried GLFW.
    Off-screen OpenGL is now picked where the machine has it; where it has none, the error says
    what to install and set."""
    cwd, _ = hopper_run
    out = tmp_path / "hopper.mp4"
    headless = {k: v for k, v in os.environ.items() if k not in HEADLESS_UNSET}
    result = subprocess.run(
        [sys.executable, "-m", "distributed.cli", "eval", str(cwd / "run"), "--episodes", "1",
         "--video", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**headless, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    said = result.stdout + result.stderr
    if not any(ctypes.util.find_library(lib) for lib in ("EGL", "OSMesa")):
        assert result.returncode == 1 and "MUJOCO_GL=egl" in said, said[-3000:]
        return
    assert result.returncode == 0, said[-3000:]
    imageio = pytest.importorskip("imageio.v3")
    frames = imageio.imread(out, index=None)
    assert frames.shape[0] >= 2 and frames.shape[-1] == 3
    assert frames.std() > 1.0  # a drawn scene, not a blank buffer


RECORD_AND_MEASURE = """\
import json, sys, tracemalloc
from distributed.api import load_policy
from distributed.video import record_video
run, out = sys.argv[1:]
load_policy(run)  # imports and the network, before memory is counted
tracemalloc.start()
returns = record_video(run, out, episodes=2).returns
print(json.dumps({"returns": returns, "peak": tracemalloc.get_traced_memory()[1]}))
"""


def test_eval_video_writes_frames_as_they_are_drawn(hopper_run, tmp_path):
    """The video's frames were kept in memory until the last episode ended: 0.7 GB per 1,000
    of a MuJoCo task's 480x480 frames, gigabytes for ten Pong games. Now each is written as it
    is drawn, so the recording's peak memory is far below its frames' size."""
    cwd, _ = hopper_run
    if not any(ctypes.util.find_library(lib) for lib in ("EGL", "OSMesa")):
        pytest.skip("no off-screen OpenGL (libEGL or libOSMesa) on this machine")
    out = tmp_path / "hopper.mp4"
    headless = {k: v for k, v in os.environ.items() if k not in HEADLESS_UNSET}
    result = subprocess.run(
        [sys.executable, "-c", RECORD_AND_MEASURE, str(cwd / "run"), str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**headless, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    frames = pytest.importorskip("imageio.v3").imread(out, index=None)
    assert len(measured["returns"]) == 2 and frames.shape[0] >= 20
    assert measured["peak"] < frames.nbytes / 4, (measured["peak"], frames.nbytes)


HEADLESS_UNSET = ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL", "PYOPENGL_PLATFORM")
