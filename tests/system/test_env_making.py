"""An actor makes its environments at once when the first was slow to make
(``system/workers/env_making.py``), one after another when it was quick or
``actors.make_threads=1``; a failed make closes what was made and raises the first error."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from api import registry
from api.config import make_experiment
from api.errors import ConfigError
from distributed.launch.last_lines import warning_lines
from distributed.launch.local import LocalLauncher
from system.processes import process_alive
from system.run.controller import Controller
from system.workers import env_making

ROOT = Path(__file__).resolve().parents[2]
SLOW = Path(__file__).parent / "user_code" / "slow_to_make_env.py"


class _Env:
    """Stands for an environment: make_environments only makes and closes them."""

    def __init__(self, e: int):
        self.e, self.closed = e, False

    def close(self) -> None:
        self.closed = True


class _Maker:
    """Makes ``_Env`` s, each taking ``make_s``; counts how many were being made at once."""

    def __init__(self, make_s: float, fail_at: frozenset[int] = frozenset()):
        self.make_s, self.fail_at = make_s, fail_at
        self.lock, self.now, self.most, self.started = threading.Lock(), 0, 0, 0
        self.made: list[_Env] = []
        self.threads: set[str] = set()

    def __call__(self, e: int) -> _Env:
        with self.lock:
            self.now += 1
            self.started += 1
            self.most = max(self.most, self.now)
            self.threads.add(threading.current_thread().name)
        time.sleep(self.make_s)
        with self.lock:
            self.now -= 1
        if e in self.fail_at:
            raise RuntimeError(f"environment {e} cannot start its simulator")
        env = _Env(e)
        with self.lock:
            self.made.append(env)
        return env


@pytest.fixture
def quick_threshold(monkeypatch):
    monkeypatch.setattr(env_making, "SLOW_MAKE_S", 0.05)


def test_environments_slow_to_make_are_made_at_once_in_order(quick_threshold):
    make = _Maker(make_s=0.2)
    envs = env_making.make_environments(make, 6, threads=3, who="actor/0")
    assert [env.e for env in envs] == list(range(6))
    assert make.most == 3  # the other five on three threads
    assert threading.current_thread().name in make.threads  # the first, alone, on its own


@pytest.fixture
def still_clock(monkeypatch):
    """env_making's clock stands still: a make of 0 s counts as quick even when a loaded
    machine paused the test past the threshold (CI saw a quick make take over 0.05 s)."""
    monkeypatch.setattr(env_making, "time", types.SimpleNamespace(monotonic=lambda: 0.0))


def test_quick_environments_and_one_thread_are_made_one_after_another(quick_threshold, still_clock):
    for make, threads in ((_Maker(make_s=0.0), 8), (_Maker(make_s=0.1), 1)):
        envs = env_making.make_environments(make, 4, threads=threads, who="actor/0")
        assert [env.e for env in envs] == [0, 1, 2, 3]
        assert make.most == 1 and make.threads == {threading.current_thread().name}


@pytest.mark.parametrize("threads", [1, 4])
def test_a_failed_make_closes_what_was_made_and_raises_the_first_error(quick_threshold, threads):
    """A simulator's process must not outlive the worker's error."""
    make = _Maker(make_s=0.1, fail_at=frozenset({2, 3}))
    with pytest.raises(RuntimeError, match="environment 2 cannot start"):
        env_making.make_environments(make, 5, threads=threads, who="actor/0")
    assert make.made and all(env.closed for env in make.made)


def test_no_make_starts_after_one_failed(quick_threshold):
    """A simulator that cannot start fails every make alike: the worker's error came only once
    all twenty were tried, two at a time, ten times the wait."""
    make = _Maker(make_s=0.1, fail_at=frozenset({1}))
    with pytest.raises(RuntimeError, match="environment 1 cannot start"):
        env_making.make_environments(make, 21, threads=2, who="actor/0")
    assert make.started <= 5, make.started  # 0 alone; 1 and 2; at most one more each
    assert all(env.closed for env in make.made)


def test_make_threads_must_be_at_least_1():
    with pytest.raises(ConfigError, match=r"actors\.make_threads: must be at least 1"):
        make_experiment("cartpole-ppo", ["actors.make_threads=0"])


def _run_slow(marks: Path, overrides: list[str]) -> tuple[Path, dict]:
    """A real cartpole-ppo run on :data:`SLOW`'s environment, leaving its marks in ``marks``:
    its run folder and summary."""
    registry.register_environment(
        "slow-to-make-cartpole", "slow_to_make_env:SlowToMakeCartPole", source=str(SLOW),
        override=True,
    )  # fmt: skip
    try:
        config = make_experiment("cartpole-ppo", [
            "environment.type=slow-to-make-cartpole", f"environment.args.marks={marks}",
            "actors.workers=1", "stop.eval_return=None", "stop.env_frames=3000", *overrides,
        ])  # fmt: skip
    finally:
        registry.environments.unregister("slow-to-make-cartpole")
    run_dir = marks.parent / "run"
    return run_dir, Controller(config, run_dir, LocalLauncher(), display=False).run()


@pytest.mark.multiprocess
def test_a_run_makes_an_actors_slow_environments_at_once(tmp_path):
    """A real run: the actor's first environment takes 1.2 s, the other three are made on
    threads of the actor process, and the run trains to its budget."""
    marks = tmp_path / "marks"
    run_dir, summary = _run_slow(marks, ["actors.envs_per_worker=4", "evaluation.workers=0"])
    assert summary["stop_reason"] == "env_frames", summary
    workers = json.loads((run_dir / "workers.json").read_text())
    actor_pid = str(workers["actor/0"]["pid"])
    by_actor = [m.name for m in marks.iterdir() if m.name.startswith(f"{actor_pid}-")]
    assert len(by_actor) == 4, sorted(m.name for m in marks.iterdir())
    assert sum("-make-env-" in name for name in by_actor) == 3, by_actor
    said = (run_dir / "logs" / "actor-0.log").read_text()
    assert "making the other 3, 3 at once" in said, said[-2000:]


@pytest.mark.multiprocess
def test_an_environment_slow_to_make_again_after_a_crash_is_no_hung_actor(tmp_path):
    """``actors.on_env_error=reset`` makes a crashed simulator again inside one poll: 2.5 s
    here, against a 1 s ``liveness.max_poll_s``. The actor was taken for hung and restarted;
    the make is bounded by ``liveness.max_build_s``, and the run goes on without a restart."""
    marks = tmp_path / "marks"
    run_dir, summary = _run_slow(marks, [
        "environment.args.make_s=2.5", "environment.args.crash_at_step=50",
        "actors.envs_per_worker=1", "actors.groups=1", "actors.on_env_error=reset",
        "liveness.max_poll_s=1", "evaluation.workers=0",
    ])  # fmt: skip
    assert (marks / "crashed").exists()
    assert summary["stop_reason"] == "env_frames", summary
    workers = json.loads((run_dir / "workers.json").read_text())
    assert {w: s["restarts"] for w, s in workers.items() if s["restarts"]} == {}
    latest = json.loads((run_dir / "latest.json").read_text())
    assert latest["worker_health/env_resets"] == 1, latest


@pytest.mark.multiprocess
def test_an_evaluation_actor_still_making_environments_at_the_stop_leaves_at_once(tmp_path):
    """The run spends its budget while its evaluation actor still makes its environments, one
    after another (``actors.make_threads=1``): it was waited for 15 s, then killed, leaving
    what it had made unclosed. The controller sends it SIGTERM: it closes them and leaves as
    stopped, and the run ends as it should."""
    marks = tmp_path / "marks"
    run_dir, summary = _run_slow(marks, [
        "environment.args.make_s=0.5", "actors.envs_per_worker=1", "actors.groups=1",
        "actors.make_threads=1", "evaluation.workers=1", "evaluation.envs_per_worker=200",
    ])  # fmt: skip
    assert summary["stop_reason"] == "env_frames" and "failure" not in summary, summary
    # it played nothing, which the run's end says (it said nothing: exit 0, no evaluation)
    assert summary["never_ready"] == ["eval/0"], summary
    assert warning_lines(summary) == [
        "never ready: eval/0 still starting when the run stopped, so it did nothing (see their "
        "logs); no greedy evaluation was played"
    ]
    workers = json.loads((run_dir / "workers.json").read_text())
    assert workers["eval/0"]["state"] == "stopped", workers["eval/0"]
    said = (run_dir / "logs" / "eval-0.log").read_text()
    assert "stopped by the controller while being built" in said, said[-2000:]
    pid = str(workers["eval/0"]["pid"])
    made = [m for m in marks.iterdir() if m.name.startswith(f"{pid}-")]
    closed = [m for m in marks.iterdir() if m.name.startswith(f"closed-{pid}-")]
    assert 0 < len(made) < 200 and len(closed) == len(made), (len(made), len(closed))


def _simulators(marks: Path) -> list[int]:
    """The pids of the processes :data:`SLOW`'s environments started (``child=True``)."""
    return [int(m.name.split("-")[1]) for m in marks.iterdir() if m.name.startswith("child-")]


