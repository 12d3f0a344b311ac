"""The sample stream: actors push trajectory segments, trainer workers pull them.

Back-pressure, not loss: the ZeroMQ backend is PUSH/PULL with bounded high-water marks. When the
trainers fall behind, sends stop succeeding, segments wait in the producer's small outbox, and the
actor worker stops stepping while ``backlogged`` is true. Nothing is dropped.
"""

from __future__ import annotations

import abc
import collections
import logging

import zmq

from api.errors import NamedArrayError, WireError
from api.policy import SampleBatch
from system import wire
from system.ratelimit import BadMessages

logger = logging.getLogger(__name__)


class SampleProducer(abc.ABC):
    """The actor's side."""

    max_backlog = 8

    @abc.abstractmethod
    def post(self, policy: str, segment: SampleBatch) -> None:
        """Queue one ``[T, ...]`` segment for the trainers of ``policy``."""

    def flush(self, timeout_ms: int = 0) -> None:  # noqa: B027 - in-process: never a backlog
        """Try again to send what back-pressure held back, waiting up to ``timeout_ms`` for the
        trainers to make room (so a held-back actor sleeps instead of spinning)."""

    @property
    def backlog(self) -> int:
        return 0

    @property
    def backlogged(self) -> bool:
        return self.backlog >= self.max_backlog

    def close(self) -> None:  # noqa: B027
        """Release sockets."""


class SampleConsumer(abc.ABC):
    """The trainer worker's side."""

    @abc.abstractmethod
    def poll(self, timeout_ms: int, max_items: int) -> list[SampleBatch]:
        """Segments that arrived, waiting at most ``timeout_ms`` for the first."""

    def close(self) -> None:  # noqa: B027
        """Release sockets."""


# --------------------------------------------------------------------- in-process backend
class InprocSampleHub:
    def __init__(self) -> None:
        self.queues: dict[str, collections.deque] = collections.defaultdict(collections.deque)

    def producer(self) -> InprocSampleProducer:
        return InprocSampleProducer(self)

    def consumer(self, policy: str) -> InprocSampleConsumer:
        return InprocSampleConsumer(self, policy)


class InprocSampleProducer(SampleProducer):
    def __init__(self, hub: InprocSampleHub):
        self.hub = hub

    def post(self, policy: str, segment: SampleBatch) -> None:
        self.hub.queues[policy].append(segment)


class InprocSampleConsumer(SampleConsumer):
    def __init__(self, hub: InprocSampleHub, policy: str):
        self.queue = hub.queues[policy]

    def poll(self, timeout_ms: int, max_items: int) -> list[SampleBatch]:
        out = []
        while self.queue and len(out) < max_items:
            out.append(self.queue.popleft())
        return out


# --------------------------------------------------------------------- ZeroMQ backend
class ZmqSampleProducer(SampleProducer):
    """One PUSH socket per policy, connected to every trainer worker of that policy."""

    def __init__(self, endpoints: dict[str, list[str]], *, hwm: int = 4):
        self.hwm = hwm
        self.sockets: dict[str, zmq.Socket] = {}
        for policy, addresses in endpoints.items():
            self.connect(policy, addresses)
        self.outbox: collections.deque[tuple[str, SampleBatch]] = collections.deque()

    def connect(self, policy: str, addresses: list[str]) -> None:
        """(Re)connect the socket of ``policy`` to these trainer workers (after a restart)."""
        old = self.sockets.pop(policy, None)
        if old is not None:
            old.close(linger=0)
        sock = wire.make_socket(zmq.PUSH, server=False, hwm=self.hwm)
        for address in addresses:
            sock.connect(address)
        self.sockets[policy] = sock

    def post(self, policy: str, segment: SampleBatch) -> None:
        self.outbox.append((policy, segment))
        self.flush()

    def flush(self, timeout_ms: int = 0) -> None:
        while self.outbox:
            policy, segment = self.outbox[0]
            sock = self.sockets[policy]
            if timeout_ms and not sock.poll(timeout_ms, zmq.POLLOUT):
                return
            try:
                wire.send(self.sockets[policy], "samples", {"segment": segment}, flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            self.outbox.popleft()

    @property
    def backlog(self) -> int:
        return len(self.outbox)

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close(linger=0)


class ZmqSampleConsumer(SampleConsumer):
    """A PULL socket; every actor's PUSH for this policy is a peer."""

    def __init__(self, bind: str = "tcp://127.0.0.1:*", *, hwm: int = 4):
        self.socket = wire.make_socket(zmq.PULL, server=True, hwm=hwm)
        self.socket.bind(bind)
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.bad_messages = BadMessages(logger, "sample consumer")

    def poll(self, timeout_ms: int, max_items: int) -> list[SampleBatch]:
        out: list[SampleBatch] = []
        while len(out) < max_items:
            try:
                got = wire.recv(self.socket, timeout_ms=timeout_ms if not out else 0, copy=True)
                if got is None:
                    break
                out.append(_segment_from(got[1]))
            except WireError as e:
                self.bad_messages.record(e)
        return out

    def close(self) -> None:
        self.socket.close(linger=0)


def _segment_from(message: wire.Message) -> SampleBatch:
    if message.kind != "samples" or not isinstance(message.body, dict):
        raise WireError(f"sample consumer expects 'samples' messages, got '{message.kind}'")
    try:
        segment = SampleBatch(**dict(message.body["segment"].items()))
        len(segment.reward)
    except (KeyError, TypeError, AttributeError, NamedArrayError) as e:
        raise WireError(f"malformed sample segment: {e}") from e
    return segment
