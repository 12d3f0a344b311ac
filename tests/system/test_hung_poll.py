"""A worker stuck inside one poll (a hung environment, a deadlock) goes silent within its role's
``liveness`` bound: the busy heartbeat thread stops beating and stops touching the file a
Kubernetes liveness probe reads, so the worker is restarted. Before, the thread beat for 600 s
whatever the role, so a hung actor was restarted only after ten minutes."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from api import registry
from api.config import make_experiment
from api.errors import ConfigError
from distributed.launch.local import LocalLauncher
from system.run import busy_heartbeat, worker_process
from system.run import control_protocol as cp
from system.run.busy_heartbeat import BusyHeartbeat
from system.run.control_channel import HEARTBEAT_S
from system.run.controller import Controller
from system.workers.base import Worker

HANGING = Path(__file__).resolve().parent / "user_code" / "hanging_env.py"
BOUND_S = 2.0
"""``liveness.max_poll_s`` of the process test: the hung actor goes silent this far into it."""
HEARTBEAT_TIMEOUT_S = 3.0
"""The controller's: it restarts a worker silent this long."""


class FakeControl:
    """The control channel's worker end, recording when each heartbeat went out."""

    worker_id = "actor/0"

    def __init__(self):
        self.beats: list[float] = []
        self.stop = threading.Event()
        self.sent: list[str] = []
        self.errors: list = []
        self.lock = threading.RLock()

    def heartbeat(self, stats):
        self.beats.append(time.monotonic())

    def stop_requested(self, wait_s: float = 0.0) -> bool:
        return self.stop.is_set()

    def leave_requested(self) -> bool:
        return False

    def send(self, message):
        self.sent.append(message.kind)
        if message.kind == "error":
            self.errors.append(message)

    def check_controller(self):
        pass


class HangingWorker(Worker):
    """Polls return at once until ``hang`` is set; then one poll blocks until ``release``."""

    def __init__(self):
        super().__init__("actor/0")
        self.hang, self.release = threading.Event(), threading.Event()
        self.hung_at: float | None = None

    def poll(self) -> int:
        if self.hang.is_set() and self.hung_at is None:
            self.hung_at = time.monotonic()
            self.release.wait(60)  # an environment whose step never returns
        return 0


