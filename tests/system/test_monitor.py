"""Tests for run observability: metrics, learning curve, summary, live display, stage timer."""

from __future__ import annotations

import json
import logging
import math
import sys
from dataclasses import replace
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

import system.run.monitor as monitor
from system.roles import WorkerState
from system.run.display import PolicyLine, Snapshot, WorkerLine, plain_line, render_panel
from system.run.monitor import (
    LiveDisplay,
    MetricsWriter,
    StageTimer,
    build_summary,
    read_metrics,
    write_learning_curve,
    write_summary,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _worker(id: str, role: str = "actor", state: WorkerState = WorkerState.ALIVE, **kw):
    return WorkerLine(id=id, role=role, state=state, **kw)


SNAPSHOT = Snapshot(
    elapsed_s=12.34,
    env_frames=45_000,
    fps=3650.4,
    episode_return=187.21,
    eval_return=201.0,
    target=475.0,
    policies={
        "default": PolicyLine(
            version=12,
            lag=1.5,
            trainer={"policy_loss": -0.0123, "value_loss": 0.31, "entropy": 0.66},
        )
    },
    workers=(
        *(_worker(f"actor/{i}", heartbeat_age_s=0.2) for i in range(5)),
        _worker("trainer/0", "trainer", heartbeat_age_s=1.0),
    ),
)
SNAPSHOT_LINE = (
    "[  12.3s] frames 45,000 (3,650/s) return 187.2 eval 201.0/475 v12 lag 1.5 workers 6/6"
)


def event_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# --- MetricsWriter / read_metrics ---


def test_writer_writes_json_lines_and_tensorboard_scalars(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path) as writer:
        assert writer.tensorboard_enabled
        writer.write({"env_frames": 1000, "episode_return": 10.5, "policy/default/version": 1})
        writer.write({"env_frames": 2000, "episode_return": 20.0, "note": "eval started"})

    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["env_frames"] for r in records] == [1000, 2000]
    assert records[1]["note"] == "eval started"
    assert all(isinstance(r["wall_s"], float) and r["wall_s"] >= 0 for r in records)

    assert list(tmp_path.glob("events.out.tfevents.*"))
    scalars = event_scalars(tmp_path)
    assert scalars["episode_return"] == [(1000, 10.5), (2000, 20.0)]
    assert scalars["policy/default/version"] == [(1000, 1.0)]
    assert "note" not in scalars


def test_writer_keeps_given_wall_s_and_does_not_mutate_record(tmp_path: Path) -> None:
    record = {"env_frames": 5, "wall_s": 42.0}
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        writer.write(record)
    assert record == {"env_frames": 5, "wall_s": 42.0}
    assert read_metrics(tmp_path) == [{"env_frames": 5, "wall_s": 42.0}]


def test_writer_uses_a_counter_as_step_without_env_frames(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path) as writer:
        for value in (1.0, 2.0, 3.0):
            writer.write({"fps": value})
    assert event_scalars(tmp_path)["fps"] == [(0, 1.0), (1, 2.0), (2, 3.0)]


def test_non_finite_floats_become_null_and_skip_tensorboard(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path) as writer:
        writer.write({"env_frames": 10, "trainer/default/policy_loss": math.nan, "fps": math.inf})
        writer.write({"env_frames": 20, "trainer/default/policy_loss": 0.5, "fps": -math.inf})

    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    first, second = read_metrics(tmp_path)
    assert first["trainer/default/policy_loss"] is None and first["fps"] is None
    assert second["fps"] is None
    scalars = event_scalars(tmp_path)
    assert scalars["trainer/default/policy_loss"] == [(20, 0.5)]
    assert "fps" not in scalars


def test_writer_accepts_numpy_values(tmp_path: Path) -> None:
    import numpy as np

    with MetricsWriter(tmp_path) as writer:
        writer.write({"env_frames": np.int64(7), "fps": np.float32(2.5), "lag": np.float64("nan")})
    assert read_metrics(tmp_path)[0] | {"wall_s": 0} == {
        "env_frames": 7,
        "fps": 2.5,
        "lag": None,
        "wall_s": 0,
    }
    assert event_scalars(tmp_path)["fps"] == [(7, 2.5)]


