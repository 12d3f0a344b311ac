"""How a run answers signals, whoever sends them: a terminal's Ctrl+C, ``kill``, a supervisor,
a CI runner, systemd, a notebook's interrupt.

``troupe run`` (and ``troupe.train``) fork the process that runs the run (the controller, or
the process that runs its containers). That process gets a process group of its own, so a
terminal's Ctrl+C reaches the run one way only: through the launching process, which forwards every
SIGINT, SIGTERM or SIGHUP it receives as one SIGINT; if the launcher itself dies, the run
stops in order all the same. The first stops the run in order (the final
checkpoints are written; exit code :data:`EXIT_INTERRUPTED`); a second, while it stops (and
not within a quarter second of the first: one request delivered twice), abandons the stop: every
worker is killed at once (:data:`EXIT_ABANDONED`; resume from the last persisted version). A
signal sent to the launching process alone used to be swallowed there, and the run went on to
its wall-clock limit and exited 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from multiprocessing.process import BaseProcess

logger = logging.getLogger(__name__)

EXIT_DONE, EXIT_FAILED = 0, 1
EXIT_INTERRUPTED = 130
"""Stopped in order after a signal (128 + SIGINT): the run's last checkpoints are on disk."""
EXIT_ABANDONED = 131
"""Stopped at once by a second signal: workers killed, the last steps' work lost."""


def exit_code_of(summary: dict | None) -> int:
    """The exit code a run's controller gives for how it ended (``summary.json``): 1 when it
    failed, or when there is no summary (it was killed), 130 when it stopped in order on a
    signal, else 0."""
    if summary is None or summary.get("stop_reason") == "failed":
        return EXIT_FAILED
    if summary.get("stop_reason") == "interrupted":
        return EXIT_INTERRUPTED
    return EXIT_DONE


STOPS = (signal.SIGINT, signal.SIGTERM)
"""What stops a run in order (a second: at once)."""
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What the launcher forwards: an interrupt, a stop, a closed terminal."""
PARENT_POLL_S = 0.5


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9, ``signal 77`` for a number with no name here: how a worker that died
    of a signal is named (a process's exit code, or a container's 128 + the signal)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def forwards_signals() -> bool:
    """Whether a process started from here will have its signals forwarded: only the main
    thread can handle them; from another thread the child stays in this process group, where a
    terminal's Ctrl+C still reaches it directly."""
    return threading.current_thread() is threading.main_thread()


def own_process_group(yes: bool) -> None:
    """In the forked process (when ``yes``): leave the launcher's process group, and stop the
    run in order if the launcher dies (a closed terminal's SIGHUP, a SIGKILL, the OOM killer):
    no longer in the terminal's group, the run would otherwise go on without anyone to stop
    it."""
    if not yes:
        return
    os.setpgid(0, 0)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        logger.warning("the launching process is gone: stopping the run in order")
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def raise_interrupt(signum, frame) -> None:
    """SIGTERM handled as SIGINT is: stop the run in order."""
    raise KeyboardInterrupt()


DUPLICATE_S = 0.25
"""Signals this close together are one request (see :func:`run_interrupts`)."""


class Interrupts:
    """SIGINT and SIGTERM in the run's process (:func:`run_interrupts`), held back while it
    starts: until :meth:`arm`, a request is only noted. A KeyboardInterrupt raised in the
    controller's imports or before its loop (``troupe stop`` a second after ``troupe run``)
    left it as a second signal would (every worker killed, exit 131 or a traceback and exit
    1, no summary; with no config.json written, a folder that could be neither resumed nor
    reused)."""

    def __init__(self, defer: bool, scheduler: bool = False) -> None:
        self.deferred = defer
        self.scheduler = scheduler
        """A cluster run's controller: a SIGTERM after the first is the scheduler's, not an
        operator's second Ctrl+C (a preempted Slurm job gets SIGTERM at once, and again at its
        grace time's end), and does not abandon the stop in order."""
        self.pending = False
        self.last: float | None = None

    def handle(self, signum: int, frame) -> None:
        now = time.monotonic()
        if self.last is not None and now - self.last < DUPLICATE_S:
            return
        if self.last is not None and self.scheduler and signum == signal.SIGTERM:
            logger.warning("SIGTERM again: the run is already stopping in order")
            return
        self.last = now
        if self.deferred:
            self.pending = True
            return
        raise KeyboardInterrupt()

    @property
    def asked(self) -> bool:
        """Whether a stop was asked for already (a signal, or :meth:`request`)."""
        return self.last is not None

    def request(self) -> None:
        """A stop asked for otherwise than by a signal (a ``troupe stop`` that came before the
        controller could take one: :mod:`distributed.launch.stop_request`), while held back."""
        self.last = time.monotonic()
        self.pending = True

    def arm(self) -> bool:
        """From now on a request raises KeyboardInterrupt; whether one came before (the caller
        then stops the run in order, having started nothing)."""
        self.deferred = False
        return self.pending


def run_interrupts(defer: bool = False, scheduler: bool = False) -> Interrupts:
    """In the run's process: SIGINT and SIGTERM raise KeyboardInterrupt (the first stops the
    run in order, a second abandons it), but one that comes within :data:`DUPLICATE_S` of the
    last is the same request arriving twice: ``pkill -f "troupe run"`` signals the launcher,
    which forwards it, and this process too, forked from it with the same command line. Each
    used to count, and the run was abandoned (exit 131, no summary) instead of stopped.
    ``defer``: only note a request until :meth:`Interrupts.arm`; ``scheduler``: see
    :attr:`Interrupts.scheduler`."""
    interrupts = Interrupts(defer, scheduler)
    for s in STOPS:
        signal.signal(s, interrupts.handle)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)  # held since the fork (start_forked)
    return interrupts


def start_forked(process: BaseProcess) -> None:
    """Start ``process``, a fork of this one, with SIGINT and SIGTERM held back in it until
    :func:`run_interrupts` installs its handlers there: until then it has this process's, and a
    ``troupe stop`` as soon as launch.json names it was lost just after the fork, or raised
    KeyboardInterrupt in multiprocessing's bootstrap (exit 1, a traceback, no summary). Held
    signals wait, and are then noted."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


@contextlib.contextmanager
def forwarding(pid: int) -> Iterator[None]:
    """While the launcher waits for process ``pid``: each SIGINT or SIGTERM it gets is sent on
    to ``pid`` as one SIGINT (the first stops the run in order, a second abandons it)."""
    if not forwards_signals():
        yield
        return
    received = 0

    def forward(signum: int, frame) -> None:
        nonlocal received
        received += 1
        if received == 1:
            logger.warning("stopping the run in order (%s again stops it at once)",
                           signal.Signals(signum).name)  # fmt: skip
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            os.kill(pid, signal.SIGINT)

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
