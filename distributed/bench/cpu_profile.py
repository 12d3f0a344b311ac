"""The ``profile`` suite of ``troupe bench``: where a run's CPU goes, per role, per frame.

Each worker's CPU time (``/proc/<pid>/stat``: user + system) over a steady-state window of a
``troupe run``, divided by the frames stepped in the same window. On a saturated machine the sum
is the CPU a frame costs, so it says which role to make cheaper, and by how much, for a target
frame rate.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from distributed.bench.runs import troupe_command
from system import run_folder
from system.run.report import read_metrics

CONFIGS = {
    "cartpole-ppo": ("cartpole-ppo", []),
    "synthetic-ppo at 1 ms/step": ("synthetic-ppo", ["environment.args.step_cost_us=1000"]),
}
"""What is profiled: label -> (experiment, overrides)."""


def profile(size, workdir: Path, context: dict) -> tuple[dict, list]:
    from distributed.bench.rows import Row

    figures: dict[str, Any] = {}
    rows = []
    warmup, window = size.warmup_s, max(size.run_s - size.warmup_s - 6.0, 3.0)
    for label, (experiment, overrides) in CONFIGS.items():
        run_dir = workdir / f"profile-{len(figures)}"
        result = profile_run(run_dir, experiment, overrides, warmup, window)
        figures[label] = result
        parts = ", ".join(f"{role} {us:.0f}" for role, us in result["us_per_frame"].items())
        rows.append(
            Row(
                "profile",
                f"{label}: CPU us a frame by worker ({result['fps']:,.0f} "
                f"frames/s, {result['cpu_percent']:.0f}% CPU)",
                parts,
            )
        )
    return figures, rows


def profile_run(
    run_dir: Path, experiment: str, overrides: list[str], warmup_s: float, window_s: float
) -> dict:
    """Run ``experiment``, wait ``warmup_s`` after the first frames, measure for ``window_s``."""
    command = [
        *troupe_command(),
        "run",
        experiment,
        "stop.eval_return=None",
        "stop.env_frames=1000000000",
        f"stop.wall_seconds={warmup_s + window_s + 15}",
        "--run-dir",
        str(run_dir),
        "--no-display",
        *overrides,
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        _wait(lambda: _frames(run_dir) > 0, 60.0)
        time.sleep(warmup_s)
        pids = {
            w: v["pid"] for w, v in json.loads((run_dir / run_folder.WORKERS).read_text()).items()
        }
        cpu0, frames0, t0 = _cpu(pids), _frames(run_dir), time.monotonic()
        time.sleep(window_s)
        cpu1, frames1, t1 = _cpu(pids), _frames(run_dir), time.monotonic()
    finally:
        process.wait(timeout=120)
    frames = max(frames1 - frames0, 1)
    used = {w: cpu1[w] - cpu0[w] for w in pids if w in cpu0 and w in cpu1}
    return {
        "fps": frames / (t1 - t0),
        "cpu_percent": 100.0 * sum(used.values()) / (t1 - t0),
        "us_per_frame": {w: 1e6 * s / frames for w, s in used.items()},
        "total_us_per_frame": 1e6 * sum(used.values()) / frames,
    }


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for worker, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[worker] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _frames(run_dir: Path) -> int:
    records = read_metrics(run_dir)  # tolerates the line being written right now
    return int(records[-1].get("env_frames") or 0) if records else 0


def _wait(condition, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no frames within {timeout_s:.0f}s")
        time.sleep(0.1)