def test_metrics_are_readable_before_close(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path, tensorboard=False)
    try:
        writer.write({"env_frames": 1, "episode_return": 3.0})
        assert read_metrics(tmp_path)[0]["episode_return"] == 3.0
    finally:
        writer.close()


def test_close_is_idempotent_and_write_after_close_fails(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path)
    writer.close()
    writer.close()
    with pytest.raises(ValueError, match=r"^MetricsWriter for .* is closed; cannot write$"):
        writer.write({"env_frames": 1})


def test_tensorboard_false_writes_no_event_file(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        assert not writer.tensorboard_enabled
        writer.write({"env_frames": 1})
    assert not list(tmp_path.glob("events.out.tfevents.*"))


def test_missing_tensorboard_warns_once_and_keeps_jsonl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # importing the event writer raises ImportError
    monkeypatch.setitem(sys.modules, "tensorboard.summary.writer.event_file_writer", None)
    monkeypatch.setattr(monitor, "_tb_unavailable_warned", False)
    with caplog.at_level(logging.WARNING, logger="system.run.monitor"):
        for name in ("a", "b"):
            with MetricsWriter(tmp_path / name) as writer:
                assert not writer.tensorboard_enabled
                writer.write({"env_frames": 1, "fps": 2.0, "wall_s": 0.5})
    warnings = [r for r in caplog.records if "TensorBoard logging is off" in r.getMessage()]
    assert len(warnings) == 1
    assert read_metrics(tmp_path / "b") == [{"env_frames": 1, "fps": 2.0, "wall_s": 0.5}]
    assert not list(tmp_path.glob("*/events.out.tfevents.*"))


def test_read_metrics_tolerates_truncated_last_line(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"env_frames": 1}\n{"env_frames": 2}\n{"env_fr')
    assert read_metrics(tmp_path) == [{"env_frames": 1}, {"env_frames": 2}]


def test_read_metrics_of_missing_file_is_empty(tmp_path: Path) -> None:
    assert read_metrics(tmp_path) == []


def test_resumed_writer_starts_after_a_truncated_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"env_frames": 1}\n{"env_fr')
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        writer.write({"env_frames": 2, "wall_s": 0.0})
    with caplog.at_level(logging.WARNING, logger="system.run.report"):
        records = read_metrics(tmp_path)
    assert records == [{"env_frames": 1}, {"env_frames": 2, "wall_s": 0.0}]
    assert "metrics.jsonl:2 is not a JSON object; skipping that line" in caplog.text


# --- learning curve ---


def write_lines(run_dir: Path, records: list[dict]) -> None:
    with (run_dir / "metrics.jsonl").open("w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 5_000


def test_learning_curve_with_full_metrics(tmp_path: Path) -> None:
    records = [
        {"env_frames": i * 1000, "wall_s": i * 0.5, "episode_return": float(i)}
        for i in range(1, 30)
    ]
    for record in records[::5]:
        record["eval_return"] = record["episode_return"] + 2
    write_lines(tmp_path, records)
    path = write_learning_curve(tmp_path, title="CartPole ppo", target=20.0)
    assert path == tmp_path / "learning_curve.png"
    assert_png(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["learning_curve.png", "metrics.jsonl"]


def test_learning_curve_with_missing_keys(tmp_path: Path) -> None:
    write_lines(
        tmp_path,
        [
            {"episode_return": 1.0},  # no x at all
            {"env_frames": 100, "episode_return": None},
            {"wall_s": 2.0, "episode_return": 3.0},  # no env_frames
            {"env_frames": 300, "fps": 10.0},
        ],
    )
    assert_png(write_learning_curve(tmp_path))


@pytest.mark.parametrize("content", ["", '{"fps": 1.0}\n{"env_fr'])
def test_learning_curve_without_returns_says_no_data(tmp_path: Path, content: str) -> None:
    (tmp_path / "metrics.jsonl").write_text(content)
    assert_png(write_learning_curve(tmp_path, title="empty"))


def test_learning_curve_without_metrics_file(tmp_path: Path) -> None:
    assert_png(write_learning_curve(tmp_path))


# --- summary ---


def synthetic_records() -> list[dict]:
    return [
        {"env_frames": 1000, "wall_s": 1.0, "episode_return": 10.0, "policy/default/version": 1},
        {"env_frames": 2000, "wall_s": 2.0, "episode_return": 30.0, "eval_return": 50.0},
        {
            "env_frames": 3000,
            "wall_s": 3.0,
            "episode_return": 25.0,
            "eval_return": 120.0,
            "policy/default/version": 4,
            "policy/opponent/version": 2,
            "trainer/default/steps": 7,
            "trainer/opponent/steps": 3,
        },
        {"env_frames": 4000, "wall_s": 4.0, "episode_return": None, "eval_return": 90.0},
    ]


def test_build_summary_derives_fields() -> None:
    summary = build_summary(
        synthetic_records(),
        solved=True,
        wall_s=8.0,
        target=100.0,
        stop_reason="target reached",
        solved_at=(3900, 3.9),
    )
    assert summary == {
        "solved": True,
        "stop_reason": "target reached",
        "wall_s": 8.0,
        "env_frames": 4000,
        "fps": 500.0,
        "target": 100.0,
        "best_eval_return": 120.0,
        "final_eval_return": 90.0,
        "best_episode_return": 30.0,
        "final_episode_return": 25.0,
        # when the stopping rule held, not the first (perhaps lucky) window at the target
        "frames_to_target": 3900,
        "wall_s_to_target": 3.9,
        "first_eval_at_target": {"env_frames": 3000, "wall_s": 3.0},
        "policy_versions": {"default": 4, "opponent": 2},
        "trainer_steps": 10,
        "num_records": 4,
    }


def test_an_atari_run_s_summary_and_curve_say_emulator_frames(tmp_path: Path) -> None:
    from system.run.report import _frames_label

    records = [{"env_frames": 1000 * i, "emulator_frames": 4000 * i, "wall_s": float(i),
                "episode_return": -21.0 + i} for i in range(1, 6)]  # fmt: skip
    summary = build_summary(records, solved=False, wall_s=5.0, target=None, stop_reason="x")
    assert (summary["env_frames"], summary["emulator_frames"]) == (5000, 20000)
    assert "emulator_frames" not in build_summary(synthetic_records(), solved=False, wall_s=1.0,
                                                  target=None, stop_reason="x")  # fmt: skip
    assert _frames_label(records) == "agent steps (env_frames; 4 emulator frames each)"
    assert _frames_label(synthetic_records()) == "environment frames"
    write_lines(tmp_path, records)
    assert_png(write_learning_curve(tmp_path, title="pong"))


def test_build_summary_prefers_logged_trainer_steps() -> None:
    records = [*synthetic_records(), {"trainer_steps": 99}]
    summary = build_summary(records, solved=False, wall_s=1.0, target=None, stop_reason="x")
    assert summary["trainer_steps"] == 99
    assert summary["frames_to_target"] is None and summary["first_eval_at_target"] is None


def test_build_summary_of_no_records() -> None:
    summary = build_summary([], solved=False, wall_s=0.0, target=None, stop_reason="interrupted")
    assert summary["env_frames"] is None
    assert summary["fps"] is None
    assert summary["best_eval_return"] is None
    assert summary["final_eval_return"] is None
    assert summary["best_episode_return"] is None
    assert summary["policy_versions"] == {}
    assert summary["trainer_steps"] is None


def test_the_summary_and_plots_read_a_long_runs_metrics_a_few_keys_at_a_time(
    tmp_path: Path,
) -> None:
    """A record a second for two days was 418 MB of metrics.jsonl, read whole three times at
    the end of a run (2 GB held in the controller, 34 s) and twice more at a resume. The end
    now reads it once, line by line, keeping only the keys the summary and the plots use; what
    they make of them is the same."""
    from system.run.report import matchup_keys, summarised

    noise = {"trainer/default/loss": 0.1, "timing/actor/busy": 0.5, "custom/x": 1.0, "fps": 9.0}
    matches = {"result/default_vs_opponent": 0.75, "eval/result/opponent_vs_default": 0.5}
    records = [{**r, **noise, **matches} for r in synthetic_records()]
    write_lines(tmp_path, records)
    kept = read_metrics(tmp_path, summarised)
    assert len(kept) == len(records) and all(not noise.keys() & r.keys() for r in kept)
    args = dict(solved=True, wall_s=8.0, target=100.0, stop_reason="x", solved_at=(3900, 3.9))
    assert build_summary(kept, **args) == build_summary(read_metrics(tmp_path), **args)
    assert (
        matchup_keys(kept)
        == matchup_keys(records)
        == [
            "eval/result/opponent_vs_default",
            "result/default_vs_opponent",
        ]
    )
    assert_png(write_learning_curve(tmp_path, target=100.0, records=kept))


def test_the_last_record_is_read_from_the_files_end(tmp_path: Path) -> None:
    """What a resume counts on from (read from the file's end): the last whole record, not a
    torn line after it (a crash)."""
    from system.run.metrics_file import last_metrics

    assert last_metrics(tmp_path) is None
    write_lines(tmp_path, [{"env_frames": i, "pad": "x" * 100} for i in range(1000)])
    assert last_metrics(tmp_path)["env_frames"] == 999
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"env_frames": 10')
    assert last_metrics(tmp_path)["env_frames"] == 999


def test_write_summary_is_pretty_json_and_leaves_no_temp_files(tmp_path: Path) -> None:
    path = write_summary(tmp_path, {"solved": True, "best": math.nan, "nested": {"a": 1}})
    assert path == tmp_path / "summary.json"
    text = path.read_text()
    assert text.startswith("{\n  ")
    assert json.loads(text) == {"solved": True, "best": None, "nested": {"a": 1}}
    write_summary(tmp_path, {"solved": False})
    assert json.loads(path.read_text()) == {"solved": False}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


# --- LiveDisplay ---


def plain_console() -> Console:
    return Console(file=StringIO(), force_terminal=False, width=80)


def test_plain_line_format() -> None:
    assert plain_line(SNAPSHOT) == SNAPSHOT_LINE


def test_emulator_frames_a_second_are_shown_beside_agent_steps() -> None:
    """Atari: the frames counted are agent steps of 4 emulator frames; the rate of those is
    what Atari figures elsewhere count."""
    atari = replace(SNAPSHOT, fps=8625.0, frames_per_step=4)
    assert "frames 45,000 (8,625/s; x4 = 34,500 emulator frames/s) return" in plain_line(atari)
    assert "emulator" not in plain_line(replace(atari, frames_per_step=1))
    console = Console(file=StringIO(), width=120)
    console.print(render_panel("pong-ppo", atari, max_worker_rows=3))
    assert "8,625 (x4: 34,500 emulator)" in console.file.getvalue()


def test_a_huge_return_is_shown_in_four_significant_digits() -> None:
    """A reward of 1e30 a step (a wrong scale) filled the line with a 33-digit number."""
    huge = replace(SNAPSHOT, episode_return=2.244e31, eval_return=-2.29e31)
    assert "return 2.244e+31 eval -2.29e+31/475 " in plain_line(huge)
    console = Console(file=StringIO(), width=120)
    console.print(render_panel("cartpole-ppo", huge, max_worker_rows=3))
    assert "2.244e+31" in console.file.getvalue() and "-2.29e+31 / 475" in console.file.getvalue()
    assert "return 187.2 eval 201.0/475" in plain_line(SNAPSHOT)  # as before below 1e7


def test_non_tty_display_prints_rate_limited_plain_lines() -> None:
    console, clock = plain_console(), FakeClock()
    display = LiveDisplay("cartpole", console=console, clock=clock)
    assert not display.live_enabled
    with display:
        display.update(SNAPSHOT)
        clock.now = 4.9
        display.update(replace(SNAPSHOT, env_frames=50_000))  # within 5 s: not printed
        clock.now = 5.0
        display.update(replace(SNAPSHOT, env_frames=60_000))
    lines = console.file.getvalue().splitlines()
    assert lines == [
        SNAPSHOT_LINE,
        SNAPSHOT_LINE.replace("45,000", "60,000"),
        SNAPSHOT_LINE.replace("45,000", "60,000") + " (final)",
    ]


def test_disabled_display_prints_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    display = LiveDisplay("cartpole", enabled=False)
    display.start()
    display.update(SNAPSHOT)
    display.stop()
    display.stop()
    assert capsys.readouterr().out.splitlines() == [SNAPSHOT_LINE, SNAPSHOT_LINE + " (final)"]


def test_the_final_line_can_come_from_the_run_s_last_record(capsys) -> None:
    """The controller stops the panel before its last record (after the workers' stop): the
    final line said 175,550 frames where the summary said 188,609."""
    display = LiveDisplay("cartpole", enabled=False)
    display.update(SNAPSHOT)
    display.stop(final=False)
    display.final(replace(SNAPSHOT, env_frames=60_000))
    display.final(SNAPSHOT)  # once only
    assert capsys.readouterr().out.splitlines() == [
        SNAPSHOT_LINE,
        SNAPSHOT_LINE.replace("45,000", "60,000") + " (final)",
    ]
    said_already = LiveDisplay("cartpole", enabled=False)
    said_already.update(SNAPSHOT)
    said_already.stop()  # with its final line: a later final() adds none
    said_already.final(SNAPSHOT)
    assert capsys.readouterr().out.splitlines() == [SNAPSHOT_LINE, SNAPSHOT_LINE + " (final)"]
    never_shown = LiveDisplay("cartpole", enabled=False)
    never_shown.final(SNAPSHOT)  # a display never started says nothing at the end either
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    "snapshot",
    [
        Snapshot(),
        Snapshot(elapsed_s=None, fps=math.inf, policies={"p": PolicyLine()}),
        Snapshot(policies={"q": PolicyLine(version=None, lag=math.nan, trainer={"entropy": 1})}),
        Snapshot(env_frames=None, workers=(_worker("a", state=WorkerState.FAILED, restarts=2),)),
    ],
)
def test_display_renders_unknown_figures_as_dashes(snapshot: Snapshot) -> None:
    console = plain_console()
    with LiveDisplay("odd", console=console) as display:
        display.update(snapshot)
    first = console.file.getvalue().splitlines()[0]
    assert first.startswith("[      -] frames -")
    Console(file=StringIO(), width=100).print(render_panel("odd", snapshot))


def test_plain_line_counts_failed_workers_and_restarts() -> None:
    workers = (
        _worker("a", restarts=1),
        _worker("b", state=WorkerState.FAILED, restarts=2),
        _worker("c", state=WorkerState.RESTARTING),
    )
    policies = {"a": PolicyLine(version=3), "b": PolicyLine(version=1)}
    line = plain_line(Snapshot(workers=workers, policies=policies))
    assert line.endswith(" a:v3 b:v1 workers 1/3 restarts 3")
    building = (*workers, _worker("d", state=WorkerState.CONFIGURING))
    line = plain_line(Snapshot(workers=building, policies=policies))
    assert line.endswith(" workers 1/4 (1 building) restarts 3")


def test_the_final_line_says_how_the_workers_ended_not_that_none_is_alive() -> None:
    """After a run every worker has stopped: ``workers 0/9`` read as if none had come up."""
    stopped = tuple(_worker(f"w{i}", state=WorkerState.STOPPED) for i in range(8))
    ended = (*stopped, _worker("w8", state=WorkerState.FAILED))
    assert plain_line(Snapshot(workers=ended)).endswith(" workers 1 failed, 8 stopped")
    console = Console(file=StringIO(), width=120)
    console.print(render_panel("cartpole-ppo", Snapshot(workers=stopped)))
    assert "workers 8 stopped" in console.file.getvalue()
    starting = (*stopped, _worker("w8", state=WorkerState.STARTING))
    assert plain_line(Snapshot(workers=starting)).endswith(" workers 0/9")  # not yet up


def test_panel_shows_policies_losses_and_worker_health() -> None:
    failed = _worker("actor/9", state=WorkerState.FAILED, restarts=3, heartbeat_age_s=31.0)
    snapshot = replace(SNAPSHOT, workers=(*SNAPSHOT.workers, failed))
    console = Console(file=StringIO(), width=120)
    console.print(render_panel("cartpole-ppo", snapshot, max_worker_rows=3))
    out = console.file.getvalue()
    for expected in ("cartpole-ppo", "45,000", "201.0 / 475", "policy_loss", "-0.0123", "entropy"):
        assert expected in out
    assert "approx_kl" not in out  # only stats that are present get a column
    assert "workers 6/7 alive" in out
    assert "actor/9" in out and "31.0s" in out  # trouble is listed first
    assert "... 4 more" in out


def test_the_panel_colours_each_worker_state_the_controller_reports() -> None:
    """The controller sends ``WorkerState`` values: failed workers are red, restarting ones
    yellow, alive ones green; other states (starting, stopped) stay plain."""
    workers = tuple(_worker(f"w{i}", state=state) for i, state in enumerate(WorkerState))
    console = Console(file=StringIO(), force_terminal=True, color_system="standard", width=120)
    console.print(render_panel("cartpole-ppo", Snapshot(workers=workers)))
    out = console.file.getvalue()
    assert "\x1b[1;31mfailed" in out
    assert "\x1b[33mrestarting" in out and "\x1b[32malive" in out
    assert "\x1b[31mkilled" in out  # by a stop at once
    assert f"workers 1/{len(WorkerState)} alive" in out
    plain = {"starting", "configuring", "stopped"}
    assert all(f"m{state}" not in out and state in out for state in plain)


def test_live_mode_on_a_terminal_starts_and_stops() -> None:
    console = Console(file=StringIO(), force_terminal=True, width=120)
    display = LiveDisplay("cartpole", console=console)
    assert display.live_enabled
    with display:
        display.update(SNAPSHOT)
    out = console.file.getvalue()
    assert "cartpole" in out
    assert "(final)" in out


# --- StageTimer ---


def test_stage_timer_nests_and_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(monitor, "_perf_counter", clock)
    timer = StageTimer()
    for _ in range(2):
        with timer.stage("rollout"):
            with timer.stage("inference"):
                clock.now += 3.0
            with timer.stage("env_step"):
                clock.now += 1.0
        with timer.stage("train"):
            clock.now += 4.0
    clock.now += 4.0  # outside every stage
    assert timer.report() == {
        "rollout": 8.0,
        "rollout/inference": 6.0,
        "rollout/env_step": 2.0,
        "train": 8.0,
    }
    assert timer.counts() == {
        "rollout": 2,
        "rollout/inference": 2,
        "rollout/env_step": 2,
        "train": 2,
    }
    lines = timer.format().splitlines()
    assert lines[0].split() == ["wall", "20.000s"]
    assert lines[1].split() == ["rollout", "8.000s", "40.0%", "n=2"]
    assert lines[2].startswith("    inference")
    assert lines[2].split() == ["inference", "6.000s", "75.0%", "n=2"]
    assert lines[3].split() == ["env_step", "2.000s", "25.0%", "n=2"]
    assert lines[4].startswith("  train")


def test_stage_timer_records_time_when_the_stage_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(monitor, "_perf_counter", clock)
    timer = StageTimer()
    with pytest.raises(RuntimeError), timer.stage("outer"), timer.stage("inner"):
        clock.now += 2.0
        raise RuntimeError("boom")
    with timer.stage("after"):
        clock.now += 1.0
    assert timer.report() == {"outer": 2.0, "outer/inner": 2.0, "after": 1.0}


def test_stage_timer_reuses_nodes_and_rejects_bad_names() -> None:
    timer = StageTimer()
    assert timer.stage("a") is timer.stage("a")
    with pytest.raises(ValueError, match="stage name must be non-empty and contain no '/': 'a/b'"):
        timer.stage("a/b")
    timer.reset()
    assert timer.report() == {}
