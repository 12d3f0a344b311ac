"""A worker started again after its run's end (Swarm, after an engine's restart) exits 0 at once,
and only for the end of its own launch (``system/run/launch_end.py``).

The controller side is a real ``troupe run`` given a launch id; the worker side is a real worker
process started as a container starts it, with no controller to answer it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from e2e_support import ROOT, finish, read_json, start

from system.run import launch_end


def _env(launch: str | None, folder) -> dict[str, str]:
    env = {launch_end.RUN_FOLDER_ENV: str(folder)}
    if launch is not None:
        env[launch_end.LAUNCH_ID_ENV] = launch
    return env


def test_only_a_summary_of_the_same_launch_is_an_end(tmp_path):
    assert launch_end.ended_summary(_env("a1", tmp_path)) is None  # no summary yet
    (tmp_path / "summary.json").write_text(json.dumps({"stop_reason": "interrupted"}))
    assert launch_end.ended_summary(_env("a1", tmp_path)) is None  # a launch that kept no id
    summary = {"stop_reason": "interrupted", "launch_id": "a1"}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert launch_end.ended_summary(_env("a1", tmp_path)) == summary
    assert launch_end.ended_summary(_env("b2", tmp_path)) is None  # deployed again: --resume
    assert launch_end.ended_summary(_env(None, tmp_path)) is None  # a launcher without ids
    assert launch_end.ended_summary({launch_end.LAUNCH_ID_ENV: "a1"}) is None  # nor a folder
    (tmp_path / "summary.json").write_text('{"stop_reason": "interr')  # half written
    assert launch_end.ended_summary(_env("a1", tmp_path)) is None


def _worker(tmp_path, launch: str) -> subprocess.Popen:
    """An actor as a Swarm task starts it, pointed at a controller address nobody serves."""
    command = [
        sys.executable, "-m", "system.run.worker_process", "--id", "actor/0", "--role",
        "actor", "--controller", "tcp://127.0.0.1:9",
    ]  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **_env(launch, tmp_path)}
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.mark.multiprocess
def test_a_worker_restarted_after_its_launchs_end_exits_0_without_waiting(tmp_path):
    summary = {"stop_reason": "interrupted", "launch_id": "a1"}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    ended = _worker(tmp_path, "a1")
    waiting = _worker(tmp_path, "b2")  # a later launch's worker: its controller may come yet
    try:
        out, _ = ended.communicate(timeout=60)
        assert ended.returncode == 0, out
        assert "actor/0: its run has ended (summary.json: interrupted)" in out, out
        time.sleep(2)
        assert waiting.poll() is None, waiting.stdout.read()
    finally:
        for proc in (ended, waiting):
            proc.kill()
            proc.communicate()


@pytest.mark.multiprocess
def test_the_controller_writes_its_launch_id_into_the_summary(tmp_path, monkeypatch):
    monkeypatch.setenv(launch_end.LAUNCH_ID_ENV, "c3")
    run_dir = tmp_path / "run"
    args = ["stop.eval_return=None", "stop.env_frames=2000", "evaluation.workers=0"]
    out = finish(start(["run", "cartpole-ppo", *args, "--run-dir", str(run_dir), "--no-display"]))
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "env_frames", out
    assert summary["launch_id"] == "c3"
