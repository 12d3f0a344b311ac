"""The parameter client for a remote service: what trainers publish through and policy workers
poll, over sockets.

:class:`ParameterClient` is the publisher and subscriber interfaces of
:mod:`system.parameters.interfaces` on three parts, each in its own module: a
:class:`~system.parameters.channel.RequestChannel` (requests and replies), a
:class:`~system.parameters.subscription.PushSubscription` (pushes, when subscribed) and a
:class:`~system.parameters.shm_link.ShmLink` (the service's shared memory, on its host). Each
publish is encoded once, into a shared-memory file or onto the socket. A trainer's routine
versions go by :meth:`ParameterClient.publish_nowait`: sent, and answered at the next call.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from api.errors import UserError
from system.errors import PeerTimeoutError, SharedMemoryRefused, WireError
from system.parameters.channel import RequestChannel, hello_info, owns_frames
from system.parameters.interfaces import ParameterClientBase
from system.parameters.protocol import (
    DEFAULT_TIMEOUT_S,
    PUSH_HWM,
    Get,
    GetTrainerState,
    Publish,
    Tag,
    ms_left,
)
from system.parameters.shm_link import ShmLink
from system.parameters.store import LATEST, check_policy_name
from system.parameters.subscription import PushSubscription
from system.ratelimit import BadMessages
from system.streams import shm, wire
from system.streams.validation import TRAINER_STATE_VALUES

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Outstanding:
    """A publish sent without waiting for its answer (:meth:`ParameterClient.publish_nowait`)."""

    request_id: int
    layout: dict | None
    """Its shared-memory file, if it went through one."""
    timeout_s: float
    deadline: float


class ParameterClient(ParameterClientBase):
    """Talks to the service's ParameterServer: requests over a DEALER, pushes over a SUB.

    ``subscribe`` names the policies whose pushes :meth:`poll_latest` receives (needs
    ``push_endpoint``).

    ``writable=True``: received arrays are the client's own, writable, and writing them changes
    nothing anyone else sees (arrays onto a private copy-on-write mapping of a shared-memory
    version, or onto the received message; copies when the transport is inproc). With False
    they are read-only views (onto the shared mapping or the received frames).

    ``shm=True`` (default): use the service's shared memory when this process shares it (asked
    with ``hello``: a subscriber asks at once and switches topics when the answer comes, a
    publisher before its first publish), else the socket; a publisher sends versions with fewer
    than ``shm_min_bytes`` bytes of arrays over the socket all the same. ``shm=False``: always
    the socket.

    ``max_message_bytes``: ZeroMQ's ``MAXMSGSIZE`` on both sockets (the largest reply or push a
    peer may send; from the run's declared parameter layout), so that a foreign peer cannot make
    this process allocate more; None: no bound.

    ``abandon``: asked while a request waits for its reply; True gives the wait up as a timeout
    (the controller announced the service's restart elsewhere: the caller reconnects).
    """

    def __init__(
        self,
        request_endpoint: str,
        push_endpoint: str | None = None,
        subscribe: list[str] | tuple[str, ...] = (),
        *,
        writable: bool = True,
        push_hwm: int = PUSH_HWM,
        shm: bool = True,
        shm_min_bytes: int | None = None,
        max_message_bytes: int | None = None,
        abandon: Callable[[], bool] | None = None,
    ):
        super().__init__()
        self.request_endpoint = request_endpoint
        self.writable = writable
        self.stats: Counter[str] = Counter()
        self._bad_messages = BadMessages(logger, f"parameter client of {request_endpoint}")
        subscribed = {check_policy_name(p) for p in subscribe}
        if subscribed and push_endpoint is None:
            raise UserError("ParameterClient(subscribe=...) needs the server's push_endpoint")
        self._own_replies = owns_frames(request_endpoint)
        self.link = ShmLink(
            request_endpoint,
            wanted=shm,
            min_bytes=shm_min_bytes,
            stats=self.stats,
            bad=self._bad,
            on_switch=self._switch,
        )
        self.channel = RequestChannel(
            request_endpoint,
            self.stats,
            self._bad,
            lambda reply: self.link.on_hello(hello_info(reply)),
            copy_replies=writable and not self._own_replies,
            max_message_bytes=max_message_bytes,
            abandon=abandon,
        )
        self._outstanding: _Outstanding | None = None
        self.pushes: PushSubscription | None = None
        if subscribed:
            self.pushes = PushSubscription(
                push_endpoint,
                subscribed,
                hwm=push_hwm,
                writable=writable,
                own_frames=owns_frames(push_endpoint),
                stats=self.stats,
                bad=self._bad,
                max_message_bytes=max_message_bytes,
            )
            if not self.link.known:
                self.channel.send_hello()

    @property
    def shm_peer(self) -> shm.ShmPeer | None:
        """The service's shared memory, once ``hello`` found this process shares it."""
        return self.link.peer

    @property
    def shm_min_bytes(self) -> int:
        """Versions with fewer bytes of arrays than this go over the socket."""
        return self.link.min_bytes

    @shm_min_bytes.setter
    def shm_min_bytes(self, value: int) -> None:
        self.link.min_bytes = value

    # ------------------------------------------------------------------ publisher
    def publish(
        self, policy, version, params, *, persist=False, trainer_state=None,
        timeout_s=DEFAULT_TIMEOUT_S,
    ):  # fmt: skip
        self.settle()
        deadline = time.monotonic() + timeout_s
        state = trainer_state
        socket_request = Publish(policy, version, persist, params=params, trainer_state=state)
        self._check_size(socket_request)
        self._learn_shm(deadline, timeout_s)
        layout = self.link.write(policy, version, params, persist)
        if layout is not None:
            request = Publish(policy, version, persist, shm=layout, trainer_state=state)
            try:
                self.channel.request(request.kind, request.body(), timeout_s, deadline)
                self.link.published(layout)
                return
            except PeerTimeoutError:
                raise  # the service may have taken the file; else it removes it in time
            except SharedMemoryRefused as e:  # e.g. a restarted service: ask again, then give up
                self.link.discard(layout)
                self.link.failed(f"the parameter service refused a shared-memory file: {e}")
            except BaseException:
                self.link.discard(layout)
                raise
        request = socket_request
        self.channel.request(request.kind, request.body(), timeout_s, deadline)

    def publish_nowait(self, policy, version, params, *, timeout_s=DEFAULT_TIMEOUT_S):
        self.settle()
        deadline = time.monotonic() + timeout_s
        self._learn_shm(deadline, timeout_s)
        layout = self.link.write(policy, version, params, False)
        if layout is None:
            request = Publish(policy, version, False, params=params)
        else:
            request = Publish(policy, version, False, shm=layout)
        try:  # copied into ZeroMQ now: the trainer's next step may change the arrays
            request_id = self.channel.send(request.kind, request.body(), timeout_s, copy=True)
        except BaseException:
            if layout is not None:
                self.link.discard(layout)
            raise
        self._outstanding = _Outstanding(request_id, layout, timeout_s, deadline)

    def settle(self) -> None:
        """Take the answer to the publish sent without waiting; its deadline ran from when it
        was sent, so an answer that is already late is not waited for again. A shared-memory
        file the service could not take is given up (the version is lost, the next goes over
        the socket), as :meth:`publish` falls back; any other refusal (a version that does not
        fit the run's layout) is raised, as it would be over the socket."""
        pending, self._outstanding = self._outstanding, None
        if pending is None:
            return
        layout = pending.layout
        try:
            self.channel.answer(pending.request_id, "publish", pending.timeout_s, pending.deadline)
        except PeerTimeoutError:
            raise  # the service may have taken the file; else it removes it in time
        except SharedMemoryRefused as e:
            if layout is None:
                raise
            self.link.discard(layout)
            self.link.failed(f"the parameter service refused a shared-memory file: {e}")
            return
        except BaseException:
            if layout is not None:
                self.link.discard(layout)
            raise
        if layout is not None:
            self.link.published(layout)

    def _check_size(self, request: Publish) -> None:
        """A publish carrying a trainer's state over the service's size limit would be dropped
        by ZeroMQ without a word (and time out): refuse it here, saying why. Checked as if the
        parameters went over the socket (the bound a version and its trainer state have)."""
        limit = self.channel.max_message_bytes
        if request.trainer_state is None or limit is None:
            return
        size = sum(memoryview(f).nbytes for f in wire.encode(request.kind, request.body()))
        if size > limit:
            state = sum(memoryview(f).nbytes for f in wire.encode("s", request.trainer_state))
            raise UserError(
                f"version {request.version} of policy '{request.policy}' with its trainer's "
                f"state is {size / 2**20:.1f} MiB (the state alone {state / 2**20:.1f} MiB), "
                f"over the parameter service's limit of {limit / 2**20:.1f} MiB: a trainer may "
                f"keep {TRAINER_STATE_VALUES} values per parameter of the checkpoint; keep less "
                "(a smaller optimiser state) or put its own networks in the policy's checkpoint"
            )

    def trainer_state(self, policy, *, timeout_s=DEFAULT_TIMEOUT_S):
        self.settle()  # its answer comes first on the channel
        request = GetTrainerState(check_policy_name(policy))
        deadline = time.monotonic() + timeout_s
        body = self.channel.request(request.kind, request.body(), timeout_s, deadline)
        version, state = body.get("version"), body.get("state")
        if version is None:
            return None
        if type(version) is not int:
            raise WireError(f"'trainer_state' reply has no int 'version': {version!r}")
        return version, state

    def tag(self, policy, version, tag, *, timeout_s=DEFAULT_TIMEOUT_S):
        self.settle()  # its answer comes first on the channel
        request = Tag(policy, version, tag)
        self.channel.request(request.kind, request.body(), timeout_s, time.monotonic() + timeout_s)

    def get(self, policy, version=LATEST, *, timeout_s=DEFAULT_TIMEOUT_S):
        self.settle()  # its answer comes first on the channel
        request = Get(policy, version)
        deadline = time.monotonic() + timeout_s
        body = self.channel.request(request.kind, request.body(), timeout_s, deadline)
        number, params = body.get("version"), body.get("params")
        if type(number) is not int:
            raise WireError(f"'get' reply has no int 'version': {number!r}")
        if version == LATEST:
            self._hand_out(policy, number)
        if self.writable and self._own_replies:
            params = shm.make_writable(params)
        return number, params

    def _learn_shm(self, deadline: float, timeout_s: float) -> None:
        """Before a publish: know whether this process shares the service's shared memory."""
        if self.link.known:
            return
        if self.channel.hello_id is None:
            self.channel.send_hello()
            if self.channel.hello_id is None:
                self.channel.timed_out("publish", timeout_s)
        reply = self.channel.await_reply(self.channel.hello_id, "publish", timeout_s, deadline)
        self.channel.hello_id = None
        self.link.on_hello(hello_info(reply))

    # ------------------------------------------------------------------ subscriber
    def poll_latest(self, policy: str, *, timeout_s: float = 0.0) -> tuple[int, Any] | None:
        if self.pushes is None or policy not in self.pushes.policies:
            subscribed = sorted(self.pushes.policies) if self.pushes else []
            raise UserError(
                f"this ParameterClient is not subscribed to '{policy}'; "
                f"pass subscribe=[{policy!r}] (subscribed: {subscribed})"
            )
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.link.known:
                self.channel.take_replies()
            self.pushes.drain(self._is_new)
            newest = self.pushes.take(policy)
            if newest is not None and self._is_new(policy, newest[0]):
                version, params, in_shm = newest
                if in_shm:
                    params = self.link.map_notice(policy, version, params, self.writable)
                if params is not None:
                    self._hand_out(policy, version)
                    return version, params
            if time.monotonic() >= deadline or not self._wait(ms_left(deadline)):
                return None

    def _wait(self, timeout_ms: int) -> bool:
        """Wait for a push (or, while asking ``hello``, for its reply too)."""
        assert self.pushes is not None
        if self.channel.hello_id is None:
            return bool(self.pushes.socket.poll(timeout_ms))
        poller = zmq.Poller()
        poller.register(self.pushes.socket, zmq.POLLIN)
        poller.register(self.channel.socket, zmq.POLLIN)
        return bool(poller.poll(timeout_ms))

    def _switch(self, to_shm: bool) -> None:
        if self.pushes is not None:
            self.pushes.switch(to_shm=to_shm)

    # ------------------------------------------------------------------ both
    def _bad(self, error: Exception) -> None:
        self.stats["bad_messages"] += 1
        self._bad_messages.record(error)

    def close(self) -> None:
        self.channel.close()
        if self.pushes is not None:
            self.pushes.close()
        self.link.close()
