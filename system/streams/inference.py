"""The inference stream: actors post batched rollout requests, policy workers answer them.

Two backends share one interface so that the very same actor and policy workers run either in
separate processes (ZeroMQ: actors' DEALER sockets to a policy worker's ROUTER) or wired together
in one process (in-process queues, used by ``test_pipeline`` and fast tests).

A request is addressed by ``(group, seq)``: the actor's environment group that asked and the
group's request counter, echoed back so the actor can match replies and ignore stale ones (a reply
to a request re-sent after a policy worker restart arrives twice, say).
"""

from __future__ import annotations

import abc
import collections
import logging
import time
from dataclasses import dataclass
from typing import Any

import zmq

from api.errors import NamedArrayError
from api.policy import RolloutRequest, RolloutResult
from system.errors import WireError
from system.ratelimit import BadMessages
from system.streams import transport, wire
from system.streams.obs_slots import SlotReader, SlotWriter
from system.streams.validation import RequestLayout

logger = logging.getLogger(__name__)

INFERENCE_SLOTS = 8
"""Slots of an actor's inference ring at first: one per environment group and policy."""
_MALFORMED = (WireError, KeyError, TypeError, AttributeError, ValueError, NamedArrayError)
"""What a reply no honest policy worker sends raises while it is read: counted and dropped."""


@dataclass
class InferenceReply:
    """One answered request, as the actor receives it."""

    policy: str
    group: int
    seq: int
    result: RolloutResult
    version: int


@dataclass
class PendingRequest:
    """One request as the policy worker holds it until it answers."""

    route: Any
    group: int
    seq: int
    request: RolloutRequest
    shm_answer: bool | None = None
    """The answer to the sender's shared-memory offer, sent back with the reply."""

    @property
    def rows(self) -> int:
        return len(self.request.on_reset)


class InferenceClient(abc.ABC):
    """The actor's side."""

    @abc.abstractmethod
    def post(self, policy: str, group: int, seq: int, request: RolloutRequest) -> None:
        """Send a request to a policy worker serving ``policy``."""

    @abc.abstractmethod
    def poll(self, timeout_ms: int) -> list[InferenceReply]:
        """Replies that arrived, waiting at most ``timeout_ms`` for the first one."""

    def wait(self, timeout_ms: int) -> bool:
        """Wait at most ``timeout_ms`` for a reply without taking it; False if none came. Lets
        the actor tell the time it waits from the time it decodes (its stage clock)."""
        return True

    def close(self) -> None:  # noqa: B027 - nothing to release for in-process clients
        """Release sockets."""


class InferenceServer(abc.ABC):
    """The policy worker's side."""

    @abc.abstractmethod
    def gather(self, max_rows: int, max_wait_ms: float) -> list[PendingRequest]:
        """Requests to answer in one batch: waits for a first one, then at most ``max_wait_ms``
        for more, returning early once ``max_rows`` rows are in."""

    def wait(self, timeout_ms: int) -> bool:
        """Wait at most ``timeout_ms`` for a request without taking it; False if none came.
        Lets the policy worker tell the time it waits from the time it forms a batch."""
        return True

    @abc.abstractmethod
    def reply(self, pending: PendingRequest, result: RolloutResult, version: int) -> None:
        """Send the answer of one request back to the actor that asked."""

    def close(self) -> None:  # noqa: B027
        """Release sockets."""


# --------------------------------------------------------------------- in-process backend
class InprocInferenceHub:
    """Queues connecting in-process inference clients and one server per policy."""

    def __init__(self) -> None:
        self.requests: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        self.replies: dict[str, collections.deque] = collections.defaultdict(collections.deque)

    def client(self, name: str) -> InprocInferenceClient:
        return InprocInferenceClient(self, name)

    def server(self, policy: str) -> InprocInferenceServer:
        return InprocInferenceServer(self, policy)


class InprocInferenceClient(InferenceClient):
    def __init__(self, hub: InprocInferenceHub, name: str):
        self.hub = hub
        self.name = name

    def post(self, policy: str, group: int, seq: int, request: RolloutRequest) -> None:
        self.hub.requests[policy].append(PendingRequest((self.name, policy), group, seq, request))

    def wait(self, timeout_ms: int) -> bool:
        return bool(self.hub.replies[self.name])

    def poll(self, timeout_ms: int) -> list[InferenceReply]:
        queue = self.hub.replies[self.name]
        out = list(queue)
        queue.clear()
        return out


