"""Self-play through the real ``troupe run`` (issue 14): the learner meets snapshots of itself
played by the opponent's policy worker, scripted opponents in evaluation, and the run folder
rates them all; ``troupe eval`` reports each matchup. A learning check (``pytest -m selfplay``):
the learner beats the random player and the connect-four heuristic in greedy evaluation within
15 minutes."""

from __future__ import annotations

import json

import pytest
from e2e_support import finish, read_json, start

from system.run.report import read_metrics

pytest.importorskip("pettingzoo")
pytestmark = pytest.mark.multiprocess


def test_a_short_selfplay_run_meets_past_versions_and_rates_them(tmp_path):
    run_dir = tmp_path / "run"
    args = ["stop.env_frames=30000", "stop.eval_return=None", "selfplay.swap_every_s=0.5"]
    out = finish(start(["run", "connect4-selfplay", *args, "--run-dir", str(run_dir),
                        "--no-display"]), timeout=400)  # fmt: skip
    summary = read_json(run_dir / "summary.json")
    assert summary.get("stop_reason") == "env_frames", out[-3000:]
    workers = read_json(run_dir / "workers.json")
    assert sum(w["restarts"] for w in workers.values()) == 0, workers
    assert (run_dir / "win_rates.png").exists()  # every matchup's score by frames
    table = json.loads((run_dir / "ratings.json").read_text())
    names = {row["name"] for row in table}
    assert {"main", "random", "heuristic"} <= names
    snapshots = [n for n in names if n.startswith("main@")]
    assert snapshots, names  # the opponent played versions of main it drew from its pool
    # v0: the initial weights (the same seed builds both), until the first snapshot arrives
    assert all(int(n.split("@")[1]) >= 0 for n in snapshots) and len(snapshots) > 1, snapshots
    last = read_metrics(run_dir)[-1]
    for key in ("result/main_vs_past", "eval/result/main_vs_random", "rating/main"):
        assert key in last, sorted(last)
    assert summary["ratings"][0]["name"] in names
    evaluation = start(["eval", str(run_dir), "--episodes", "20", "--json"])
    result = json.loads(finish(evaluation, timeout=300).strip().splitlines()[-1])
    assert set(result["results"]) >= {"main_vs_random", "main_vs_heuristic"}
    assert result["episodes"] == 20


@pytest.mark.learning
@pytest.mark.selfplay
@pytest.mark.timeout(1500)
def test_selfplay_beats_random_and_the_heuristic_within_15_minutes(tmp_path):
    """Not part of CI's learning stage (``-m "learning and not selfplay"``): it takes up to 15
    minutes, and a run can miss (the last 12 met it, one after 832 s). The run stops when one
    version of ``main`` confirms the target in the run, and ``troupe eval`` plays that version;
    BENCHMARKS.md has each run made (runs 1-6 before versions were held for evaluation, A-K
    after, N1-P4 with windows that end once out of reach, C1-C7 with the symmetric network and
    entropy 0.03, S1-S5 with one body for policy and value and cheaper evaluation)."""
    run_dir = tmp_path / "run"
    out = finish(
        start(["run", "connect4-selfplay", "--run-dir", str(run_dir), "--no-display"]), 1200
    )
    summary = read_json(run_dir / "summary.json")
    assert summary.get("stop_reason"), out[-3000:]
    evaluation = start(["eval", str(run_dir), "--episodes", "200", "--json"])
    result = json.loads(finish(evaluation, timeout=600).strip().splitlines()[-1])
    scores = result["results"]
    if summary.get("solved"):  # the version that confirmed the target is the one played
        assert result["versions"] == {"main": summary["solved_version"]["version"]}, summary
    print(
        f"connect4-selfplay: stopped on {summary['stop_reason']} after {summary['wall_s']:.0f}s "
        f"and {summary['env_frames']} frames, version {result['versions']}; 200 greedy "
        f"episodes: {scores}",
        flush=True,
    )
    assert scores["main_vs_random"] > 0.95 and scores["main_vs_heuristic"] > 0.70, scores
