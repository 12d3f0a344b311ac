"""SIGTERM sent to a worker by someone else than its controller: ``kill PID``, ``docker stop``,
a node drain, a preempted Slurm job, ``kubectl delete``.

A worker used to leave at once. When the signal ended the whole job, the controller (signalled
too) stopped the run in order, but its savers had gone without their stop: the trainer's last
versions and state, a replay worker's buffer, were lost, and the run said its last checkpoint
may be missing. So a worker in its loop notes the first SIGTERM, tells its controller
(:class:`~system.run.control_protocol.Signalled`) and goes on working until the controller's
stop comes: the run's ordered stop, if the controller is stopping it, or else a stop of this
worker alone, after which the controller restarts it (or waits for its scheduler to). It leaves
without a stop when none came within :data:`TERM_WAIT_S`, or at once when the signal came while
it was being built (:meth:`TermSignal.building`: nothing of its work is at stake yet; inside an
import, once the import is done). A
second SIGTERM changes nothing: Slurm sends a preempted job one at once and another when its
grace time ends, which may be at once too; SIGKILL is there for a worker that must go now.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

from system.run import control_protocol as cp
from system.run.control_channel import ControlClient

logger = logging.getLogger(__name__)

EXIT_TERMINATED = 128 + signal.SIGTERM
"""A worker sent SIGTERM by someone else than its controller that leaves without a stop, or
with a stop of itself alone: 143, as a shell reports death by that signal. Not 0: a Kubernetes
Job counts exit 0 as the index done and would start no worker in its place. One stopped by the
run's own stop leaves with 0: nothing is to start it again."""
TERM_WAIT_S = 60.0
"""How long a signalled worker waits for its controller's stop. A stop in order reaches the
last role (the parameter service) after every other has stopped. A run's Swarm tasks and
Kubernetes pods get 120 s before their scheduler's SIGKILL (``docker_run.STOP_GRACE_S``); where
a scheduler's default holds (10 s for ``docker stop``, 30 s on Slurm) it usually ends the wait
first."""


STOP_BEFORE_SIGNAL_S = 1.0
"""How long a worker leaving on SIGTERM waits for a stop that may be on its way. The
controller sends a worker still building its stop, then SIGTERM at once: the signal came
first, and the worker said "SIGTERM, not from the controller" of its own controller's (in the
console of a run that failed at start). Someone else's signal costs the worker this much more."""

IMPORT_RETRY_S = 0.05
"""How soon a SIGTERM met in an import is raised again (:meth:`TermSignal._again_soon`)."""


