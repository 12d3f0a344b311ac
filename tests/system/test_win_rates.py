"""A multi-agent run's win-rate curves (``win_rates.png``): which side of each matchup is drawn,
and that a single-agent run gets none."""

from __future__ import annotations

from pathlib import Path

from test_monitor import assert_png, write_lines

from system.run.report import matchup_keys, write_win_rates


def selfplay_records() -> list[dict]:
    return [
        {
            "env_frames": i * 1000,
            "result/main_vs_past": 0.5 + i / 100,
            "result/past_vs_main": 0.5 - i / 100,
            "eval/result/heuristic_vs_main": 1 - i / 30,
            "eval/result/main_vs_heuristic": i / 30,
            "eval/result/a_vs_b": 0.5,  # two scripted players: the first by name
            "eval/result/b_vs_a": 0.5,
        }
        for i in range(1, 30)
    ]


def test_one_side_of_each_matchup_is_drawn_the_trained_policy_s():
    keys = matchup_keys(selfplay_records(), first=["main"])
    assert keys == ["eval/result/a_vs_b", "eval/result/main_vs_heuristic", "result/main_vs_past"]


def test_a_selfplay_run_gets_win_rate_curves(tmp_path: Path):
    write_lines(tmp_path, selfplay_records())
    path = write_win_rates(tmp_path, "connect4", first=["main"])
    assert path == tmp_path / "win_rates.png"
    assert_png(path)
    assert not list(tmp_path.glob(".*.tmp.png"))


def test_a_single_agent_run_gets_none(tmp_path: Path):
    write_lines(tmp_path, [{"env_frames": 10, "episode_return": 1.0}])
    assert write_win_rates(tmp_path) is None
    assert not (tmp_path / "win_rates.png").exists()
