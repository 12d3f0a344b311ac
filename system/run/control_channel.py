"""The control channel between the controller and its workers, and name resolution.

Every worker process has one DEALER socket (identity = its worker id) connected to the
controller's ROUTER. Over it the worker says hello, receives its configuration, registers the
endpoints it bound, looks up its peers' endpoints, sends heartbeats with stats, reports a failure
with its traceback, and receives ``stop``.

The messages are the dataclasses of :mod:`system.run.control_protocol`; the global state's
(``state_write``, the ``state`` of an ``ack``) are described in
:mod:`system.run.coordination.state`.

Every heartbeat is answered with ``ack``. A worker tells a slow controller from a dead one by
evidence that a starved machine does not fake: the controller's process ended (when it runs on
the same machine) or its connection closed and no new one came
(:class:`~system.run.connection_watch.ConnectionWatch`), both seen within seconds; silence
alone counts only after :data:`CONTROLLER_SILENCE_S` (a host lost without closing anything).
The parent process of a worker is not the controller (a forkserver, a container runtime, a
scheduler's agent), so none of this relies on it.
``moved`` tells a worker that looked ``name`` up that its owner was restarted at a new address.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any, TypeVar

import zmq

from system.errors import ControllerGoneError, PeerTimeoutError, WireError
from system.ratelimit import BadMessages
from system.run import control_protocol as cp
from system.run.connection_watch import ConnectionWatch
from system.run.coordination.state import StateReplica
from system.streams import transport

logger = logging.getLogger(__name__)
_M = TypeVar("_M", bound=cp.ControlMessage)

CONTROL_MAX_BYTES = 16 << 20
"""The largest control message either end accepts (ZeroMQ ``MAXMSGSIZE``): a configuration, a
heartbeat's stats or an error's traceback are kilobytes; 16 MiB leaves room for any of them."""


class StopRequested(Exception):
    """The controller said stop while this worker was still waiting to be set up."""


HEARTBEAT_S = 0.25
"""How often a worker sends a heartbeat (also while it waits for an answer)."""
BUSY_AFTER_S = 1.0
"""A poll running this long gets heartbeats from a thread of its own
(:class:`~system.run.busy_heartbeat.BusyHeartbeat`), for at most the role's ``liveness``
bound (:class:`api.config.LivenessConfig`)."""
CONTROLLER_SILENCE_S = 30.0
"""A worker whose heartbeats the controller has not answered for this long leaves. Silence is
the weakest evidence of a controller's death: one starved of CPU on a loaded machine (a load
average of 30) answers seconds late but answers, so the bound is the controller's own heartbeat
timeout for its workers. A controller that is really gone is seen within seconds by stronger
evidence first: its process ended (on this machine) or its connection closed
(:class:`~system.run.connection_watch.ConnectionWatch`)."""
HELLO_PATIENCE_S = 3600.0
"""How long a worker whose hello the controller answered waits for its configure, which the
controller holds back while it resolves the run's shape (up to ``liveness.max_build_s``, 900 s
by default): a configure that never came (lost with an old connection) ends the wait, as an
error its controller restarts the worker for."""


class ControlClient:
    """The worker's end of the control channel."""

    def __init__(
        self,
        controller: str,
        worker_id: str,
        *,
        timeout_s: float = 60.0,
        controller_pid: int | None = None,
        first_contact_s: float | None = None,
    ):
        self.worker_id = worker_id
        self.timeout_s = self.lookup_timeout_s = timeout_s
        """How long a wait for the controller lasts; a lookup of a peer, which may be making an
        environment slow to make, waits ``lookup_timeout_s`` (the worker sets it from
        ``liveness.max_build_s``)."""
        self.first_contact_s = timeout_s if first_contact_s is None else first_contact_s
        """How long the hello waits for a controller that has not answered yet (``troupe
        worker --controller-wait``): a cluster's controller may come minutes after its workers
        (an image pulled, a run folder's lock waited for), and one that is not restarted (a
        Slurm task) or counts each exit against its restarts (a Kubernetes Job) must not give
        up after the first minute."""
        self.created = time.monotonic()
        self.socket = transport.make_socket(
            zmq.DEALER, server=False, max_message_bytes=CONTROL_MAX_BYTES
        )
        self.socket.setsockopt(zmq.IDENTITY, worker_id.encode())
        self.controller = controller
        self.watch = ConnectionWatch(
            self.socket, worker_id, controller_pid, heard=lambda: self.heard, address=controller
        )
        self.socket.connect(controller)
        self.inbox: list[cp.ControlMessage] = []
        self.heard = False
        """Whether the controller ever answered (before that, it may still be starting)."""
        self.unanswered_since: float | None = None
        """When the oldest heartbeat the controller has not answered yet (nor said anything
        since) was sent; None while it answers."""
        self.bad_messages = BadMessages(logger, f"control channel of {worker_id}")
        self.refused: str | None = None
        """Why the controller refused this worker (one of its earlier process): every read
        after that raises, so a wait that takes the first for a peer's timeout goes no further."""
        self.looping = False
        """Set once the worker's loop runs: a stop then waits for the loop, which finishes the
        worker's work first (``on_stop``: a trainer's final checkpoint), so a wait here (a
        lookup of a restarted peer's new address) goes on instead of ending the process."""
        self.state = StateReplica(self.state_write)
        """This worker's copy of the run's global state, brought up to date by every ``ack``."""
        self.lock = threading.RLock()
        """Held around every use of the socket: a busy heartbeat's thread sends on it
        too (a ZeroMQ socket may change threads only across a full memory barrier)."""

    def send(self, message: cp.ControlMessage) -> None:
        with self.lock:
            cp.send(self.socket, message)

    def heartbeat(self, stats: dict[str, Any]) -> None:
        """Send stats; the controller's ``ack`` proves it is still there."""
        with self.lock:
            self.send(cp.Heartbeat(stats, self.state.revision))
            if self.unanswered_since is None:
                self.unanswered_since = time.monotonic()

    def controller_silent_s(self) -> float:
        """Seconds since the oldest heartbeat still unanswered was sent (0: all answered).

        Read the socket first (:meth:`stop_requested` does): the answers that came while this
        worker was busy count, so a long trainer step is not mistaken for a dead controller.
        """
        if self.unanswered_since is None:
            return 0.0
        return time.monotonic() - self.unanswered_since

    def check_controller(self) -> None:
        """Raise :class:`ControllerGoneError` once the controller has been silent too long."""
        silent = self.controller_silent_s()
        if silent > CONTROLLER_SILENCE_S:
            raise ControllerGoneError(
                f"{self.worker_id}: the controller answered no heartbeat for {silent:.1f}s; it "
                "is gone, so this worker exits (resume with `troupe run --resume RUN_DIR`)"
            )

    def moved(self, names: Iterable[str]) -> dict[str, str]:
        """Which of ``names`` moved since the last call, and their new addresses.

        Each watcher of a worker asks for its own names, so one does not swallow the notices
        another is waiting for (a trainer follows both the parameter service and its replay
        worker)."""
        wanted = set(names)
        moved: dict[str, str] = {}
        kept, unclaimed = [], {}
        for m in self.inbox:
            if not isinstance(m, cp.Moved):
                kept.append(m)
            elif m.name in wanted:
                moved[m.name] = m.address
            else:
                unclaimed[m.name] = m  # only the newest notice of a name matters
        self.inbox = kept + list(unclaimed.values())
        return moved

    def has_moved(self, names: Iterable[str]) -> bool:
        """Non-blocking, and leaving the notices for :meth:`moved`: has the controller said
        that one of ``names`` was restarted at a new address? (A wait on that peer can stop.)"""
        self.stop_requested()  # reads whatever has come
        wanted = set(names)
        return any(isinstance(m, cp.Moved) and m.name in wanted for m in self.inbox)

    def hello(self, role: str) -> cp.Configure:
        """Announce this worker and wait for its configuration, as long as the controller
        answers: it holds a configure back, with an ``ack``, while it resolves the run's shape
        (minutes, for an environment slow to make)."""
        self.send(cp.Hello(role, os.getpid()))
        give_up = time.monotonic() + HELLO_PATIENCE_S
        while True:
            try:
                configuration = self.wait_for(cp.Configure, timeout_s=self._hello_wait_s())
                break
            except ControllerGoneError:
                if self.heard or self.refused is not None or not self._first_contact_left():
                    raise
                logger.warning(
                    "%s: no controller has answered at %s in %.0fs; waiting up to %.0fs in all",
                    *(self.worker_id, self.controller, self._waited_s(), self.first_contact_s),
                )  # the hello is queued: a controller that comes gets it
            except PeerTimeoutError:  # it answers our heartbeats: its configure is coming
                if time.monotonic() > give_up:
                    raise
                logger.info("%s: waiting on for its configuration", self.worker_id)
        self.state.apply(configuration.global_state)  # a restarted worker: the current state
        return configuration

    def _hello_wait_s(self) -> float:
        """One round of the hello's wait: ``timeout_s``, or what is left of the first contact's
        wait while no controller has answered."""
        if self.heard:
            return self.timeout_s
        return max(0.1, min(self.timeout_s, self.first_contact_s - self._waited_s()))

    def _waited_s(self) -> float:
        return time.monotonic() - self.created

    def _first_contact_left(self) -> bool:
        """Whether a controller not heard yet may still come (a wait ends just past its
        time: a tenth of a second is none left)."""
        return self._waited_s() + 0.1 < self.first_contact_s

    def register(self, name: str, address: str) -> None:
        self.send(cp.Register(name, address))

    def lookup(self, name: str) -> str:
        """The address a peer registered under ``name`` (waits until it has registered)."""
        self.send(cp.Lookup(name))
        while True:
            try:
                message = self.wait_for(cp.LookupResult, self.lookup_timeout_s)
            except ControllerGoneError:
                raise
            except PeerTimeoutError as e:  # the controller answers: the peer never came up
                raise PeerTimeoutError(
                    f"{self.worker_id} waited {self.lookup_timeout_s:.0f}s for '{name}' to "
                    "register its address with the controller, which answers: that worker has "
                    "not come up (its log and `troupe ps` say why)"
                ) from e
            if message.name == name:
                return message.address

    def state_write(self, request: cp.StateWrite) -> cp.StateResult:
        """Send a write of the global state and wait for its answer."""
        self.send(request)
        while True:
            reply = self.wait_for(cp.StateResult)
            if reply.id == request.id:
                return reply

    def wait_for(self, kind: type[_M], timeout_s: float | None = None) -> _M:
        """The next message of ``kind``, within ``timeout_s`` (:attr:`timeout_s`). While
        waiting, heartbeats go out, so a controller that is gone is noticed
        (:meth:`check_controller`), not at the end of the timeout."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        next_beat = time.monotonic() + HEARTBEAT_S
        while time.monotonic() < deadline:
            for i, message in enumerate(self.inbox):
                if isinstance(message, kind):
                    return self.inbox.pop(i)  # type: ignore[return-value]
                if isinstance(message, cp.Stop) and not self.looping:  # the run ended meanwhile
                    raise StopRequested(f"{self.worker_id} was told to stop")
            self._receive(timeout_ms=100)
            if self.heard and time.monotonic() >= next_beat:
                next_beat = time.monotonic() + HEARTBEAT_S
                self.heartbeat({})
                self.check_controller()
        if not self.heard:  # nobody to report to: the worker says so in its own log
            raise ControllerGoneError(
                f"{self.worker_id}: no controller answered at {self.controller} in "
                f"{self._waited_s():.0f}s; is it running, is that address reachable from here, "
                "and do both use the same keys (TROUPE_CURVE_KEYS_FILE)?"
            )
        raise PeerTimeoutError(
            f"{self.worker_id} waited {timeout_s:.0f}s for '{kind.kind}' from the controller; "
            "is the controller running and reachable?"
        )

    def _receive(self, timeout_ms: int) -> bool:
        """Read one message, if one comes within ``timeout_ms``; False when none did."""
        if self.refused is not None:
            raise ControllerGoneError(f"{self.worker_id}: {self.refused}")
        with self.lock:
            try:
                got = transport.recv(self.socket, timeout_ms=timeout_ms)
            except WireError as e:
                self.bad_messages.record(e)
                return True
            if got is None:
                return False
            self.unanswered_since = None  # any message proves the controller is there
            self.heard = True
            try:
                message = cp.parse(got[1])
                if isinstance(message, cp.Refused):  # nothing it says is taken: leave
                    self.refused = message.reason
                    raise ControllerGoneError(f"{self.worker_id}: {message.reason}")
                if not isinstance(message, cp.Ack):
                    self.inbox.append(message)
                elif message.state is not None:
                    self.state.apply(message.state)
            except WireError as e:
                self.bad_messages.record(e)
            return True

    def stop_requested(self, wait_s: float = 0.0) -> bool:
        """Has the controller said stop? Reads everything that has come: a worker whose busy
        thread sent twenty heartbeats during one long poll has twenty acks queued before the
        stop (reading one message per check left a trainer with 5-second steps deaf to its
        stop, killed after the controller's wait). ``wait_s``: how long a stop not come yet
        is waited for (default: not at all)."""
        deadline = time.monotonic() + wait_s
        while True:
            while self._receive(timeout_ms=0):
                pass
            if any(isinstance(m, cp.Stop) for m in self.inbox):
                return True
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return False
            self._receive(timeout_ms=min(left_ms, 50))

    def leave_requested(self) -> bool:
        """Whether a stop that came says to leave without stopping (:class:`cp.Stop`)."""
        return any(isinstance(m, cp.Stop) and m.leave for m in self.inbox)

    def stopped_alone(self) -> bool:
        """Whether a stop that came is of this worker alone, not the run's (:class:`cp.Stop`)."""
        return any(isinstance(m, cp.Stop) and m.alone for m in self.inbox)

    def close(self) -> None:
        self.watch.stop()
        with self.lock:
            # Up to a second for the bye or error to go out, as the context's flush allows: on
            # a loaded machine 0.2 s could pass before the I/O thread ran, and it was lost.
            self.socket.close(linger=1000)
