"""A ``troupe stop`` that comes before a cluster run's controller can take a signal
(:mod:`distributed.launch.stop_request`): a real ``troupe controller`` process reads the
request from its run folder, as it starts or once it runs, and stops the run in order
(``tests/distributed/test_slurm.py`` does it through a real Slurm job)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from api.config import make_experiment
from distributed.launch import stop_request
from system import run_folder
from system.run import launch_end

ROOT = Path(__file__).resolve().parents[2]


def controller(run_dir: Path, launch: str | None = None) -> subprocess.Popen:
    """``troupe controller`` on ``run_dir``; ``launch``: as a Swarm task of that deployment."""
    config = make_experiment("cartpole-ppo", ["stop.eval_return=None"])
    run_folder.write_json(run_dir / run_folder.CONFIG, config.to_dict())
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    if launch is not None:
        env.update({launch_end.LAUNCH_ID_ENV: launch, launch_end.RUN_FOLDER_ENV: str(run_dir)})
    command = [sys.executable, "-m", "distributed.cli", "controller", str(run_dir),
               "--bind", "tcp://127.0.0.1:0", "--no-display", "--insecure"]  # fmt: skip
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip


def ended(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out


@pytest.mark.multiprocess
def test_a_request_written_before_the_controller_starts_stops_it_before_any_worker(tmp_path):
    run_dir = tmp_path / "early"
    stop_request.write(run_dir)
    code, out = ended(controller(run_dir))
    assert code == 130, out
    summary = json.loads((run_dir / run_folder.SUMMARY).read_text())
    assert summary["stop_reason"] == "interrupted" and summary["env_frames"] == 0
    assert not (run_dir / stop_request.FILE).exists()  # taken once: a resume runs


@pytest.mark.multiprocess
def test_a_request_written_as_the_controller_took_the_folder_stops_it_in_order(tmp_path):
    """``troupe stop`` saw no lock and wrote the request, and the controller took the lock
    meanwhile: it looks for requests as it runs too."""
    run_dir = tmp_path / "racing"
    proc = controller(run_dir)
    for _ in range(600):
        if stop_request.controller_listening(run_dir) or proc.poll() is not None:
            break
        time.sleep(0.1)
    assert proc.poll() is None
    stop_request.write(run_dir)
    code, out = ended(proc)
    assert code == 130, out
    summary = json.loads((run_dir / run_folder.SUMMARY).read_text())
    assert summary["stop_reason"] == "interrupted"


@pytest.mark.multiprocess
def test_a_run_its_user_stopped_is_not_resumed_by_its_controller_started_again(tmp_path):
    """`troupe stop` while Swarm starts a killed controller again goes through a request: that
    controller stopped the run and exited 130, and Swarm, which starts it again after any exit
    but 0, started it once more, and this one resumed the run its user had stopped."""
    run_dir = tmp_path / "stopped"
    stop_request.write(run_dir)
    code, out = ended(controller(run_dir, launch="s1"))
    assert code == 130, out
    summary = json.loads((run_dir / run_folder.SUMMARY).read_text())
    assert summary["stop_reason"] == "interrupted" and summary["launch_id"] == "s1"
    assert summary["stopped_by"] == "troupe stop"
    code, out = ended(controller(run_dir, launch="s1"))  # Swarm's restart
    said = " ".join(out.split())
    assert code == 0 and "(summary.json: interrupted, by troupe stop)" in said, out
    assert "nothing to resume" in said
    assert json.loads((run_dir / run_folder.SUMMARY).read_text()) == summary


def test_a_request_left_for_another_slurm_job_is_not_taken_as_this_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(launch_end, "_stopped_by", None)  # what a taken request sets
    stop_request.write(tmp_path, job_id="41")
    assert stop_request.take(tmp_path, {"SLURM_JOB_ID": "42"}) is None
    assert not (tmp_path / stop_request.FILE).exists()  # stale: removed
    stop_request.write(tmp_path, job_id="42")
    assert stop_request.take(tmp_path, {"SLURM_JOB_ID": "42"})["job_id"] == "42"
    stop_request.write(tmp_path)  # Swarm: no job
    assert stop_request.take(tmp_path, {})["by"] == "troupe stop"
    assert launch_end.stop_asked_by() == "troupe stop"  # the summary says so
