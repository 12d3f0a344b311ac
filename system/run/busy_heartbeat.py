"""A worker's liveness inside one long poll: heartbeats from a thread of its own, up to its
role's bound (``liveness``), and past it a hang reported to the controller.

The worker loop beats between polls (:mod:`system.run.worker_process`); a poll may run long for
good reasons (a trainer's step on pixels) or for bad ones (an environment whose step never
returns, a deadlock). This module tells the two apart by the role's bound. It also holds what
every heartbeat carries (the stage seconds, peak memory) and the file a cluster's liveness probe
reads.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import resource
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import zmq

from system.run import control_protocol as cp
from system.run.control_channel import BUSY_AFTER_S, HEARTBEAT_S, ControlClient

logger = logging.getLogger(__name__)


POLL = ("one poll has run", "this role's polls are that long")
BUILD = ("building it has taken", "it takes that long to build")
"""What ran too long (:func:`hang_message`): one poll of the worker's loop, or its build."""


def hang_message(
    setting: str, max_s: float, stack: traceback.StackSummary, what: tuple[str, str] = POLL
) -> str:
    """What a hung poll is reported as: the same for every hang at the same line, so that the
    controller tells a worker hanging there again and again from a new error. ``what``:
    :data:`POLL` or :data:`BUILD`."""
    message = (
        f"{what[0]} longer than {setting}={max_s:g}s: taken for hung and restarted "
        f"(raise {setting} if {what[1]})"
    )
    if not stack:
        return message
    at = next((f for f in reversed(stack) if not _in_stdlib(f.filename)), stack[-1])
    code = f": {at.line}" if at.line else ""
    return f"{message}; it is stuck at {at.filename}:{at.lineno} in {at.name}{code}"


_STDLIB = os.path.join(os.path.dirname(os.path.realpath(threading.__file__)), "")


def _in_stdlib(filename: str) -> bool:
    """A frame of Python's own library (``threading``'s wait): the line that called it, in
    the user's code, a package's or ours, says more about where a poll is stuck."""
    path = os.path.realpath(filename)
    packages = f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path
    return path.startswith(_STDLIB) and not packages