def wait_for(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_each_role_has_its_bound_and_actors_a_short_one():
    liveness = make_experiment("cartpole-ppo", []).liveness
    assert liveness.bound("trainer") == ("liveness.max_trainer_poll_s", 600.0)
    for role in ("actor", "policy", "replay", "parameter_service"):
        assert liveness.bound(role) == ("liveness.max_poll_s", 60.0)
    bounds = make_experiment("cartpole-ppo", ["liveness.max_poll_s=5"]).liveness
    assert bounds.bound("actor") == ("liveness.max_poll_s", 5.0)


def test_a_worker_building_for_long_beats_and_one_past_its_bound_is_reported(monkeypatch):
    """An environment that takes minutes to make (a simulator starting) left its worker silent
    past the controller's start grace: killed and restarted, to be killed again. A thread
    beats while the worker builds, up to ``liveness.max_build_s``; past it the worker is
    reported hung where it builds, and a build that ends after that goes no further."""
    clock = [0.0]
    monkeypatch.setattr(busy_heartbeat, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    ctl = FakeControl()
    ended_after_all = pytest.raises(RuntimeError, match="its build, taken for hung, ended after")
    with ended_after_all, busy_heartbeat.building(ctl, ("liveness.max_build_s", 900.0)) as busy:
        clock[0] = 899.0  # long, within the bound: beats go on
        wait_for(lambda: busy.beats >= 2)
        clock[0] = 901.0
        wait_for(lambda: busy.reported)
    (error,) = ctl.errors
    assert error.message.startswith(
        "building it has taken longer than liveness.max_build_s=900s: taken for hung and "
        "restarted (raise liveness.max_build_s if it takes that long to build); it is stuck at"
    ), error.message
    assert error.type == cp.HUNG_POLL
    with busy_heartbeat.building(ctl, ("liveness.max_build_s", 900.0)) as busy:
        pass  # a quick build: nothing said, nothing raised
    assert busy.beats == 0 and len(ctl.errors) == 1
    assert make_experiment("cartpole-ppo", []).liveness.max_build_s == 900.0


class RebuildingWorker(Worker):
    """Its second poll makes an environment again (``on_env_error=reset``), for 30 s of the
    test's clock against a 5 s poll bound; its third has a step that never returns."""

    def __init__(self, clock: list[float]):
        super().__init__("actor/0")
        self.clock, self.polls = clock, 0
        self.rebuilt, self.hang = threading.Event(), threading.Event()

    def poll(self) -> int:
        self.polls += 1
        if self.polls == 2:
            with self.building():  # as ActorWorker._recover_env makes the environment again
                self.clock[0] += 30.0
                time.sleep(4 * HEARTBEAT_S)  # the thread looks several times meanwhile
            self.rebuilt.set()
        elif self.polls == 3:
            self.clock[0] += 1.0
            self.hang.wait(60)
        return 0


def test_an_environment_made_again_within_a_poll_is_bounded_as_a_build(monkeypatch):
    """A simulator crashed and ``actors.on_env_error=reset`` made it again: minutes, inside
    one poll. The actor was taken for hung at ``liveness.max_poll_s`` and restarted, to make
    every environment again. The make is bounded by ``liveness.max_build_s``; the rest of the
    poll, and the next, by the poll's bound again."""
    clock = [0.0]
    monkeypatch.setattr(busy_heartbeat, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    ctl, worker = FakeControl(), RebuildingWorker(clock)
    ended: list[int] = []
    limits = ("liveness.max_poll_s", 5.0), ("liveness.max_build_s", 900.0)
    loop = threading.Thread(target=lambda: ended.append(
        worker_process._loop(ctl, worker, [], limits[0], max_build=limits[1])))  # fmt: skip
    loop.start()
    try:
        assert worker.rebuilt.wait(30) and ctl.errors == []  # 30 s of making: not hung
        wait_for(lambda: worker.polls == 3)
        clock[0] += 10.0  # the hung step, 11 s into its poll: past the poll's bound
        wait_for(lambda: ctl.errors != [])
    finally:
        worker.hang.set()
        ctl.stop.set()
        loop.join(timeout=10)
    (error,) = ctl.errors
    assert error.message.startswith("one poll has run longer than liveness.max_poll_s=5s")
    assert ended == [worker_process.EXIT_FAILED]


def test_a_bound_must_be_positive():
    with pytest.raises(ConfigError, match=r"liveness\.max_poll_s: must be more than 0, got 0"):
        make_experiment("cartpole-ppo", ["liveness.max_poll_s=0"])


def test_the_busy_thread_beats_up_to_the_bound_and_then_reports_the_hang(
    monkeypatch, tmp_path, caplog
):
    clock = [0.0]  # the thread's clock, so the bound is crossed exactly when the test says
    monkeypatch.setattr(busy_heartbeat, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    beat_file = tmp_path / "heartbeat"
    monkeypatch.setenv("TROUPE_HEARTBEAT_FILE", str(beat_file))
    ctl = FakeControl()
    busy = BusyHeartbeat(ctl, ("liveness.max_poll_s", 5.0), on_beat=busy_heartbeat.mark_alive)
    try:
        with caplog.at_level(logging.INFO, logger=busy_heartbeat.__name__), busy:
            clock[0] = 4.9  # long, but within the bound: beats go on
            wait_for(lambda: busy.beats >= 2)
            assert beat_file.exists() and not busy.hung
            clock[0] = 5.1  # past it
            wait_for(lambda: busy.hung)
            beats, touched = busy.beats, beat_file.stat().st_mtime_ns
            checked = len(ctl.beats)
            wait_for(lambda: busy.reported)
    finally:
        busy.stop()
    assert busy.beats == beats == checked and beat_file.stat().st_mtime_ns == touched
    # the line the main thread is stuck on (the test's own wait), said once on the console and
    # to the controller as an error, with the whole stack
    stuck = "; it is stuck at " + __file__
    said = (
        "one poll has run longer than liveness.max_poll_s=5s: taken for hung and restarted "
        "(raise liveness.max_poll_s if this role's polls are that long)" + stuck
    )
    (error,) = ctl.errors
    assert error.message.startswith(said) and " in wait_for: time.sleep(0.02)" in error.message
    assert error.type == cp.HUNG_POLL and not error.fatal
    assert "in wait_for" in error.traceback and "test_the_busy_thread_beats" in error.traceback
    # the stack from the frame that polls (here: this test) down, not the process's start-up
    assert error.traceback.startswith(f'  File "{__file__}", line ')
    assert error.traceback.splitlines()[0].endswith(", in test_the_busy_thread_beats_up_to_the_"
                                                    "bound_and_then_reports_the_hang")  # fmt: skip
    # the controller shows it on the console; the worker's log has it too
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, f"actor/0: {error.message} (after 5s)"),
        (logging.INFO, f"actor/0: the hung poll's stack:\n{error.traceback}"),
    ]


def test_a_hang_the_controller_cannot_be_told_of_is_said_on_the_console(monkeypatch, caplog):
    """The main thread hung holding the control socket (inside a send): the thread cannot
    report it, so it says so itself; the stopped heartbeats tell the controller."""
    clock = [0.0]
    monkeypatch.setattr(busy_heartbeat, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    ctl = FakeControl()
    busy = BusyHeartbeat(ctl, ("liveness.max_poll_s", 5.0))
    try:
        with caplog.at_level(logging.INFO, logger=busy_heartbeat.__name__), busy, ctl.lock:
            clock[0] = 5.1
            wait_for(lambda: busy.hung and len(caplog.records) == 2)
    finally:
        busy.stop()
    assert not busy.reported and ctl.errors == []
    error, stack = caplog.records
    assert error.levelno == logging.ERROR and "taken for hung" in error.getMessage()
    assert stack.levelno == logging.INFO and "in test_a_hang_the_controller" in stack.getMessage()


def test_a_worker_whose_poll_hangs_lets_its_probe_file_go_stale(monkeypatch, tmp_path):
    """The worker loop itself, with a poll that never returns: the probe file stops being
    touched once the poll has run for the bound, while the process is still alive."""
    beat_file = tmp_path / "heartbeat"
    monkeypatch.setenv("TROUPE_HEARTBEAT_FILE", str(beat_file))
    ctl, worker = FakeControl(), HangingWorker()
    bound_s = 2.0
    loop = threading.Thread(
        target=worker_process._loop, args=(ctl, worker, [], ("liveness.max_poll_s", bound_s))
    )
    loop.start()
    try:
        wait_for(beat_file.exists)  # the loop's own beats touch it
        worker.hang.set()
        wait_for(lambda: worker.hung_at is not None)
        # Stale: untouched for longer than the probe's granularity (whole seconds, stat -c %Y).
        wait_for(lambda: time.time() - os.stat(beat_file).st_mtime > 1.5 + HEARTBEAT_S)
        assert loop.is_alive() and not worker.release.is_set()
        last = ctl.beats[-1] - worker.hung_at
        print(f"last heartbeat {last:.2f}s into the hung poll (bound {bound_s}s)")
        # The thread decides before it beats, so its last beat is within the bound (plus the
        # time between that check and the beat: well under a heartbeat interval).
        assert 0 < last <= bound_s + HEARTBEAT_S
    finally:
        worker.release.set()
        ctl.stop.set()
        loop.join(timeout=10)
    # the controller was told and restarts the worker: the poll that came back leaves
    assert not loop.is_alive() and ctl.sent[-1] == "error" and "bye" not in ctl.sent


@pytest.mark.multiprocess
def test_an_actor_whose_environment_hangs_is_restarted_and_the_run_goes_on(tmp_path, caplog):
    registry.register_environment(
        "hanging-cartpole", "hanging_env:HangingCartPole", source=str(HANGING), override=True
    )
    try:
        config = make_experiment("cartpole-ppo", [
            "environment.type=hanging-cartpole", f"environment.args.marker={tmp_path / 'hung'}",
            "actors.workers=1", "actors.envs_per_worker=8", "evaluation.workers=0",
            "stop.eval_return=None", "stop.env_frames=4000", "stop.wall_seconds=240",
            f"liveness.max_poll_s={BOUND_S}",
        ])  # fmt: skip
    finally:
        registry.environments.unregister("hanging-cartpole")
    run_dir = tmp_path / "run"
    controller = Controller(
        config, run_dir, LocalLauncher(), display=False, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S
    )
    with caplog.at_level(logging.WARNING, logger="system.run.supervisor"):
        summary = controller.run()
    assert (tmp_path / "hung").exists()  # the environment did hang
    # With the busy thread beating for 600 s as before, the hung actor would not be restarted
    # and the run would end on its wall-clock limit, short of its frames.
    assert summary["stop_reason"] == "env_frames", summary
    workers = json.loads((run_dir / "workers.json").read_text())
    assert {w: s["restarts"] for w, s in workers.items() if s["restarts"]} == {"actor/0": 1}
    # told by the worker, not a heartbeat timeout later; the stuck line is named
    assert "actor/0 failed; restarting it (restart 1)" in caplog.messages
    (failed,) = [m for m in caplog.messages if m.startswith("actor/0 failed: ")]
    assert f"it is stuck at {HANGING}:" in failed
