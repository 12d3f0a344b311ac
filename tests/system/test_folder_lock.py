"""One owner per run folder (system.run.folder_lock), between real processes: a second taker is
refused naming the holder's pid while the first holds the lock (or a child it forked lives), and
takes it once the holder has ended or was killed (the file and its stale pid remain, the lock
does not)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from api.errors import RunFolderError
from system import run_folder
from system.run import folder_lock
from system.run.folder_lock import RunFolderBusyError

HOLD = """
import os, sys
from pathlib import Path
from system.run import folder_lock
folder_lock.acquire(Path(sys.argv[1]))
if sys.argv[2] == "fork" and os.fork() == 0:  # a controller forked from its launcher
    sys.stdin.read()
    os._exit(0)
print("held", flush=True)
if sys.argv[2] == "wait":
    sys.stdin.read()  # until the test closes our stdin
"""


@pytest.fixture
def folder(tmp_path):
    yield tmp_path
    folder_lock.release(tmp_path)


@pytest.fixture
def hold(folder):
    """Start a process that takes ``folder``'s lock (``wait``: and keeps it until its stdin is
    closed; ``fork``: leaves it to a forked child that does so, and exits)."""
    procs: list[subprocess.Popen] = []

    def start(how: str = "wait") -> subprocess.Popen:
        args = [sys.executable, "-c", HOLD, str(folder), how]
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline() == "held\n"
        return proc

    yield start
    for proc in procs:
        with proc:
            proc.kill()


def _take_in_another_process(folder) -> subprocess.CompletedProcess:
    args = [sys.executable, "-c", HOLD, str(folder), "once"]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def _until(condition, timeout_s: float = 30.0) -> bool:
    pause, deadline = threading.Event(), time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        pause.wait(0.02)
    return True


def test_a_second_run_is_refused_while_the_first_holds_the_folder(folder, hold):
    proc = hold()
    assert folder_lock.holder(folder) == proc.pid
    with pytest.raises(RunFolderBusyError, match=rf"in use by process {proc.pid} "):
        folder_lock.acquire(folder)
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    assert folder_lock.holder(folder) is None  # the holder ended: the lock went with it
    folder_lock.acquire(folder)
    assert (folder / run_folder.LOCK).read_text() == f"{os.getpid()}\n"


def test_a_killed_holder_leaves_its_pid_in_the_file_but_no_lock(folder, hold):
    proc = hold()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert (folder / run_folder.LOCK).read_text() == f"{proc.pid}\n"  # stale: nothing holds it
    assert folder_lock.holder(folder) is None
    folder_lock.acquire(folder)
    assert (folder / run_folder.LOCK).read_text() == f"{os.getpid()}\n"


def test_the_lock_stays_held_while_a_forked_child_of_the_holder_lives(folder, hold):
    proc = hold("fork")
    assert proc.wait(timeout=30) == 0  # the launcher is gone, its child is not
    assert folder_lock.holder(folder) == proc.pid
    with pytest.raises(RunFolderBusyError):
        folder_lock.acquire(folder)
    proc.stdin.close()  # the child reads to the end of its stdin, and exits
    assert _until(lambda: folder_lock.holder(folder) is None)
    folder_lock.acquire(folder)


def test_a_released_folder_can_be_taken_by_another_process(folder):
    folder_lock.acquire(folder)
    taker = _take_in_another_process(folder)
    assert taker.returncode != 0 and "RunFolderBusyError" in taker.stderr
    assert f"in use by process {os.getpid()}" in taker.stderr
    folder_lock.release(folder)
    taker = _take_in_another_process(folder)
    assert taker.returncode == 0 and taker.stdout == "held\n"


def test_a_launcher_that_holds_the_lock_for_its_controller_takes_nothing(folder, monkeypatch):
    monkeypatch.setenv(folder_lock.ENV_HELD, "1")
    folder_lock.acquire(folder)
    assert not (folder / run_folder.LOCK).exists()


def test_a_missing_folder_is_a_run_folder_error_naming_it(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(RunFolderError, match="nope"):
        folder_lock.acquire(missing)
    assert folder_lock.holder(missing) is None


def test_a_folder_this_process_holds_for_a_run_is_refused_to_a_second_run_here(folder):
    """A notebook's ``troupe.train(resume=...)`` of a folder its own background run still
    wrote: the lock let the same process in, and two controllers wrote one folder (frames
    going backwards in metrics.jsonl, the summary overwritten)."""
    running = True
    folder_lock.acquire(folder)
    folder_lock.held_by_run(folder, lambda: running)
    with pytest.raises(
        RunFolderBusyError, match=rf"in use by a run this process \(pid {os.getpid()}\)"
    ):
        folder_lock.acquire(folder)
    running = False  # it ended, and nobody waited for it: the folder is free
    folder_lock.acquire(folder)
    assert folder_lock.holder(folder) is None  # this process's own
    folder_lock.release(folder)
    assert _take_in_another_process(folder).returncode == 0


def test_a_controller_started_again_waits_for_the_lock_its_lost_predecessor_holds(
    folder, hold, caplog
):
    """A controller started again on another node finds its predecessor's lock held by the
    file server (NFS) until that client's lease expires: it was refused at once, spending a
    restart of its scheduler. It waits for the lock; a holder that stays is refused as before."""
    proc = hold()
    timer = threading.Timer(2.0, proc.stdin.close)  # the lease expires: the lock goes
    timer.start()
    try:
        with caplog.at_level("INFO", logger="system.run.folder_lock"):
            folder_lock.acquire(folder, wait_s=60)
    finally:
        timer.cancel()
    assert (folder / run_folder.LOCK).read_text() == f"{os.getpid()}\n"
    said = " ".join(caplog.messages)
    assert f"is locked by process {proc.pid}: waiting up to 60s for it" in said, said
    assert "took the lock of run folder" in said
    folder_lock.release(folder)
    still = hold()
    with pytest.raises(RunFolderBusyError, match=rf"in use by process {still.pid} "):
        folder_lock.acquire(folder, wait_s=1.5)