class BusyHeartbeat:
    """Heartbeats from a thread of its own while the worker is inside one long ``poll``.

    A trainer's step on pixels (a Nature-CNN update over thousands of frames) can take longer
    than the controller's heartbeat timeout on a loaded machine, and the worker loop beats only
    between polls: the controller took such a trainer for dead and restarted it. While a poll
    runs longer than :data:`BUSY_AFTER_S`, this thread sends the heartbeats instead, for at
    most ``max_poll``. They carry only what ``stats`` returns, the stage seconds (so the
    timings show a long step as the compute it is, not the wait before it); the controller
    keeps the worker's last other figures. A poll that
    runs longer is a hung worker (a stuck environment, a deadlock), which goes silent so that it
    is restarted, by the controller or by a liveness probe on ``on_beat``'s file. It says so
    once, naming the line the main thread is stuck on, and tells the controller as an error
    (with the main thread's stack): the controller restarts it at once instead of a heartbeat
    timeout later, shows the stack once however often it hangs there, and a run that gives up
    on it says where it hung instead of "went silent". The torch work of a step releases the
    GIL, so the thread runs while the main thread computes.
    """

    def __init__(
        self,
        ctl: ControlClient,
        max_poll: tuple[str, float],
        on_beat: Callable[[], None] | None = None,
        stats: Callable[[], dict[str, Any]] | None = None,
        what: tuple[str, str] = POLL,
    ):
        """``max_poll``: the setting that bounds one poll (named in the report) and its value
        in seconds (:meth:`api.config.LivenessConfig.bound`). ``stats``: what each heartbeat of
        this thread carries, called from it (so only what is safe to read from another thread:
        the worker's stage clocks, which are :class:`~system.timing.SharedStageClock`)."""
        self.ctl = ctl
        self.on_beat = on_beat
        self.stats = stats
        self.setting, self.max_s = max_poll
        self.what = what
        self.busy_since: float | None = None
        self.beats = 0
        """Heartbeats this thread sent (tests and the worker's stats read it)."""
        self.hung = False
        """The current (or last) poll outlasted ``max_poll``: no heartbeats until it returns."""
        self.reported = False
        """The hang reached the controller, which restarts the worker: a poll that returns
        after that must not carry on (the worker loop leaves)."""
        self._main = threading.get_ident()
        self._caller_depth: int | None = None
        """How deep in the main thread's stack the polls are made: the report of a hang
        shows the stack from there down (not the process's start-up frames)."""
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="busy-heartbeat", daemon=True)
        self._thread.start()

    def __enter__(self) -> BusyHeartbeat:
        if self._caller_depth is None:
            self._caller_depth = _depth(sys._getframe(1))
        self.hung = False
        self.busy_since = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self.busy_since = None

    @contextlib.contextmanager
    def unbounded(self) -> Iterator[BusyHeartbeat]:
        """Beat through one long call with no hang bound: a worker's stop, whose last save
        may take minutes and which the controller bounds itself
        (:data:`system.run.supervisor.SAVE_STOP_MAX_S`)."""
        bound, self.max_s = self.max_s, math.inf
        try:
            with self:
                yield self
        finally:
            self.max_s = bound

    @contextlib.contextmanager
    def building(self, bound: tuple[str, float]) -> Iterator[None]:
        """A part of a poll that builds (an environment made again after an error: minutes,
        for a simulator), bounded by ``bound`` (``liveness.max_build_s``) from its start. It
        was bounded by the poll's bound: the actor was taken for hung and restarted, to make
        every environment again. The rest of the poll gets the poll's bound afresh."""
        saved, in_poll = (self.setting, self.max_s, self.what), self.busy_since is not None
        self.setting, self.max_s = bound
        self.what, self.busy_since = BUILD, time.monotonic()
        try:
            yield
        finally:  # outside a poll (a build called between polls), it leaves none behind
            (self.setting, self.max_s, self.what) = saved
            self.busy_since = time.monotonic() if in_poll else None

    def _run(self) -> None:
        while not self._stopping.wait(HEARTBEAT_S):
            since = self.busy_since
            busy = 0.0 if since is None else time.monotonic() - since
            if busy > self.max_s:
                if not self.hung:
                    self.hung = True
                    self._report_hang(busy)
                continue
            if busy < BUSY_AFTER_S:
                continue
            try:
                self.ctl.heartbeat(self.stats() if self.stats is not None else {})
            except zmq.ZMQError:  # the socket is being closed: the worker is leaving
                return
            self.beats += 1
            if self.on_beat is not None:
                self.on_beat()

    def _report_hang(self, busy: float) -> None:
        frame = sys._current_frames().get(self._main)
        stack = traceback.extract_stack(frame) if frame is not None else traceback.StackSummary()
        stack = traceback.StackSummary.from_list(stack[max((self._caller_depth or 1) - 1, 0) :])
        where = "".join(stack.format()) or "(unknown)\n"
        message = hang_message(self.setting, self.max_s, stack, self.what)
        wid = self.ctl.worker_id
        # the controller shows it (once however often the worker hangs there): only the
        # worker's log gets it then, else the console too
        self.reported = self._tell_controller(cp.Error(message, where, cp.HUNG_POLL))
        level = logging.INFO if self.reported else logging.ERROR
        logger.log(level, "%s: %s (after %.0fs)", wid, message, busy)
        logger.info("%s: the hung poll's stack:\n%s", wid, where)

    def _tell_controller(self, error: cp.Error) -> bool:
        """Send ``error`` unless the main thread hung holding the socket (then the heartbeats
        that stopped tell the controller, a timeout later)."""
        if not self.ctl.lock.acquire(timeout=1.0):
            return False
        try:
            self.ctl.send(error)
            return True
        except zmq.ZMQError:  # the socket is being closed: the worker is leaving
            return False
        finally:
            self.ctl.lock.release()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=2.0)


@contextlib.contextmanager
def building(ctl: ControlClient, bound: tuple[str, float]) -> Iterator[BusyHeartbeat]:
    """Heartbeats while a worker builds what it runs, up to ``bound``
    (``liveness.max_build_s``). An environment that took two minutes to make (a simulator
    starting) left its worker silent past the controller's start grace: it was killed and
    restarted, to be killed again."""
    busy = BusyHeartbeat(ctl, bound, on_beat=mark_alive, what=BUILD)
    busy._caller_depth = _depth(sys._getframe(2))  # the stack of a hang: from the builder down
    try:
        with busy:
            yield busy
    finally:
        busy.stop()
    if busy.reported:  # the controller restarts it: a build that ends after all goes no further
        raise RuntimeError("its build, taken for hung, ended after all; leaving")


def _depth(frame: Any) -> int:
    """How many frames deep ``frame`` is in its thread's stack."""
    depth = 0
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    return depth


def stage_seconds(worker: Any) -> dict[str, float]:
    """The seconds of each stage since they were last taken: the worker loop's, and its
    threads' (``loader.``); also read by the busy-heartbeat thread during a long poll."""
    stats = worker.stages.take()
    for name, clock in worker.thread_stages().items():
        stats.update(clock.take(prefix=f"{name}."))
    return stats


def mark_alive() -> None:
    """Touch ``$TROUPE_HEARTBEAT_FILE``, when set, with every heartbeat: a cluster's liveness
    probe checks its age, so a worker whose loop hangs is restarted (distributed/deploy/k8s.py)."""
    path = os.environ.get("TROUPE_HEARTBEAT_FILE")
    if path:
        with open(path, "a"):
            os.utime(path)


def with_memory(stats: dict[str, Any]) -> dict[str, Any]:
    """Add this process's peak resident memory (MiB), for the run's per-role memory figures."""
    stats["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return stats
