"""Whether a process is alive, by its pid (system.processes): a live child is, a reaped one is
not, a zombie exists but is not alive, and a pid whose start time differs is another process."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from system.processes import (
    Offspring,
    command_line,
    descendants,
    process_alive,
    process_exists,
    process_start,
)

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def _until(condition, timeout_s: float = 10.0) -> bool:
    pause = threading.Event()
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        pause.wait(0.01)
    return True


@pytest.fixture
def child():
    """A real process that lives until its stdin is closed (never reaped before the test
    means it to be)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    with proc:  # closes its stdin and reaps it
        yield proc
        proc.kill()


def test_a_live_child_is_alive_and_its_start_time_names_it(child):
    start = process_start(child.pid)
    assert start is not None and start >= process_start(os.getpid())
    assert process_exists(child.pid)
    assert process_alive(child.pid) and process_alive(child.pid, start)
    # the same pid with another start time is a process the kernel gave that pid to since
    assert not process_alive(child.pid, start + 1)


def test_an_exited_child_is_a_zombie_until_reaped_and_then_gone(child):
    child.stdin.close()  # it exits, and nobody waits for it yet
    stat = Path(f"/proc/{child.pid}/stat")
    assert _until(lambda: stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z")
    assert process_exists(child.pid)  # kill(pid, 0) still finds the zombie...
    assert not process_alive(child.pid)  # ...which is no live process
    child.wait()
    assert not process_exists(child.pid)
    assert not process_alive(child.pid)
    assert process_start(child.pid) is None  # no /proc entry left


def test_no_pid_is_no_process():
    assert not process_alive(None) and not process_alive(0)


def test_this_process_is_alive_with_its_own_start_time():
    start = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[-1].split()[19])
    assert process_start(os.getpid()) == start
    assert process_alive(os.getpid(), start)


def test_the_processes_below_one_are_its_children_and_theirs():
    """What a worker's environment started (a simulator), which the launcher kills with it."""
    tree = subprocess.Popen(["bash", "-c", "sleep 600 & bash -c 'sleep 600 & wait' & wait"])
    try:
        assert _until(lambda: len(descendants(tree.pid)) == 3)  # sleep, bash, and its sleep
        below = descendants(tree.pid)
        names = sorted(Path(f"/proc/{pid}/comm").read_text().strip() for pid in below)
        assert names == ["bash", "sleep", "sleep"], names
        assert tree.pid not in below
    finally:
        for pid in [*descendants(tree.pid), tree.pid]:
            os.kill(pid, 9)
        tree.wait()


def test_what_ran_below_a_process_killed_from_outside_is_named_after_its_death():
    """The launcher's record of a worker's simulators: the worker SIGKILLed, they run on under
    init, and only the last survey, made while it lived, says they were its."""
    tree = subprocess.Popen(["bash", "-c", "sleep 600 & sleep 600 & wait"])
    offspring, sleeps = Offspring(every_s=5.0), []
    try:
        assert _until(lambda: len(descendants(tree.pid)) == 2)
        offspring.survey({"actor/0": tree.pid, "gone/0": None}, now=100.0)
        sleeps = sorted(descendants(tree.pid))
        tree.kill()
        tree.wait()
        assert descendants(tree.pid) == []  # left to init: nothing below the dead pid says so
        offspring.survey({"actor/0": tree.pid}, now=104.0)  # too soon, and the pid is dead
        assert sorted(offspring.left("actor/0")) == sleeps
        assert offspring.left("actor/0") == [] and offspring.left("gone/0") == []  # forgotten
    finally:
        for pid in descendants(tree.pid) + sleeps:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def test_a_process_that_ended_since_the_survey_is_not_named():
    tree = subprocess.Popen(["bash", "-c", "sleep 600 & wait"])
    offspring = Offspring(every_s=0.0)
    try:
        assert _until(lambda: len(descendants(tree.pid)) == 1)
        offspring.survey({"actor/0": tree.pid}, now=1.0)
        (sleep,) = descendants(tree.pid)
        os.kill(sleep, 9)
        assert _until(lambda: not process_alive(sleep))
        assert offspring.left("actor/0") == []
    finally:
        tree.kill()
        tree.wait()


def test_a_forced_survey_looks_at_once_and_a_command_line_is_named():
    """The stop looks below every worker at once: a simulator started since the last survey
    (every 5 s) was not known, and the end of the run could not say it was a worker's."""
    tree = subprocess.Popen(["bash", "-c", "sleep 600 & wait"])
    offspring = Offspring(every_s=5.0)
    try:
        offspring.survey({}, now=100.0)  # the last look: before the worker was there
        assert _until(lambda: len(descendants(tree.pid)) == 1)
        offspring.survey({"actor/0": tree.pid}, now=101.0)  # too soon: nothing looked at
        assert offspring.left("actor/0") == []
        offspring.survey({"actor/0": tree.pid}, now=101.0, force=True)
        (sleep,) = offspring.left("actor/0")
        assert command_line(sleep) == "sleep 600"
        assert command_line(sleep, width=6) == "sle..."
    finally:
        for pid in descendants(tree.pid):
            os.kill(pid, 9)
        tree.kill()
        tree.wait()
    assert command_line(tree.pid) == "?"  # gone
