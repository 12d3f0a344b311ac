"""Run a ``troupe`` command as a user does, for the learning checks: a process group of its own
(killed whole if it outlasts its time) and its output, which a failed check shows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_troupe(arguments: list[str], what: str, timeout_s: float = 900) -> str:
    """``python -m distributed.cli ARGUMENTS`` from the repository root; its output. Fails the
    test, with the output's end, if it has not finished in ``timeout_s``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli", *arguments],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{what} did not finish in {timeout_s:.0f}s:\n{out[-3000:]}")
    return out
