"""A worker's SIGTERM handler (system.run.term_signal), with real signals sent to this process:
in its loop the first one is noted and told to the controller, and the worker leaves without
its stop only when none came in time; before its loop it leaves at once."""

from __future__ import annotations

import logging
import signal
import threading
import time

import pytest

from system.run import control_protocol as cp
from system.run import term_signal as ts
from system.run import worker_process
from system.run.control_channel import BUSY_AFTER_S, ControlClient
from system.run.control_server import ControlServer
from system.workers.base import Worker


class Channel:
    def __init__(self) -> None:
        self.sent: list[cp.ControlMessage] = []

    def send(self, message: cp.ControlMessage) -> None:
        self.sent.append(message)

    def stop_requested(self, wait_s: float = 0.0) -> bool:
        return False


@pytest.fixture
def term():
    previous = signal.getsignal(signal.SIGTERM)
    handler = ts.TermSignal()
    handler.install()
    yield handler
    signal.signal(signal.SIGTERM, previous)


def test_while_it_is_built_a_worker_leaves_at_once(term):
    with pytest.raises(ts.Terminated), term.building():
        signal.raise_signal(signal.SIGTERM)
    assert not term.interruptible


SIGNALLED_MID_IMPORT = """\
import signal
signal.raise_signal(signal.SIGTERM)  # the run's stop, met while the module is imported
whole = True
"""


def test_a_sigterm_met_in_an_import_is_raised_once_the_import_is_done(term, tmp_path, monkeypatch):
    """Raised inside a compiled module's import (ale_py's, through nanobind), Terminated
    crossed C++ that may not throw: the process aborted with "terminate called after throwing
    an instance of 'nanobind::python_error'" and a traceback. Now the import ends first."""
    import importlib
    import sys

    (tmp_path / "mid_import_module.py").write_text(SIGNALLED_MID_IMPORT)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mid_import_module", raising=False)
    with pytest.raises(ts.Terminated), term.building():
        module = importlib.import_module("mid_import_module")
        for _ in range(1000):  # the signal comes again, now outside the import
            time.sleep(0.01)
    assert module.whole and not term.interruptible


def test_a_sigterm_to_a_worker_already_leaving_is_only_noted(term):
    """The controller stops a run whose actor is still building: the actor reads the stop
    (it waits on a peer) as the controller's SIGTERM comes. Raised while the worker said bye
    and closed its sockets, it ended the process with a traceback and exit code 1."""
    with pytest.raises(ZeroDivisionError), term.building():
        1 / 0  # noqa: B018 -- the stop read: the build leaves with its own exception
    signal.raise_signal(signal.SIGTERM)  # on its way out: nothing raised
    assert term.at is not None


def test_a_sigterm_before_the_build_ends_it_as_it_begins(term):
    signal.raise_signal(signal.SIGTERM)  # while it connects: noted
    with pytest.raises(ts.Terminated), term.building():
        pytest.fail("the build began after a SIGTERM")


def test_in_its_loop_the_first_sigterm_is_told_and_its_stop_awaited(term):
    signal.raise_signal(signal.SIGTERM)  # noted, nothing raised inside the step it interrupts
    assert term.at is not None
    ctl = Channel()
    for _ in range(3):
        term.check(ctl, term.at + 1.0)
    assert ctl.sent == [cp.Signalled("SIGTERM")]  # said once
    with pytest.raises(ts.Terminated):  # no stop came in time: it leaves without one
        term.check(ctl, term.at + ts.TERM_WAIT_S + 1.0)


def test_a_second_sigterm_is_no_hurry(term):
    """A preempted Slurm job gets SIGTERM when it is picked and again when its grace time
    ends, at once where that time is 0: the second must not cut the stop it waits for."""
    signal.raise_signal(signal.SIGTERM)
    first = term.at
    signal.raise_signal(signal.SIGTERM)
    assert term.at == first


def test_no_signal_nothing_said(term):
    ctl = Channel()
    term.check(ctl, 1e9)
    assert ctl.sent == [] and term.at is None


class StoppingControl(Channel):
    """The worker end of the control channel, whose controller says stop (``message``) at once."""

    worker_id = "actor/0"

    def __init__(self, message: cp.Stop) -> None:
        super().__init__()
        self.message = message

    def heartbeat(self, stats) -> None:
        pass

    def stop_requested(self, wait_s: float = 0.0) -> bool:
        return True

    def leave_requested(self) -> bool:
        return self.message.leave

    def stopped_alone(self) -> bool:
        return self.message.alone

    def check_controller(self) -> None:
        pass


class Idle(Worker):
    def poll(self) -> int:
        return 0


@pytest.mark.parametrize(
    ("stop", "signalled", "code"),
    [
        (cp.Stop(alone=True), True, ts.EXIT_TERMINATED),  # to be started again
        (cp.Stop(), True, worker_process.EXIT_OK),  # the run's stop: nothing to start again
        (cp.Stop(), False, worker_process.EXIT_OK),
    ],
)
def test_a_signalled_worker_leaves_with_143_only_when_stopped_alone(stop, signalled, code):
    """A Docker engine's shutdown signals every container of a run: the workers waited for
    the run's stop, then left with 143, so the launcher started them again at once, and Docker
    did once the engine was back, with no run left (a minute each, then 60 s more per restart,
    waiting for a controller)."""
    term = ts.TermSignal()
    term.at = 0.0 if signalled else None
    limit = ("liveness.max_poll_s", 60.0)
    assert worker_process._loop(StoppingControl(stop), Idle("actor/0"), [], limit, term) == code