class InprocInferenceServer(InferenceServer):
    def __init__(self, hub: InprocInferenceHub, policy: str):
        self.hub = hub
        self.policy = policy

    def wait(self, timeout_ms: int) -> bool:
        return bool(self.hub.requests[self.policy])

    def gather(self, max_rows: int, max_wait_ms: float) -> list[PendingRequest]:
        queue = self.hub.requests[self.policy]
        out, rows = [], 0
        while queue and rows < max_rows:
            pending = queue.popleft()
            out.append(pending)
            rows += pending.rows
        return out

    def reply(self, pending: PendingRequest, result: RolloutResult, version: int) -> None:
        client, policy = pending.route
        self.hub.replies[client].append(
            InferenceReply(policy, pending.group, pending.seq, result, version)
        )


# --------------------------------------------------------------------- ZeroMQ backend
class ZmqInferenceServer(InferenceServer):
    """A ROUTER socket; each actor's DEALER is one peer."""

    def __init__(
        self,
        bind: str = "tcp://127.0.0.1:*",
        *,
        hwm: int = 10_000,
        layout: RequestLayout | None = None,
    ):
        """``layout``: the requests this run's actors send; any other request is dropped and
        counted, and the socket refuses messages larger than the largest of them."""
        self.layout = layout
        limit = None if layout is None else layout.max_message_bytes
        self.socket = transport.make_socket(
            zmq.ROUTER, server=True, hwm=hwm, max_message_bytes=limit
        )
        self.socket.bind(bind)
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.bad_messages = BadMessages(logger, "inference server")
        self.slots = SlotReader()

    def wait(self, timeout_ms: int) -> bool:
        return bool(self.socket.poll(timeout_ms, zmq.POLLIN))

    def gather(self, max_rows: int, max_wait_ms: float) -> list[PendingRequest]:
        out: list[PendingRequest] = []
        rows = 0
        first = self._recv(timeout_ms=50)
        if first is None:
            return out
        out.append(first)
        rows += first.rows
        deadline = time.perf_counter() + max_wait_ms / 1000.0
        while rows < max_rows:
            left_ms = (deadline - time.perf_counter()) * 1000.0
            pending = self._recv(timeout_ms=max(0, int(left_ms))) if left_ms > 0 else self._recv(0)
            if pending is None:
                break
            out.append(pending)
            rows += pending.rows
        return out

    def _recv(self, timeout_ms: int) -> PendingRequest | None:
        while True:
            try:
                got = transport.recv(self.socket, timeout_ms=timeout_ms)
                if got is None:
                    return None
                envelope, message = got
                return _pending_from(envelope, message, self.layout, self.slots)
            except WireError as e:
                self.bad_messages.record(e)
                timeout_ms = 0

    def reply(self, pending: PendingRequest, result: RolloutResult, version: int) -> None:
        body = {"group": pending.group, "seq": pending.seq, "result": result, "version": version}
        if pending.shm_answer is not None:
            body["shm"] = pending.shm_answer
        transport.send(self.socket, "rollout_result", body, envelope=pending.route)

    def close(self) -> None:
        self.socket.close(linger=0)


def _pending_from(
    envelope: list[bytes],
    message: wire.Message,
    layout: RequestLayout | None,
    slots: SlotReader | None = None,
) -> PendingRequest:
    body = message.body
    if message.kind != "rollout" or not isinstance(body, dict):
        raise WireError(f"inference server expects 'rollout' messages, got '{message.kind}'")
    answer = None
    if "shm_offer" in body:
        answer = slots is not None and slots.accepts(body["shm_offer"])
    try:
        request = body["request"]
        group, seq = int(body["group"]), int(body["seq"])
        fields = dict(request.items())
        if "shm_obs" in body:  # the observations are in the actor's shared memory
            if slots is None:
                raise WireError("observations in shared memory, which this server does not read")
            fields["obs"] = slots.view(body["shm_obs"])
        request = RolloutRequest(**fields)
        len(request.on_reset)
    except (KeyError, TypeError, AttributeError, ValueError, NamedArrayError) as e:
        raise WireError(f"malformed rollout request: {e}") from e
    if layout is not None:
        layout.check(request)
    return PendingRequest(envelope, group, seq, request, answer)


