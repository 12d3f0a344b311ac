"""``troupe bench``: the pieces that turn measurements into figures, and the command end to end.

No test here asserts a wall-clock figure: benchmarks are not timed tests. The end-to-end test runs
``--quick`` only to prove the command works and writes every expected key.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest
from rich.console import Console

from api.errors import UserError
from distributed.bench.command import (
    EXTRA_SUITE_NAMES,
    SUITE_NAMES,
    add_bench_arguments,
    layout_overrides,
    machine_info,
    markdown_table,
    run_bench,
)
from distributed.bench.runs import _MetricsTail, role_utilisation, steady_fps, window_timing
from distributed.bench.suites import SUITES, Row


def _records(*pairs: tuple[float, int]) -> list[dict]:
    return [{"wall_s": w, "env_frames": f} for w, f in pairs]


def test_steady_fps_leaves_out_start_up_warmup_and_the_record_written_after_stopping():
    records = _records(
        (1, 0), (2, 0), (3, 100), (4, 400), (5, 1400), (6, 2400), (7, 3400), (9, 3400)
    )
    figure = steady_fps(records, warmup_s=2.0)
    # frames began at 3 s; the window opens at 5 s and closes at 7 s (9 s is after the stop)
    assert figure == {"fps": 1000.0, "window_s": 2.0, "frames": 2000, "window_start_s": 5.0}


def test_steady_fps_without_two_records_of_frames_has_no_figure():
    assert steady_fps(_records((1, 0), (2, 50), (3, 50)), warmup_s=1.0)["fps"] is None


def test_metrics_tail_reads_complete_lines_only(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = _MetricsTail(path)
    assert tail.read_new() == []
    path.write_text('{"wall_s": 1}\n{"wall_s"')
    assert tail.read_new() == [{"wall_s": 1}]
    with path.open("a") as f:
        f.write(": 2}\n")
    assert tail.read_new() == [{"wall_s": 2}]
    assert tail.records == [{"wall_s": 1}, {"wall_s": 2}]


def test_markdown_table_names_the_machine_and_each_verdict():
    rows = [
        Row("latency", "p50", "0.50 ms", "<= 1 ms", True),
        Row("push", "p50", "80 ms", "<= 50 ms", False),
        Row("memory", "a | b", "12"),
    ]
    table = markdown_table(rows, machine_info())
    lines = table.splitlines()
    assert lines[0].startswith(f"Machine: {len(os.sched_getaffinity(0))} cores, ")
    assert lines[2:] == [
        "| suite | figure | measured | target | met |",
        "|---|---|---|---|---|",
        "| latency | p50 | 0.50 ms | <= 1 ms | met |",
        "| push | p50 | 80 ms | <= 50 ms | not met |",
        "| memory | a / b | 12 |  |  |",
    ]


def test_window_timing_averages_each_roles_shares_and_names_its_largest_wait():
    records = [
        {"wall_s": 1.0, "timing/actor/env_step": 0.4, "timing/actor/wait_actions": 0.6,
         "timing/actor/busy": 0.4, "timing/trainer/compute": 1.0, "timing/trainer/busy": 1.0},
        {"wall_s": 2.0, "timing/actor/env_step": 0.6, "timing/actor/wait_actions": 0.4,
         "timing/actor/busy": 0.6, "timing/policy/batch_rows_mean": 8.0, "env_frames": 10},
    ]  # fmt: skip
    timing = window_timing(records)
    assert timing["actor"] == pytest.approx({"env_step": 0.5, "wait_actions": 0.5, "busy": 0.5})
    assert timing["policy"] == {"batch_rows_mean": 8.0}
    assert role_utilisation(timing) == "actor 50% (wait_actions 50%), trainer 100%"
    assert role_utilisation({}) == "-"


def test_the_pixels_layout_flags_become_overrides_of_its_run():
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    layout = ["--actors", "auto", "--envs", "16", "--device", "cuda", "--precision", "bfloat16"]
    args = parser.parse_args(["pixels", *layout])
    assert layout_overrides(args) == [
        "actors.workers=auto",
        "actors.envs_per_worker=16",
        "policies.default.policy.args.device=cuda",
        "policies.default.policy.args.cuda_graphs=True",
        "policies.default.trainer.args.precision=bfloat16",
    ]
    eager = layout_overrides(parser.parse_args(["pixels", "--device", "cuda", "--eager"]))
    assert eager[-1] == "policies.default.policy.args.cuda_graphs=False"
    assert layout_overrides(parser.parse_args(["pixels", "--device", "cpu"])) == [
        "policies.default.policy.args.device=cpu"
    ]
    assert layout_overrides(parser.parse_args(["pixels"])) == []
    graphs = parser.parse_args(["pixels", "--device", "cuda", "--trainer-graphs"])
    assert layout_overrides(graphs)[-1] == "policies.default.trainer.args.cuda_graphs=True"
    with pytest.raises(UserError, match="--envs must be at least 1, got 0"):
        layout_overrides(parser.parse_args(["pixels", "--envs", "0"]))
    with pytest.raises(SystemExit):  # argparse names the two choices
        parser.parse_args(["pixels", "--precision", "fp16"])


def test_the_suite_names_the_parser_shows_are_the_suites_that_run():
    assert tuple(SUITES) == SUITE_NAMES + EXTRA_SUITE_NAMES


def test_unknown_suite_is_a_user_error_naming_the_choices():
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    args = parser.parse_args(["latnecy"])
    with pytest.raises(UserError) as info:
        run_bench(args, Console())
    assert str(info.value) == (f"unknown suite(s) latnecy; choose from {', '.join(SUITES)}")


@pytest.mark.multiprocess
def test_quick_bench_runs_and_writes_every_figure(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "distributed.cli", "bench", "--quick", "--json", str(out),
         "throughput", "latency", "push", "memory"],
        capture_output=True, text=True, timeout=400, cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| suite | figure | measured | target | met |" not in done.stdout  # rendered by rich
    result = json.loads(out.read_text())
    assert result["errors"] == {}
    assert result["quick"] is True
    for key in ("cores", "cpu_model", "python", "torch", "numpy", "pyzmq", "date"):
        assert result["machine"][key]
    assert set(result["suites"]) == {"throughput", "latency", "push", "memory"}
    throughput = result["suites"]["throughput"]
    assert set(throughput["raw_steps_per_s"]) == {"gymnasium", "api", "synthetic"}
    for run in ("cartpole-ppo", "synthetic-ppo"):
        assert throughput[run]["fps"] > 0 and throughput[run]["exit_code"] == 0
    synthetic, cores = throughput["synthetic-ppo"], result["machine"]["cores"]
    assert synthetic["ceiling_fps"] == cores * throughput["raw_steps_per_s"]["synthetic"]
    assert synthetic["nominal_ceiling_fps"] == 1000.0 * cores
    latency = result["suites"]["latency"]
    assert set(latency["batches"]) == {"1", "16", "64"}
    assert all(b["p50_ms"] > 0 and b["p99_ms"] > 0 for b in latency["batches"].values())
    assert latency["concurrent"]["mean_rows_per_batch"] >= 8
    push = result["suites"]["push"]
    assert set(push["sizes"]) == {"1000000", "10000000"}
    assert all(s["max_ms"] >= s["p50_ms"] > 0 for s in push["sizes"].values())
    roles = result["suites"]["memory"]["cartpole-ppo"]["peak_rss_mb_by_role"]
    assert {"actor", "policy", "trainer", "parameter_service", "controller"} <= set(roles)
    assert "| suite | figure | measured | target | met |" in result["table_markdown"]


def test_the_learning_suite_reports_solved_seeds_with_their_spread():
    from distributed.bench.learning import TASKS, _summary

    seeds = [
        {"solved": True, "frames_to_target": 1000, "wall_s_to_target": 2.0},
        {"solved": False, "frames_to_target": None, "wall_s_to_target": None},
        {"solved": True, "frames_to_target": 3000, "wall_s_to_target": 4.0},
        {"solved": True, "frames_to_target": 2000, "wall_s_to_target": 3.0},
    ]
    assert _summary(seeds) == "3 of 4 solved; frames 1,000 / 2,000 / 3,000; wall 2.0 / 3.0 / 4.0 s"
    assert _summary(seeds[:1]) == "1 of 1 solved; frames 1,000; wall 2.0 s"
    assert _summary(seeds[1:2]) == "0 of 1 solved"
    from api import registry

    assert all(t.experiment in registry.experiments for t in TASKS)  # every task is runnable


def test_memory_is_what_the_workers_reported_or_what_the_bench_read_and_never_a_made_up_0():
    """A `--quick` memory run ended before its workers reported: each was shown as 0 MiB. The
    bench's own reading of their processes stands in; a role neither saw is n/a (None)."""
    from distributed.bench.runs import RunResult, peak_rss_by_role

    run = RunResult("cartpole-ppo", [], "r", 0, 10.0, 2.0, None, False)
    run.workers = {
        "actor/0": {"role": "actor", "pid": 11, "peak_rss_mb": 0.0},  # never reported
        "trainer/default/0": {"role": "trainer", "pid": 12, "peak_rss_mb": 310.0},
        "policy/default/0": {"role": "policy", "peak_rss_mb": None},  # never came up
    }
    run.session_labels = {10: "controller", 11: "actor", 12: "trainer", 13: "other"}
    run.session_peak_rss_mb = {10: 120.0, 11: 95.5, 12: 300.0, 13: 999.0}
    assert peak_rss_by_role(run) == {
        "actor": 95.5, "trainer": 310.0, "policy": None, "controller": 120.0,
    }  # fmt: skip
