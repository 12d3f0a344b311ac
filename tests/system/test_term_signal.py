"""A worker's SIGTERM handler (system.run.term_signal), with real signals sent to this process:
in its loop the first one is noted and told to the controller, and the worker leaves without
its stop only when none came in time; before its loop it leaves at once."""

from __future__ import annotations

import signal

import pytest

from system.run import control_protocol as cp
from system.run import term_signal as ts


class Channel:
    def __init__(self) -> None:
        self.sent: list[cp.ControlMessage] = []

    def send(self, message: cp.ControlMessage) -> None:
        self.sent.append(message)


@pytest.fixture
def term():
    previous = signal.getsignal(signal.SIGTERM)
    handler = ts.TermSignal()
    handler.install()
    yield handler
    signal.signal(signal.SIGTERM, previous)


def test_before_its_loop_a_worker_leaves_at_once(term):
    with pytest.raises(ts.Terminated):
        signal.raise_signal(signal.SIGTERM)


def test_in_its_loop_the_first_sigterm_is_told_and_its_stop_awaited(term):
    term.in_loop = True
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
    term.in_loop = True
    signal.raise_signal(signal.SIGTERM)
    first = term.at
    signal.raise_signal(signal.SIGTERM)
    assert term.at == first


def test_no_signal_nothing_said(term):
    ctl = Channel()
    term.in_loop = True
    term.check(ctl, 1e9)
    assert ctl.sent == [] and term.at is None
