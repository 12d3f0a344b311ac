"""SIGKILL of a run's controller: every process of the run leaves by itself, and the run resumes.

Workers are children of a forkserver, not of the controller, so nothing but their own watch
(:class:`system.run.connection_watch.ConnectionWatch`, heartbeat answers) ends them.
"""

from __future__ import annotations

import os
import signal

import pytest
from lifecycle_support import (
    SMALL,
    all_alive,
    children,
    describe,
    finish,
    frames,
    group,
    latest_version,
    read_json,
    start,
    wait_for,
)

from system.run.report import read_metrics

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess]

GONE_WITHIN_S = 5.0
"""What the issue asks for: every worker, the forkserver and the resource tracker gone."""


def _frames_in_latest(run_dir) -> int:
    """``latest.json``'s frames (0 before its first write). On a loaded CI machine the trainer
    had published version 3 before the controller's report counted a frame: the test then
    compared a thinned file's 0 frames with latest.json's 0."""
    return int(read_json(run_dir / "latest.json").get("env_frames") or 0)


def test_controller_sigkill_ends_every_process_and_resume_continues(tmp_path):
    """The run thins its record from the start, as a day-old run does (one a minute):
    ``metrics.jsonl`` then lags the run, and the resume counts on from ``latest.json``."""
    run_dir = tmp_path / "run"
    args = ["run", "cartpole-ppo", *SMALL, "stop.env_frames=100000000", "--run-dir", str(run_dir),
            "metrics.thin=[[0, 3600]]"]  # fmt: skip
    proc = start([*args, "--no-display"])
    wait_for(
        lambda: (
            all_alive(run_dir)
            and (latest_version(run_dir) or 0) >= 3
            and _frames_in_latest(run_dir) > 0
        ),  # the report lags a loaded machine's trainer
        proc,
        300,
        "every worker alive, version 3 published and frames in latest.json",
    )
    (controller,) = children(proc.pid)  # `troupe run` waits on its one child, the controller
    os.kill(controller, signal.SIGKILL)

    # Every process but `troupe run` itself, which reports the loss and exits in its own time.
    def others():
        return [p for p in group(proc.pid) if p != proc.pid]

    try:
        wait_for(lambda: not others(), None, GONE_WITHIN_S, "every process to end")
    except pytest.fail.Exception:
        left = describe(others())
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"still running {GONE_WITHIN_S}s after the controller was killed:\n{left}")
    out = finish(proc)
    assert proc.returncode == 128 + signal.SIGKILL, out
    assert f"Continue with: troupe run --resume {run_dir}" in " ".join(out.split()), out
    last, frames_before = latest_version(run_dir), read_json(run_dir / "latest.json")["env_frames"]
    assert frames(run_dir) < frames_before  # the thinned file holds only the first record
    records_before = len(read_metrics(run_dir))

    resumed = start(["run", "--resume", str(run_dir), f"stop.env_frames={frames_before + 4000}",
                     "--no-display"])  # fmt: skip
    out = finish(resumed)
    assert resumed.returncode == 0, out
    assert read_json(run_dir / "summary.json")["stop_reason"] == "env_frames"
    versions = [
        r["policy/default/version"]
        for r in read_metrics(run_dir)[records_before:]
        if r.get("policy/default/version") is not None
    ]
    assert versions and min(versions) >= last, (last, versions[:5])  # went on, not back
    assert read_metrics(run_dir)[records_before]["env_frames"] >= frames_before
    assert latest_version(run_dir) > last