def _importing(frame: FrameType | None) -> bool:
    """Whether the interrupted code runs inside an import (a module's body, or what a
    compiled module's initialisation calls back into)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


class Terminated(BaseException):
    """Leave now, on SIGTERM. A BaseException, as KeyboardInterrupt is: an ``except Exception``
    around a step (an environment's errors, a user's hook) must not take it for that code's
    failure and go on."""


class TermSignal:
    """A worker's SIGTERM handler, and what its loop does about a signal it noted."""

    def __init__(self) -> None:
        self.at: float | None = None
        """When the first SIGTERM came outside :meth:`building` (None: none)."""
        self.interruptible = False
        self._again: threading.Timer | None = None
        self._said = False
        self._telling = threading.Lock()  # the loop and a busy heartbeat's thread both tell

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.interruptible and not _importing(frame):
            raise Terminated()
        if self.at is None:  # a second is no hurry: a preempted Slurm job gets two at once
            self.at = time.monotonic()  # the loop tells the controller; no socket use here
        if self.interruptible:  # in an import: raised once it is done
            self._again_soon(signum)

    def _again_soon(self, signum: int) -> None:
        """The signal again in :data:`IMPORT_RETRY_S`, until the import it met is done. Raised
        inside a compiled module's import (``ale_py``'s, run by nanobind), :class:`Terminated`
        crossed C++ that may not throw: "terminate called after throwing an instance of
        'nanobind::python_error'", a Python traceback and an abort, from a worker the run's
        stop met while it imported its environment."""
        if self._again is not None and self._again.is_alive():
            return
        self._again = threading.Timer(IMPORT_RETRY_S, os.kill, (os.getpid(), signum))
        self._again.daemon = True
        self._again.start()

    @contextlib.contextmanager
    def building(self) -> Iterator[None]:
        """The stretch a SIGTERM ends at once (:class:`Terminated`): the hello and the build,
        where nothing of the worker's work is at stake yet, and which may block for minutes (a
        simulator slow to make). Anywhere else it is only noted: the loop tells the controller,
        and a worker already leaving (it read the run's stop while building, as the controller
        sent it SIGTERM) leaves as it was; raised there, it ended the process with a traceback
        and exit code 1. One noted before this stretch ends it as it begins. One that meets an
        import waits for the import's end (:meth:`_again_soon`)."""
        if self.at is not None:
            raise Terminated()
        self.interruptible = True
        try:
            yield
        finally:
            self.interruptible = False

    def check(self, ctl: ControlClient, now: float) -> None:
        """Between polls: tell the controller once; :class:`Terminated` when no stop came
        within :data:`TERM_WAIT_S`. A SIGTERM that follows the run's stop is the controller's
        own: sent to a worker it took for still building, whose build ended as the signal came.
        Told, it read as someone else's (a warning on both ends); the loop stops next."""
        if self.at is None:
            return
        if not self._said and _stopped_by_the_run(ctl):
            return
        if not self.tell(ctl) and now - self.at > TERM_WAIT_S:
            logger.warning("no stop from the controller %.0fs after SIGTERM", now - self.at)
            raise Terminated()

    def on_beat(self, ctl: ControlClient, mark: Callable[[], None]) -> Callable[[], None]:
        """What a long poll's heartbeat thread does with each beat: ``mark`` (the liveness
        file), then :meth:`tell` of a SIGTERM noted."""

        def beat() -> None:
            mark()
            self.tell(ctl)

        return beat

    def tell(self, ctl: ControlClient) -> bool:
        """Tell the controller of a SIGTERM noted, once; whether this call told it. Called
        between polls, and by the heartbeat thread of a long poll (a trainer's step of
        seconds): the controller heard of the signal only once the poll had returned, and its
        stop of the worker came that much later."""
        if self.at is None:
            return False
        with self._telling:
            if self._said:
                return False
            self._said = True
        logger.warning("SIGTERM, not from the controller: leaving once it stops this worker")
        ctl.send(cp.Signalled("SIGTERM"))
        return True


def leave(ctl: ControlClient) -> int:
    """How a worker leaves on :class:`Terminated`: the exit code, after its bye. Sent by the
    controller itself, after the run's stop, to a worker still building (which reads no message
    until it is built: minutes, for a simulator slow to make), it leaves as stopped, with 0;
    it was waited for, then killed, leaving what it had made behind. Otherwise the signal was
    someone else's: the controller restarts the worker, or waits for its scheduler to."""
    if _stopped_by_the_run(ctl, wait_s=STOP_BEFORE_SIGNAL_S):
        logger.info("stopped by the controller while being built")
        ctl.send(cp.Bye())
        return 0
    logger.warning("SIGTERM, not from the controller: leaving")
    ctl.send(cp.Bye(signal="SIGTERM"))
    return EXIT_TERMINATED


def _stopped_by_the_run(ctl: ControlClient, wait_s: float = 0.0) -> bool:
    """Whether the run's stop came (not a stop of this worker alone, nor one to leave);
    ``wait_s``: how long one not come yet is waited for."""
    try:
        stopped = ctl.stop_requested(wait_s)
    except Exception:  # the controller is gone or refused us: no stop of its to follow
        return False
    return stopped and not ctl.leave_requested() and not ctl.stopped_alone()