@pytest.mark.multiprocess
def test_a_hung_actor_restarted_takes_the_processes_its_environment_started_with_it(tmp_path):
    """An actor hung in a step is SIGKILLed and restarted: the simulator process its
    environment had started ran on, reparented, restart after restart. The launcher kills what
    the worker had started with it."""
    marks = tmp_path / "marks"
    _, summary = _run_slow(marks, [
        "environment.args.make_s=0", "environment.args.child=True",
        "environment.args.hang_at_step=50", "actors.envs_per_worker=1", "actors.groups=1",
        "liveness.max_poll_s=1", "evaluation.workers=0",
    ])  # fmt: skip
    assert (marks / "hung").exists() and summary["stop_reason"] == "env_frames", summary
    assert {w: r["restarts"] for w, r in summary["restarts"].items()} == {"actor/0": 1}
    children = _simulators(marks)
    assert len(children) >= 2  # the hung actor's, and its restart's (and the controller's check)
    assert [pid for pid in children if process_alive(pid)] == []


@pytest.mark.multiprocess
def test_an_actor_killed_from_outside_takes_the_processes_its_environment_started(
    tmp_path, monkeypatch
):
    """A ``kill -9`` (or the out-of-memory killer) of an actor whose environment started a
    process: the launcher restarts the actor and kills that process, which was left to init
    and ran on before (the launcher saw the actor only once it was dead). The run stops once
    the restarted actor has made its environment: a 10 s budget, on a loaded machine, ended
    before the restart was seen."""
    monkeypatch.setattr(LocalLauncher, "survey_every_s", 0.0)  # at each supervision (1 s)
    marks = tmp_path / "marks"
    killed: list[int] = []
    restarted = threading.Event()

    def kill_the_actor() -> None:
        workers, deadline = tmp_path / "run" / "workers.json", time.monotonic() + 120
        while time.monotonic() < deadline and not restarted.is_set():
            with contextlib.suppress(OSError, ValueError, KeyError):
                pid = json.loads(workers.read_text())["actor/0"]["pid"]
                if not killed and any(marks.glob(f"{pid}-*")):  # its environment made
                    time.sleep(2.5)  # past a survey
                    killed.append(pid)
                    os.kill(pid, signal.SIGKILL)
                elif killed and pid != killed[0] and any(marks.glob(f"{pid}-*")):
                    restarted.set()  # the new actor has made its environment (and simulator)
            time.sleep(0.05)
        restarted.set()

    check_stop = Controller._check_stop

    def stop_once_restarted(self) -> None:
        check_stop(self)
        if restarted.is_set() and not self.stop_reason:
            self.stop_reason = "interrupted"

    monkeypatch.setattr(Controller, "_check_stop", stop_once_restarted)
    killer = threading.Thread(target=kill_the_actor, daemon=True)
    killer.start()
    _, summary = _run_slow(marks, [
        "environment.args.make_s=0", "environment.args.child=True", "actors.envs_per_worker=1",
        "evaluation.workers=0", "stop.env_frames=None", "stop.wall_seconds=300",
    ])  # fmt: skip
    killer.join()
    assert killed and summary["stop_reason"] == "interrupted", summary
    assert {w: r["restarts"] for w, r in summary["restarts"].items()} == {"actor/0": 1}
    children = _simulators(marks)
    assert len(children) >= 2  # the killed actor's, and its restart's (and the controller's check)
    assert [pid for pid in children if process_alive(pid)] == []


