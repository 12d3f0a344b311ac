"""A console whose reader is gone goes quiet; the run it reports on goes on (system.console)."""

from __future__ import annotations

import os
import subprocess

import pytest
from e2e_support import ROOT, TROUPE, read_json

from system.console import Console
from system.run.display import LiveDisplay, Snapshot


def test_a_closed_pipe_makes_the_console_quiet_instead_of_exiting(tmp_path, caplog):
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line
    with os.fdopen(write_end, "w") as stream:
        console = Console(file=stream, gone_note="the run goes on")
        display = LiveDisplay("x", enabled=False, console=console)
        display.update(Snapshot())  # rich's own console raises SystemExit(1) here
        display.stop()
        assert display.console.quiet
    assert "reader is gone" in caplog.text


def test_a_command_that_only_prints_stops_quietly(caplog):
    """``troupe list | head``: no warning, as ``ls | head`` gives none."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with os.fdopen(write_end, "w") as stream:
        console = Console(file=stream)
        console.print("a line")
        assert console.reader_gone and console.quiet
    assert "reader is gone" not in caplog.text


def test_a_run_whose_output_reader_leaves_still_ends_by_its_rule_and_writes_its_summary(tmp_path):
    """``troupe run ... | head -2``: the controller's first progress line used to end the run
    (rich exits on a broken pipe) with exit code 1, no summary and not a word why."""
    run_dir = tmp_path / "run"
    read_end, write_end = os.pipe()
    args = ["run", "cartpole-ppo", "--no-display", "--run-dir", str(run_dir),
            "stop.eval_return=None", "stop.env_frames=100000", "evaluation.workers=0"]  # fmt: skip
    proc = subprocess.Popen(
        [*TROUPE, *args], cwd=ROOT, stdout=write_end, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    os.close(write_end)
    with os.fdopen(read_end) as out:  # as head -2 would: the launcher's two lines, then gone
        first, second = out.readline(), out.readline()
    try:
        _, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("troupe run did not end")
    # whole lines, however long the path: rich wrapped it at 80 columns in a pipe, so under
    # pytest-xdist's longer folders the reader left after "run folder:" alone and troupe run,
    # not the controller, met the closed pipe
    assert first.startswith("run folder:") and second.startswith("stop at:"), (first, second)
    assert proc.returncode == 0, err[-3000:]
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "env_frames" and summary["env_frames"] >= 100000
    # the controller's progress lines met the closed pipe, and it says so in the run's log
    assert "reader is gone" in (run_dir / "logs" / "controller.log").read_text()


def test_troupe_logs_follow_ends_when_its_reader_is_gone(tmp_path, monkeypatch):
    """``troupe logs RUN -f | head``: following a run that goes on for hours must end with the
    reader, not print into the void until the run ends."""
    import argparse
    import itertools

    from distributed.ops import commands

    class Record:
        run = "r"

        def folder(self):
            return tmp_path

    def endless(record, run_dir, args):
        for n in itertools.count():
            assert n < 1000, "still following after its reader left"
            yield "actor/0", f"line {n}"

    monkeypatch.setattr(commands, "resolve", lambda run, runs_dir: Record())
    monkeypatch.setattr(commands, "_folder_lines", endless)
    read_end, write_end = os.pipe()
    os.close(read_end)
    args = argparse.Namespace(run="r", runs_dir=".", source="auto", worker=None, tail=0,
                              follow=True)  # fmt: skip
    with os.fdopen(write_end, "w") as stream:
        assert commands.run_logs(args, Console(file=stream)) == 0
