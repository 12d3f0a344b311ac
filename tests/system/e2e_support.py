"""Helpers for end-to-end tests that run the real ``troupe`` command in its own process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from system.run.report import read_metrics

TROUPE = [sys.executable, "-m", "distributed.cli"]
ROOT = Path(__file__).resolve().parents[2]


def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [*TROUPE, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal would give it
    )


def finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"troupe did not finish in {timeout}s:\n{out[-3000:]}")
    return out


def run_failing_file(tmp_path: Path, name: str, text: str) -> tuple[str, dict, dict]:
    """``troupe run`` of an experiment file ``text`` (saved as ``name``) that must fail with
    exit code 1: its stderr, its summary and its workers.json."""
    experiment, run_dir = tmp_path / name, tmp_path / "run"
    experiment.write_text(text)
    result = subprocess.run(
        [*TROUPE, "run", str(experiment), "--run-dir", str(run_dir), "--no-display"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stderr, read_json(run_dir / "summary.json"), read_json(run_dir / "workers.json")


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def frames(run_dir: Path) -> int:
    records = read_metrics(run_dir)  # tolerates the line being written right now
    return int(records[-1].get("env_frames") or 0) if records else 0


def wait_for(condition, proc: subprocess.Popen, timeout: float = 120, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if proc.poll() is not None:
            pytest.fail(f"troupe exited ({proc.returncode}) before {what}:\n{proc.stdout.read()}")
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail(f"timed out waiting for {what}")


def group_alive(pgid: int) -> list[str]:
    out = subprocess.run(["ps", "-o", "pid=,pgid=,stat=", "-e"], capture_output=True, text=True)
    return [
        line
        for line in out.stdout.splitlines()
        if line.split()[1] == str(pgid) and not line.split()[2].startswith("Z")
    ]


def assert_stage_timings(run_dir: Path, stages: dict[str, set[str]]) -> None:
    """Every role in ``stages`` reported where its wall time went: in every record its stage
    shares (the ``control`` stage of the worker loop included) add up to the whole, and over
    the run the stages it named include ``stages[role]``. One record covers one window, and a
    window at the end of a run may hold only waiting (the trainer's loader once had no
    segment to receive in the last one), so the stages are gathered over all records."""
    records = [r for r in read_metrics(run_dir) if any(k.startswith("timing/") for k in r)]
    assert records, "no record has timing/ figures"
    for role, expected in stages.items():
        prefix = f"timing/{role}/"
        mine = [r for r in records if f"{prefix}busy" in r]
        assert mine, f"no timings of role {role}"
        seen: set[str] = set()
        for record in mine:
            shares = {
                k[len(prefix) :]: v
                for k, v in record.items()
                if k.startswith(prefix) and k != f"{prefix}busy" and "batch_rows" not in k
            }
            # Entered, though perhaps too briefly to show at four decimals (the trainer's own
            # copy of a batch its loader thread already staged reads 0.0 on a busy machine)
            seen |= set(shares)
            assert abs(sum(shares.values()) - 1.0) < 0.01, (role, shares)
            waits = sum(v for k, v in shares.items() if k.startswith("wait_"))
            assert abs(record[f"{prefix}busy"] - (1.0 - waits)) < 0.01, (role, record)
        assert expected <= seen, (role, sorted(seen))