@pytest.mark.multiprocess
def test_what_an_environment_s_close_left_running_is_ended_with_the_run(tmp_path, caplog):
    """An environment whose ``close`` forgets the simulator it started: the actor stopped in
    order (exit 0), and its ``sleep 600`` ran on after the run, one more each run."""
    marks = tmp_path / "marks"
    run_dir, summary = _run_slow(marks, [
        "environment.args.make_s=0", "environment.args.child=True",
        "environment.args.leave_child=True", "actors.envs_per_worker=1", "evaluation.workers=0",
    ])  # fmt: skip
    assert summary["stop_reason"] == "env_frames" and "failure" not in summary, summary
    workers = json.loads((run_dir / "workers.json").read_text())
    assert workers["actor/0"]["state"] == "stopped" and workers["actor/0"]["restarts"] == 0
    actor = str(workers["actor/0"]["pid"])
    assert any(m.name.startswith(f"closed-{actor}-") for m in marks.iterdir())  # close() ran
    children = _simulators(marks)
    assert children and [pid for pid in children if process_alive(pid)] == []
    said = " ".join(caplog.text.split())  # the controller's log: this process here
    # the actor's simulator, and the one each other role's look at the spaces made
    assert re.search(r"actor/0 stopped, but 1 process\(es\) its environments had started still "
                     r"ran: \d+ \(sleep 600\); killed", said), said[-2000:]  # fmt: skip


