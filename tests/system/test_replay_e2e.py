"""End to end: ``troupe run cartpole-dqn`` with a replay worker between actors and trainer, as
real processes and sockets. Conditions are read from the run folder; no wall-clock assertions."""

from __future__ import annotations

import json

import pytest
from e2e_support import assert_stage_timings, finish, read_json, start

pytestmark = pytest.mark.multiprocess


def test_cartpole_dqn_trains_through_its_replay_worker_without_restarts(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    out = finish(
        start(
            [
                "run",
                "cartpole-dqn",
                "stop.eval_return=None",
                "stop.env_frames=3000",
                "--run-dir",
                str(run_dir),
                "--no-display",
            ]
        )
    )
    summary = read_json(run_dir / "summary.json")
    assert summary.get("stop_reason") == "env_frames", out[-3000:]
    workers = read_json(run_dir / "workers.json")
    roles = sorted(w["role"] for w in workers.values())
    # one actor of 32 environments and the evaluation actor
    assert roles == ["actor", "actor", "parameter_service", "policy", "replay", "trainer"]
    assert len({w["pid"] for w in workers.values()}) == 6  # separate OS processes
    assert all(w["restarts"] == 0 for w in workers.values()), workers
    assert_stage_timings(
        run_dir,
        {"replay": {"insert", "serve"}, "trainer": {"wait_replay", "receive", "compute"}},
    )
    # min_size is 1000 frames: versions go up only once batches come from the replay worker
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    versions = [r.get("policy/default/version") for r in records]
    versions = [v for v in versions if v is not None]
    assert versions and versions[-1] > 10, versions
    assert versions == sorted(versions)
    assert summary["policy_versions"]["default"] > 10
    # issue 26: the epsilon the actors get (from the policy worker) falls from 1.0 on its
    # schedule; a replay batch's age is reported as such, not as an on-policy lag
    epsilons = [r["policy/default/epsilon"] for r in records if "policy/default/epsilon" in r]
    assert epsilons and epsilons[-1] < 1.0 and epsilons == sorted(epsilons, reverse=True)
    assert not any("trainer/default/epsilon" in r or "trainer/default/version_lag" in r
                   for r in records)  # fmt: skip
    assert any(r.get("trainer/default/sample_age_versions") is not None for r in records)
    # the buffer was saved with the run's checkpoints, for a resume
    assert (run_dir / "checkpoints" / "default" / "replay.ckpt").stat().st_size > 0

    # resumed, the replay worker starts from the saved buffer (its log line says how full)
    monkeypatch.setenv("TROUPE_LOG_LEVEL", "INFO")
    target = summary["env_frames"] + 1000
    out = finish(
        start(["run", "--resume", str(run_dir), f"stop.env_frames={target}", "--no-display"])
    )
    assert read_json(run_dir / "summary.json").get("stop_reason") == "env_frames", out[-3000:]
    saved = [line for line in out.splitlines() if "resumed" in line and "replay frames" in line]
    assert saved and int(saved[0].split("resumed ")[1].split()[0]) >= 1000, out[-3000:]
