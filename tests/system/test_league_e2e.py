"""Run-wide coordination through the real ``troupe run``: a curriculum that advances and reaches
the actors' environments, and a PBT run whose worst member really takes a better one's weights."""

from __future__ import annotations

import json
import os
import signal

import msgpack
import pytest
from e2e_support import finish, read_json, start, wait_for

from system.run.coordination.pbt import HISTORY_FILE, PLOT_FILE
from system.run.coordination.state import STATE_FILE
from system.run.report import read_metrics

pytestmark = pytest.mark.multiprocess


def test_curriculum_advances_and_every_environment_plays_the_new_stage(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(
        [
            "run",
            "cartpole-curriculum",
            "--run-dir",
            str(run_dir),
            "--no-display",
            "curriculum.thresholds=[20.0, 30.0]",
            "curriculum.min_episodes=20",
            "stop.eval_return=None",
            # stage 2 comes at 30-40k frames; the rest leaves the evaluation actor time to start
            # an episode in it (at 60k frames a fast machine ended the run 1.2 s after the
            # switch, before the evaluation actor's next reset)
            "stop.env_frames=150000",
        ]
    )
    out = finish(proc, timeout=400)
    assert proc.returncode == 0, out[-3000:]
    records = read_metrics(run_dir)
    stages = [r.get("curriculum/stage") for r in records]
    assert stages[-1] == 2 and stages == sorted(stages), stages  # forward, one stage at a time
    # The environments' own info says which stage their episodes were played in: the training
    # actors' and the evaluation actor's alike.
    assert max(r.get("episode_info/curriculum_stage") or 0 for r in records) > 1.0
    assert max(r.get("eval/episode_info/curriculum_stage") or 0 for r in records) > 1.0
    saved = msgpack.unpackb((run_dir / STATE_FILE).read_bytes())
    assert saved["entries"]["curriculum/stage"][0] == {"index": 2, "stage": 2}
    assert read_json(run_dir / "summary.json")["curriculum_stage"] == 2
    # Evaluation plays the stage the run reached (it played stage 0: a run solved at 500 in
    # its last stage was reported at 100), and so do a loaded policy's environments.
    import troupe

    result = troupe.evaluate(run_dir, episodes=4)
    assert result.curriculum_stage == 2
    loaded = troupe.load_policy(run_dir)
    env = loaded.make_env()
    assert loaded.curriculum_stage == 2
    played = env.reset()[0].info.get("curriculum_stage")
    assert played == 2, played


def test_pbt_exploits_copy_weights_and_hyperparameters_without_a_restart(tmp_path):
    run_dir = tmp_path / "run"
    history = run_dir / HISTORY_FILE
    proc = start(
        [
            "run",
            "cartpole-pbt",
            "--run-dir",
            str(run_dir),
            "--no-display",
            "actors.envs_per_worker=8",
            "evaluation.envs_per_worker=2",
            "pbt.interval_steps=3",
            "pbt.eval_episodes=4",
            "pbt.target_return=None",
            # a whole-number one too: 4.8 epochs crashed a member's trainer in a loop
            'pbt.hyperparameters={"lr": [1e-05, 0.01], "entropy_coef": [0.0, 0.05], '
            '"epochs": [1, 10]}',
            "stop.env_frames=2000000",
        ]
    )
    try:
        wait_for(
            lambda: history.exists() and '"applied"' in history.read_text(),
            proc,
            timeout=400,
            what="an exploit applied by a member's trainer",
        )
        seen = len(read_metrics(run_dir))  # a few records more: the new lr is in the metrics
        wait_for(lambda: len(read_metrics(run_dir)) > seen + 3, proc, what="3 more records")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl+C: the run stops and writes its files
    out = finish(proc, timeout=120)
    events = [json.loads(line) for line in history.read_text().splitlines()]
    applied = next(e for e in events if e["event"] == "applied")
    order = next(
        e
        for e in events
        if e["event"] == "exploit"
        and e["member"] == applied["member"]
        and e["generation"] == applied["generation"]
    )
    assert applied["source"] == order["source"] != applied["member"]
    # The member's weights are now the source's (as the parameter service served them) under
    # its own next version, which its policy workers take like any new version.
    assert applied["digest_after"] == applied["digest_source"] != applied["digest_before"]
    assert applied["version_after"] == applied["version_before"] + 1
    assert applied["source_version"] >= 1
    # The trainer trains on with the new learning rate: PPO's own `lr` statistic says so.
    member, lr = applied["member"], order["new_hyperparameters"]["lr"]
    used = {r.get(f"trainer/{member}/lr") for r in read_metrics(run_dir)}
    assert any(u is not None and u == pytest.approx(lr) for u in used), (lr, used)
    workers = read_json(run_dir / "workers.json")
    assert workers[f"trainer/{member}/0"]["restarts"] == 0
    assert (run_dir / PLOT_FILE).stat().st_size > 0, out[-3000:]
    summary = read_json(run_dir / "summary.json")
    assert summary["pbt"]["exploits_applied"] >= 1
    assert all(
        type(e["hyperparameters"]["epochs"]) is int for e in events if "hyperparameters" in e
    )
    assert "TypeError" not in out
    # `troupe eval` of the population: every member plays, the run's best is reported
    import troupe

    result = troupe.evaluate(run_dir, episodes=2, envs=1)
    assert set(result.per_policy) == {"member0", "member1", "member2", "member3"}
    assert result.policy == summary["pbt"]["best_member"] and result.episodes == 2
    assert troupe.load_policy(run_dir).name == result.policy  # what a video or `act` plays
    checkpoint = max((run_dir / "checkpoints" / "member2").glob("v*.ckpt"))
    assert troupe.evaluate(checkpoint, episodes=2, envs=1).policy == "member2"
