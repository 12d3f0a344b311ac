"""Issue 10, item 6: a run folder that cannot be written (read-only), before and during a run.

``RunFolderError`` names the file, the cause and what to do in one line. Here the real ``troupe``
command meets a read-only tmpfs: as the place for a new run folder, as the folder itself, as a
folder to resume, and mounted over the run folder while the run goes (every file the run opens
from then on is on the read-only mount). Tests run as root, which ``chmod`` does not stop; a
read-only mount does. Needs root (mount); skipped with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from lifecycle_support import (
    ROOT,
    SMALL,
    TROUPE,
    end_run,
    finish,
    frames,
    group,
    mount_tmpfs,
    start,
    wait_for,
)

from api.config import make_experiment

pytestmark = pytest.mark.faults

CAUSE = "Read-only file system"
ADVICE = "make the run folder writable"
ENV = {"COLUMNS": "400"}  # one line per message, however long
WENT = ("removed", "emptied")


def mount(target: Path, *options: str) -> None:
    """A small tmpfs at ``target`` (``ro``, ``remount``: as ``mount -o`` takes them)."""
    mount_tmpfs(target, "size=8m", *options)


@pytest.fixture
def mounts():
    """Mount points to unmount after the test, whatever happened."""
    points: list[Path] = []
    yield points
    for point in reversed(points):
        subprocess.run(["umount", "-l", str(point)], check=False, timeout=30)


@pytest.fixture
def read_only(tmp_path, mounts) -> Path:
    point = tmp_path / "ro"
    point.mkdir()
    mount(point, "ro")
    mounts.append(point)
    return point


def troupe(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **ENV}
    return subprocess.run([*TROUPE, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=env)  # fmt: skip


def assert_one_line(result: subprocess.CompletedProcess, folder: Path) -> None:
    """Exit 1, no traceback, and one ``error:`` line naming the folder, the cause and the fix."""
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: cannot write {folder}: {CAUSE}; {ADVICE}, or pick another one "
                      "with --run-dir"], result.stderr  # fmt: skip


@pytest.mark.parametrize("inside", [True, False], ids=["new-folder-inside", "the-mount-itself"])
def test_a_new_run_in_a_read_only_place_fails_with_one_line(read_only, inside):
    folder = read_only / "run" if inside else read_only
    result = troupe("run", "cartpole-ppo", "--run-dir", str(folder), "--no-display")
    assert_one_line(result, folder)


def test_resuming_a_read_only_run_folder_fails_with_one_line(tmp_path, mounts):
    folder = tmp_path / "run"
    folder.mkdir()
    mount(folder)
    mounts.append(folder)
    config = make_experiment("cartpole-ppo", ["evaluation.workers=0", "stop.eval_return=None"])
    (folder / "config.json").write_text(json.dumps(config.to_dict()))
    mount(folder, "remount", "ro")
    result = troupe("run", "--resume", str(folder), "--no-display")
    assert_one_line(result, folder)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]


def test_a_run_folder_turning_read_only_mid_run_fails_with_one_line(tmp_path, mounts):
    """A read-only tmpfs mounted over the run folder mid-run: the files the run keeps open go
    on, every write that opens a file (workers.json, checkpoints, summary.json) fails."""
    folder = tmp_path / "run"
    args = ["run", "cartpole-ppo", *SMALL, "stop.env_frames=1000000000", "--run-dir", str(folder)]
    proc = start([*args, "--no-display"], env=ENV)
    try:
        wait_for(lambda: frames(folder) > 2000, proc, 300, "2000 frames")
        mount(folder, "ro")
        mounts.append(folder)
        out = finish(proc)
    finally:
        end_run(proc)
    assert proc.returncode != 0, out[-3000:]
    assert "Traceback" not in out, out[-5000:]
    cause = [line for line in out.splitlines() if CAUSE in line and ADVICE in line]
    assert cause, out[-3000:]
    assert "no summary.json" in out, out[-3000:]  # it could not be written: not claimed
    assert not group(proc.pid), "processes outlived the run"


def empty(folder: Path) -> None:
    """`rm -rf run/*`: the folder's files go, the folder stays."""
    for path in folder.iterdir():
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


@pytest.mark.parametrize("remove", [shutil.rmtree, empty], ids=["rm-rf", "emptied"])
def test_a_run_folder_removed_mid_run_fails_the_run(tmp_path, remove):
    """`rm -rf` of a running run's folder: before, metrics.jsonl went on into its unlinked file,
    the next checkpoint made a new folder of the same name, the controller wrote its summary
    there, and the run exited 0 as solved with no config, metrics or logs left. A folder
    emptied but left (`rm -rf run/*`, or an `rm -rf` that met a checkpoint being written) ran
    on for ever, its record going into the unlinked file."""
    folder = tmp_path / "run"
    args = ["run", "cartpole-ppo", *SMALL, "stop.env_frames=1000000000", "--run-dir", str(folder)]
    proc = start([*args, "--no-display"], env=ENV)
    try:
        wait_for(lambda: frames(folder) > 2000, proc, 300, "2000 frames")
        with contextlib.suppress(OSError):  # files being written may come and go
            remove(folder)
        out = finish(proc)
    finally:
        end_run(proc)
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback" not in out, out[-5000:]
    # `rm -rf` beside a worker writing a checkpoint may leave the folder, emptied
    said = [f"the run folder {folder} was {how} while the run went on" for how in WENT]
    assert any(s in out for s in said), out[-3000:]
    assert not (folder / "summary.json").exists()  # nothing claims a whole run
    assert not group(proc.pid), "processes outlived the run"