class ZmqInferenceClient(InferenceClient):
    """One DEALER socket per policy, connected to one of that policy's workers.

    Its sockets have no ``MAXMSGSIZE``: a reply is laid out as the policy's outputs and state,
    known only to a process that builds the policy, which an actor does not (it never imports
    torch). Only the policy worker it connected to can send to it."""

    def __init__(self, endpoints: dict[str, str], *, slots: SlotWriter | None = None):
        """``slots``: this actor's shared memory; observations go through it to a policy worker
        that said it can read it (see :mod:`system.streams.obs_slots`)."""
        self.sockets: dict[str, zmq.Socket] = {}
        self.poller = zmq.Poller()
        self.bad_messages = BadMessages(logger, "inference client")
        self.slots = slots
        self.shm: dict[str, bool | None] = {}
        """Per policy: whether its worker reads our shared memory (None: not answered yet)."""
        self._slot_of: dict[tuple[str, int], int] = {}
        for policy, endpoint in endpoints.items():
            self.connect(policy, endpoint)

    def connect(self, policy: str, endpoint: str) -> None:
        """(Re)connect the socket of ``policy`` to ``endpoint`` (after a policy worker moved)."""
        old = self.sockets.pop(policy, None)
        if old is not None:
            self.poller.unregister(old)
            old.close(linger=0)
        sock = transport.make_socket(zmq.DEALER, server=False, hwm=10_000)
        sock.connect(endpoint)
        self.sockets[policy] = sock
        self.poller.register(sock, zmq.POLLIN)
        self.shm[policy] = None  # ask the (maybe new) worker again

    def post(self, policy: str, group: int, seq: int, request: RolloutRequest) -> None:
        body: dict[str, Any] = {"group": group, "seq": seq, "request": request}
        if self.slots is not None and self.slots.wants(request.obs):
            if self.shm.get(policy):
                self._through_slot(body, policy, group, request)
            elif self.shm.get(policy) is None:
                body["shm_offer"] = self.slots.info
        transport.send(self.sockets[policy], "rollout", body)

    def _through_slot(self, body: dict, policy: str, group: int, request: RolloutRequest) -> None:
        """Put the observations in this group's slot; the message names it instead. The slot is
        rewritten only by this group's next request, which waits for this one's reply."""
        slot = self._slot_of.setdefault((policy, group), len(self._slot_of))
        desc = self.slots.put("inference", max(INFERENCE_SLOTS, slot + 1), slot, request.obs)
        if desc is None:
            return
        request = request[:]  # shallow: the caller's request keeps its observations
        request.obs = None
        body["request"], body["shm_obs"] = request, desc

    def wait(self, timeout_ms: int) -> bool:
        return bool(self.poller.poll(timeout_ms))

    def poll(self, timeout_ms: int) -> list[InferenceReply]:
        out: list[InferenceReply] = []
        ready = dict(self.poller.poll(timeout_ms))
        for policy, sock in self.sockets.items():
            if sock not in ready:
                continue
            while True:
                reply = self._recv(policy, sock)
                if reply is None:
                    break
                out.append(reply)
        return out

    def _recv(self, policy: str, sock: zmq.Socket) -> InferenceReply | None:
        while True:
            try:
                got = transport.recv(sock, timeout_ms=0)
                if got is None:
                    return None
                _, message = got
                body = message.body
                if message.kind != "rollout_result":
                    raise WireError(f"expected 'rollout_result', got '{message.kind}'")
                result = RolloutResult(**dict(body["result"].items()))
                if "shm" in body and self.shm.get(policy) is None:
                    self.shm[policy] = bool(body["shm"])
                return InferenceReply(
                    policy, int(body["group"]), int(body["seq"]), result, int(body["version"])
                )
            except _MALFORMED as e:
                self.bad_messages.record(e)

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close(linger=0)
        self.sockets.clear()
        if self.slots is not None:
            self.slots.close()