LEAVES = """
import os, signal, sys, time
from system.workers import env_making

class Env:
    def close(self):
        os.write(1, b"closed\\n")  # one write a line: threads' prints interleave

def make(e):
    if e:
        os.write(1, f"making {e}\\n".encode())
        time.sleep(600)  # a simulator's start-up
    return Env()

env_making.SLOW_MAKE_S = 0.0
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # as a worker's TermSignal raises
env_making.make_environments(make, 4, threads=3, who="actor/0")
"""


@pytest.mark.multiprocess
def test_a_sigterm_while_environments_are_made_at_once_leaves_at_once():
    """The threads that make are daemons: the process leaves on its signal, where a pool's
    threads are joined at exit, ten minutes later here; what was made is closed first."""
    proc = subprocess.Popen([sys.executable, "-c", LEAVES], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        assert proc.stdout.readline().startswith("making"), proc.stdout.read()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 143, out
        assert out.split().count("closed") == 1, out  # the first, made: its simulator is not left
    finally:
        proc.kill()
        proc.communicate()


STARTING = LEAVES.replace(
    """        os.write(1, f"making {e}\\n".encode())
        time.sleep(600)  # a simulator's start-up""",
    """        import os, subprocess
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}  # not our pipe
        child = subprocess.Popen(["sleep", "600"], **quiet)  # the simulator, started
        os.write(1, f"child {child.pid}\\n".encode())  # one write: threads' prints interleave
        time.sleep(600)  # and waited for until it is ready""",
)


@pytest.mark.multiprocess
def test_a_sigterm_while_simulators_start_kills_those_started():
    """The makes still running at a SIGTERM never return, so nothing would close what they had
    started: three simulators ran on, reparented, after the worker left."""
    proc = subprocess.Popen([sys.executable, "-c", STARTING], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    children: list[int] = []
    try:
        while len(children) < 3:
            line = proc.stdout.readline()
            if not line.startswith("child"):
                proc.kill()  # first: its output ends only with it
                pytest.fail(f"{line!r} {proc.stdout.read()}")
            children.append(int(line.split()[1]))
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 143, out
        deadline = time.monotonic() + 10
        while any(process_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in children if process_alive(pid)] == [], out
    finally:
        proc.kill()
        proc.communicate()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
