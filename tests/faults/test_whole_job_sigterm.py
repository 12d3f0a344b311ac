"""A whole job sent SIGTERM at once: a preempted Slurm job, ``kubectl delete`` of a run, a node
shut down. The controller and every worker get the signal together.

Every worker used to leave at once, without its stop. The controller, which stops the run in
order on SIGTERM, found no trainer and no parameter service left to send and write the last
version: the run ended ``failed`` ("trainer/default/0 did not finish its stop; its last
checkpoint may be missing", exit 1), the versions since its last checkpoint lost. Now a worker
sent SIGTERM tells its controller and waits for its stop (:mod:`system.run.term_signal`), and
the run ends as a Ctrl+C ends it: in order, the last version written. As a scheduler runs it:
the real ``troupe controller`` and one ``troupe worker`` process per worker.
"""

from __future__ import annotations

import os
import signal

import pytest
from lifecycle_support import (
    end_run,
    ended,
    latest_version,
    read_json,
    scheduled_running,
    start_scheduled,
    wait_for,
)

from api.config import make_experiment

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess]


def test_a_job_signalled_whole_stops_in_order_and_writes_its_last_version(tmp_path):
    run_dir = tmp_path / "run"
    config = make_experiment("cartpole-ppo", [
        "actors.workers=2", "actors.envs_per_worker=2", "evaluation.workers=0",
        "stop.eval_return=None", "stop.env_frames=1000000000",
        "checkpoint.every=1000000", "checkpoint.every_seconds=None",  # only the stop writes one
    ])  # fmt: skip
    controller, workers = start_scheduled(run_dir, config, [])
    try:
        running = lambda: scheduled_running(run_dir, controller, len(workers))  # noqa: E731
        wait_for(running, None, 300, "every worker alive and frames counted")
        trainer = lambda: read_json(run_dir / "workers.json")["trainer/default/0"]  # noqa: E731
        trained = lambda: (trainer().get("version") or 0) > 5  # noqa: E731
        wait_for(trained, None, 120, "versions published")
        for proc in (*workers.values(), controller):  # as Slurm signals a job's steps
            os.kill(proc.pid, signal.SIGTERM)
        ended(controller, run_dir, timeout=120)
        codes = {wid: proc.wait(timeout=60) for wid, proc in workers.items()}
    finally:
        end_run(controller, *workers.values())
    out = (run_dir / "controller.log").read_text()
    summary = read_json(run_dir / "summary.json")
    assert summary.get("stop_reason") == "interrupted", summary
    assert "failure" not in summary and "unstopped" not in summary, summary
    assert controller.returncode == 130, out[-3000:]
    # its log ends with the summary troupe run prints (Swarm's, Kubernetes', Slurm's logs)
    assert "'stop_reason': 'interrupted'" in out and "'best_eval_return'" in out, out[-3000:]
    final = summary["policy_versions"]["default"]
    assert latest_version(run_dir) == final > 5, (latest_version(run_dir), summary)
    assert (run_dir / "checkpoints" / "default" / f"v{final:08d}.ckpt").exists()
    assert set(codes.values()) == {0}, codes  # the run's stop: no scheduler starts one again
    assert "restarts" not in summary, summary
