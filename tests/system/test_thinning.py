"""A long run's metrics on disk (``metrics.thin``): every record for the first hour, then one in
10 s, then one a minute, with each change of the evaluation result, the stop record and the last
always written and the summary's best training return taken from every record."""

from __future__ import annotations

import itertools
import random

import pytest
from e2e_support import finish, read_json, start
from test_monitor import event_scalars

from api.config import check, make_experiment
from api.errors import ConfigError
from system.run.report import read_metrics
from system.run.thinning import Thinning

DAY = 86400


def written(thinning: Thinning, records: list[dict]) -> list[dict]:
    return [r for r in records if thinning.keep(r)]


def test_the_default_keeps_an_hour_whole_then_one_in_10_s_then_one_a_minute():
    steps = make_experiment("cartpole-ppo").metrics.thin
    jitter = random.Random(0)
    records = [{"wall_s": t + jitter.uniform(0, 0.05)} for t in range(2 * DAY)]
    kept = [r["wall_s"] for r in written(Thinning(steps), records)]
    assert len(kept) == 3600 + (DAY - 3600) // 10 + DAY // 60  # 13,320 of 172,800
    assert len([t for t in kept if t < 3600]) == 3600
    gaps = [b - a for a, b in itertools.pairwise(kept)]
    assert max(gaps[3600 : 3600 + 8000]) < 10.1 and min(gaps[3600:8000]) > 9.9
    assert min(gaps[-1000:]) > 59.9


def test_each_change_of_the_evaluation_result_is_written_and_the_best_return_seen():
    thinning = Thinning([[0, 60]])
    records = [
        {"wall_s": float(t), "eval_return": t // 25 * 10.0 or None, "episode_return": r}
        for t, r in enumerate([1.0, 5.0, 3.0, 9.5, 2.0] * 20)
    ]
    kept = written(thinning, records)
    assert [r["wall_s"] for r in kept] == [0, 25, 50, 60, 75]  # 60: the next minute
    assert {r["eval_return"] for r in kept} == {None, 10.0, 20.0, 30.0}
    assert thinning.best_return == 9.5 and max(r["episode_return"] for r in kept) < 9.5


def test_no_steps_writes_every_record():
    thinning = Thinning([])
    assert all(thinning.keep({"wall_s": t / 3}) for t in range(100))


@pytest.mark.parametrize(
    ("thin", "error"),
    [
        ("[[3600]]", "metrics.thin: [after_s, every_s] pairs of numbers"),
        ("[[100, 5], [50, 1]]", "the after_s of each step must be above the previous one's"),
        ("[[10, 0]]", "metrics.thin[0]: after_s must be 0 or more and every_s more than 0"),
        ("10", "metrics.thin: expected a list, got 10"),
    ],
)
def test_a_bad_schedule_is_refused_before_the_run(thin, error):
    with pytest.raises(ConfigError, match=error.replace("[", r"\[")):
        make_experiment("cartpole-ppo", [f"metrics.thin={thin}"])


def test_a_schedule_of_tuples_made_in_python_is_checked_too():
    config = make_experiment("cartpole-ppo")
    config.metrics.thin = [(10.0,)]
    with pytest.raises(ConfigError, match=r"metrics\.thin: \[after_s, every_s\] pairs"):
        check(config)
    config.metrics.thin = [(10.0, 5.0)]
    assert check(config) is config


@pytest.mark.multiprocess
def test_a_run_writes_one_record_in_its_spacing_to_its_file_and_tensorboard(tmp_path):
    """A real run told to thin from its start: its file and its event file hold the same few
    records, the last one is there, and the summary's best return is of every record."""
    run_dir = tmp_path / "run"
    out = finish(start([
        "run", "cartpole-ppo", "--run-dir", str(run_dir), "--no-display",
        "stop.eval_return=None", "evaluation.workers=0", "stop.wall_seconds=16",
        "stop.env_frames=None", "metrics.thin=[[0, 5]]",  # frames: 509,094 in 15.6 s here
    ]))  # fmt: skip
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "wall_seconds", out
    records = read_metrics(run_dir)
    walls = [r["wall_s"] for r in records]
    # one per 5 s slot, plus the stop record and the last (the stop rule holds at 16 s)
    assert 3 <= len(records) <= 16 // 5 + 3, walls
    slots = [int(w // 5) for w in walls[:-2]]
    assert slots == sorted(set(slots)), walls
    assert summary["num_records"] == len(records)
    assert summary["env_frames"] == records[-1]["env_frames"]
    assert read_json(run_dir / "latest.json") == records[-1]  # the last second, written or not
    # stage times from an actor's first report on (on a loaded machine its first may come after
    # the second record), in every record: a role silent in a record's interval keeps its last
    timed = [i for i, r in enumerate(records) if "timing/actor/busy" in r]
    assert timed and timed == list(range(timed[0], len(records))), (walls, timed)
    assert summary["best_episode_return"] >= max(r["episode_return"] or 0 for r in records)
    assert [step for step, _ in event_scalars(run_dir)["env_frames"]] == [
        r["env_frames"] for r in records
    ]