def test_the_controllers_own_sigterm_after_the_runs_stop_is_not_told(term, caplog):
    """The run stops as an actor's build ends: the controller, which took it for still
    building, sent it the stop, then SIGTERM. The signal came after the build and was told as
    someone else's: "SIGTERM, not from the controller" in the worker's log, and "was sent
    SIGTERM, not by its controller" in the controller's."""
    signal.raise_signal(signal.SIGTERM)
    ctl = StoppingControl(cp.Stop())
    limit = ("liveness.max_poll_s", 60.0)
    assert worker_process._loop(ctl, Idle("actor/0"), [], limit, term) == worker_process.EXIT_OK
    assert ctl.sent == [cp.Bye()]
    assert "not from the controller" not in caplog.text


class QuietControl(StoppingControl):
    """A controller that has said nothing (yet)."""

    def stop_requested(self, wait_s: float = 0.0) -> bool:
        return False


@pytest.mark.parametrize(
    ("ctl", "code", "bye"),
    [
        (StoppingControl(cp.Stop()), 0, cp.Bye()),  # the run's stop, to a worker building
        (StoppingControl(cp.Stop(alone=True)), ts.EXIT_TERMINATED, cp.Bye(signal="SIGTERM")),
        (StoppingControl(cp.Stop(leave=True)), ts.EXIT_TERMINATED, cp.Bye(signal="SIGTERM")),
        (QuietControl(cp.Stop()), ts.EXIT_TERMINATED, cp.Bye(signal="SIGTERM")),  # a `kill`
    ],
)
def test_a_worker_terminated_after_the_runs_stop_leaves_as_stopped(ctl, code, bye):
    """The controller sends SIGTERM to a worker still building when the run stops (it reads
    no stop until built): that worker leaves as stopped, with 0. A SIGTERM with no stop of the
    run is someone else's, as before: 143, and the controller is told."""
    assert ts.leave(ctl) == code
    assert ctl.sent == [bye]


@pytest.mark.parametrize("stopped", [True, False])
def test_a_stop_on_its_way_when_sigterm_came_is_waited_for(stopped, caplog, monkeypatch):
    """The controller sends a worker still building its stop, then SIGTERM at once: the
    signal came before the stop, and a run that failed at start said "SIGTERM, not from the
    controller: leaving" of its own evaluation actor. Here the stop comes over a real socket
    just after the worker began to leave; without one, the signal is someone else's. (The
    wait is made long where a stop comes, which ends it: a loaded machine cannot outlast it.)"""
    if stopped:
        monkeypatch.setattr(ts, "STOP_BEFORE_SIGNAL_S", 60.0)
    caplog.set_level(logging.INFO, logger=ts.__name__)
    server = ControlServer("tcp://127.0.0.1:*")
    ctl = ControlClient(server.address, "eval/0")
    later = None
    try:
        ctl.send(cp.Signalled("SIGTERM"))  # any message: the controller now knows the worker
        assert [w for w, _ in server.receive(timeout_ms=10_000)] == ["eval/0"]
        if stopped:
            later = threading.Timer(0.1, server.send, args=("eval/0", cp.Stop()))
            later.start()
        expected = worker_process.EXIT_OK if stopped else ts.EXIT_TERMINATED
        assert ts.leave(ctl) == expected
        assert ("not from the controller" in caplog.text) is not stopped
    finally:
        if later is not None:
            later.join()
        ctl.close()
        server.close()


def test_the_control_channel_tells_a_stop_alone_from_the_runs():
    ctl = ControlClient("tcp://127.0.0.1:1", "actor/0")
    try:
        ctl.inbox.append(cp.Stop())
        assert ctl.stop_requested() and not ctl.stopped_alone()
        ctl.inbox.append(cp.Stop(alone=True))
        assert ctl.stopped_alone()
    finally:
        ctl.close()


class LongStep(Worker):
    """A poll that is signalled as it starts and runs on for seconds (a trainer's step)."""

    in_poll = False

    def poll(self) -> int:
        LongStep.in_poll = True
        signal.raise_signal(signal.SIGTERM)
        time.sleep(2 * BUSY_AFTER_S + 0.5)
        LongStep.in_poll = False
        return 1


class TellingWhen(StoppingControl):
    """Records, for each Signalled sent, whether the poll was still running."""

    def __init__(self, message: cp.Stop) -> None:
        super().__init__(message)
        self.lock = threading.RLock()  # the busy heartbeat's thread takes it
        self.told_in_poll: list[bool] = []

    def send(self, message: cp.ControlMessage) -> None:
        if isinstance(message, cp.Signalled):
            self.told_in_poll.append(LongStep.in_poll)
        super().send(message)


def test_a_sigterm_in_a_long_poll_is_told_while_the_poll_runs(term):
    """The controller heard of the signal only once the poll had returned (seconds for a
    trainer's step on pixels), and its stop of the worker came that much later. The busy
    heartbeat's thread tells it now; the loop does not tell it twice."""
    ctl = TellingWhen(cp.Stop(alone=True))
    limit = ("liveness.max_poll_s", 60.0)
    code = worker_process._loop(ctl, LongStep("trainer/default/0"), [], limit, term)
    assert code == ts.EXIT_TERMINATED
    assert ctl.told_in_poll == [True]
