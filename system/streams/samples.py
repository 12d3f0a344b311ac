"""The sample stream: actors push trajectory segments, trainer workers pull them.

Back-pressure, not loss. The ZeroMQ backend is credit based: an actor's DEALER sends a chunk of
segments to a trainer's ROUTER, and may not send the next to that policy until a trainer acks one
(each trainer of the policy earns the actor one credit). A trainer acks a chunk when it takes it
from its socket, and takes chunks only while it is short of a batch. So when the trainers fall
behind, chunks wait in the producer's small outbox and the actor worker stops stepping while
``backlogged`` is true. Nothing is dropped.

Why credits rather than high-water marks alone: every chunk waiting between an actor and a trainer
is several trainer steps of policy lag (on-policy methods learn worse from stale samples), and
ZeroMQ's queues plus the kernel's TCP buffers on loopback hold many chunks before a send blocks.
Measured on cartpole-ppo with 32 environments an actor: a policy lag of 370 versions with the
trainer taking whatever had arrived, 31-35 with bounded queues, and credits bound it further.
"""

from __future__ import annotations

import abc
import collections
import logging
import time

import zmq

from api.errors import NamedArrayError
from api.policy import SampleBatch
from system.errors import WireError
from system.ratelimit import BadMessages
from system.streams import transport, wire
from system.streams.obs_slots import SlotReader, SlotWriter
from system.streams.validation import HEADROOM_BYTES, SegmentLayout

logger = logging.getLogger(__name__)

SLOW_ACK_S = 10.0
"""A chunk not acked for this long: the trainers are slower than the actors (many actors' chunks
wait for them). The actor keeps waiting for its credit, so it slows down to their pace, and
notes it (INFO, at most this often); the trainer warns, naming the fixes (``warn_policy_lag``)."""
LOST_ACK_S = 300.0
"""A chunk not acked for this long is taken for lost with a dropped connection, freeing its
credit. A trainer that died is not waited for this long: when the controller restarts it, the
actor reconnects at once (:meth:`ZmqSampleProducer.connect`, from the actor's peer watchdog),
forgetting what the old one never acked."""
ACK_MAX_BYTES = HEADROOM_BYTES
"""The largest message an actor's sample socket takes: an ack holds no arrays, only a slot number
and a yes or no, so the headroom every declared size has for header and scalars bounds it."""


class SampleProducer(abc.ABC):
    """The actor's side."""

    max_backlog = 1
    """Unsent chunks at which the actor stops stepping until a trainer takes one."""

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

    def wait(self, timeout_ms: int) -> bool:
        """Wait at most ``timeout_ms`` for a segment without taking it; False if none came.
        Lets the trainer tell the time it waits from the time it receives and decodes."""
        return True

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

    def wait(self, timeout_ms: int) -> bool:
        return bool(self.queue)

    def poll(self, timeout_ms: int, max_items: int) -> list[SampleBatch]:
        out = []
        while self.queue and len(out) < max_items:
            out.append(self.queue.popleft())
        return out


# --------------------------------------------------------------------- ZeroMQ backend
class ZmqSampleProducer(SampleProducer):
    """One DEALER socket per policy, connected to every trainer worker of that policy."""

    def __init__(
        self, endpoints: dict[str, list[str]], *, hwm: int = 4, slots: SlotWriter | None = None
    ):
        """``slots``: this actor's shared memory, for the observations of chunks going to
        trainers that said they can read it (see :mod:`system.streams.obs_slots`)."""
        self.hwm = hwm
        self.sockets: dict[str, zmq.Socket] = {}
        self.addresses: dict[str, list[str]] = {}
        self.credit: dict[str, int] = {}
        self.in_flight: dict[str, collections.deque[float]] = {}
        self.slots = slots
        self.shm: dict[str, int] = {}
        """Per policy: trainers that said they read our shared memory (-1: one said no)."""
        self.free_slots: dict[str, list[int]] = {}
        self.bad_messages = BadMessages(logger, "sample producer")
        self._next_slow_note = 0.0
        for policy, addresses in endpoints.items():
            self.connect(policy, addresses)
        self.outbox: collections.deque[tuple[str, SampleBatch]] = collections.deque()

    def connect(self, policy: str, addresses: list[str]) -> None:
        """(Re)connect the socket of ``policy`` to these trainer workers (after a restart).

        Chunks sent before are not waited for any more: their trainer may be gone.
        """
        old = self.sockets.pop(policy, None)
        if old is not None:
            old.close(linger=0)
        sock = transport.make_socket(
            zmq.DEALER, server=False, hwm=self.hwm, max_message_bytes=ACK_MAX_BYTES
        )
        for address in addresses:
            sock.connect(address)
        self.sockets[policy] = sock
        self.addresses[policy] = list(addresses)
        self.credit[policy] = max(1, len(addresses))
        self.in_flight[policy] = collections.deque()
        self.shm[policy] = 0
        # Chunks in flight, plus one. A slot is free again only when the ack of its own chunk
        # names it (a chunk given up as lost keeps its slot: its trainer may still read it).
        self.free_slots[policy] = list(range(self.credit[policy] + 1))

    def post(self, policy: str, segment: SampleBatch) -> None:
        self.outbox.append((policy, segment))
        self.flush()

    def flush(self, timeout_ms: int = 0) -> None:
        self._take_acks()
        while self.outbox:
            policy, segment = self.outbox[0]
            if not self._has_credit(policy):
                if not timeout_ms or not self.sockets[policy].poll(timeout_ms, zmq.POLLIN):
                    return
                self._take_acks()
                timeout_ms = 0
                continue
            body, slot = self._body(policy, segment)
            try:
                transport.send(self.sockets[policy], "samples", body, flags=zmq.NOBLOCK)
            except zmq.Again:  # no trainer connected yet
                if slot is not None:
                    self.free_slots[policy].append(slot)
                return
            self.in_flight[policy].append(time.monotonic())
            self.outbox.popleft()

    def _body(self, policy: str, segment: SampleBatch) -> tuple[dict, int | None]:
        """The message of a chunk, and the shared-memory slot its observations are in, if so:
        once every trainer of the policy said it reads our shared memory (else an offer)."""
        body: dict = {"segment": segment}
        if self.slots is None or not self.slots.wants(segment.obs) or self.shm[policy] < 0:
            return body, None
        if self.shm[policy] < len(self.addresses[policy]):
            body["shm_offer"] = self.slots.info
            return body, None
        free = self.free_slots[policy]
        if not free:
            return body, None
        slot = free.pop()
        desc = self.slots.put(f"samples/{policy}", self.credit[policy] + 1, slot, segment.obs)
        if desc is None:
            free.append(slot)
            return body, None
        segment = segment[:]  # shallow: the observations travel as the descriptor
        segment.obs = None
        return {"segment": segment, "shm_obs": desc}, slot

    def _has_credit(self, policy: str) -> bool:
        sent = self.in_flight[policy]
        if len(sent) < self.credit[policy]:
            return True
        now = time.monotonic()
        waited = now - sent[0]
        if waited > LOST_ACK_S:
            sent.popleft()
            logger.warning(
                "samples for policy '%s' not acked in %.0fs although no trainer of it was "
                "restarted: taken for lost with a dropped connection, and the next chunk goes",
                *(policy, waited),
            )
            return len(sent) < self.credit[policy]
        if waited > SLOW_ACK_S and now >= self._next_slow_note:
            self._next_slow_note = now + SLOW_ACK_S
            logger.info(
                "the trainers of policy '%s' have not taken this actor's samples for %.0fs: they "
                "are slower than the actors, which wait for them",
                *(policy, waited),
            )
        return False

    def _take_acks(self) -> None:
        for policy, sock in self.sockets.items():
            while True:
                try:
                    got = transport.recv(sock, timeout_ms=0)
                except WireError as e:
                    self.bad_messages.record(e)
                    continue
                if got is None:
                    break
                if got[1].kind != "samples_ack":
                    self.bad_messages.record(WireError(f"unexpected '{got[1].kind}'"))
                    continue
                self._shm_ack(policy, got[1].body if isinstance(got[1].body, dict) else {})
                if self.in_flight[policy]:
                    self.in_flight[policy].popleft()

    def _shm_ack(self, policy: str, body: dict) -> None:
        """What an ack says about shared memory: the answer to an offer, the slot now free."""
        answer, slot = body.get("shm"), body.get("slot")
        if answer is not None and self.shm[policy] >= 0:
            self.shm[policy] = self.shm[policy] + 1 if answer is True else -1
        free = self.free_slots[policy]
        if type(slot) is int and 0 <= slot <= self.credit[policy] and slot not in free:
            free.append(slot)

    @property
    def backlog(self) -> int:
        return len(self.outbox)

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close(linger=0)
        if self.slots is not None:
            self.slots.close()


class ZmqSampleConsumer(SampleConsumer):
    """A ROUTER socket; every actor's DEALER for this policy is a peer. Each chunk taken is
    acked to its sender, giving it the credit to send the next."""

    def __init__(
        self, bind: str = "tcp://127.0.0.1:*", *, hwm: int = 4, layout: SegmentLayout | None = None
    ):
        """``layout``: the segments this run's actors send; any other chunk is acked (its
        sender gets its credit back), dropped and counted, and the socket refuses messages
        larger than the largest legal chunk."""
        self.layout = layout
        limit = None if layout is None else layout.max_message_bytes
        self.socket = transport.make_socket(
            zmq.ROUTER, server=True, hwm=hwm, max_message_bytes=limit
        )
        self.socket.bind(bind)
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.bad_messages = BadMessages(logger, "sample consumer")
        self.slots = SlotReader()
        self.reused_slots = 0
        """Chunks dropped because their slot was written again before they were read."""

    def wait(self, timeout_ms: int) -> bool:
        return bool(self.socket.poll(timeout_ms, zmq.POLLIN))

    def poll(self, timeout_ms: int, max_items: int) -> list[SampleBatch]:
        out: list[SampleBatch] = []
        while len(out) < max_items:
            try:
                got = transport.recv(
                    self.socket, timeout_ms=timeout_ms if not out else 0, copy=True
                )
                if got is None:
                    break
                envelope, message = got
                segment = self._take(envelope, message)
                if segment is not None:
                    out.append(segment)
            except WireError as e:
                self.bad_messages.record(e)
        return out

    def _take(self, envelope: list[bytes], message: wire.Message) -> SampleBatch | None:
        """The chunk of a message, its observations copied out of the sender's slot first (then
        acked, which frees the slot); None if the slot was reused meanwhile."""
        body = message.body if isinstance(message.body, dict) else {}
        ack: dict = {}
        if "shm_offer" in body:
            ack["shm"] = self.slots.accepts(body["shm_offer"])
        obs = None
        try:
            if "shm_obs" in body:
                obs = self.slots.copy(body["shm_obs"])
                if obs is None:
                    self.reused_slots += 1
                    logger.warning("a sample chunk's slot was reused before it was read: dropped")
                ack["slot"] = body["shm_obs"].get("slot")
        finally:
            self._ack(envelope, ack)
        if "shm_obs" in body and obs is None:
            return None
        return _segment_from(message, self.layout, obs)

    def _ack(self, envelope: list[bytes], body: dict | None = None) -> None:
        """``body``: the answer to a shared-memory offer (``shm``), the slot read (``slot``)."""
        if envelope:
            transport.send(
                self.socket, "samples_ack", body or {}, envelope=envelope, flags=zmq.NOBLOCK
            )

    def close(self) -> None:
        self.socket.close(linger=0)


def _segment_from(message: wire.Message, layout: SegmentLayout | None, obs=None) -> SampleBatch:
    if message.kind != "samples" or not isinstance(message.body, dict):
        raise WireError(f"sample consumer expects 'samples' messages, got '{message.kind}'")
    try:
        fields = dict(message.body["segment"].items())
        if obs is not None:
            fields["obs"] = obs
        segment = SampleBatch(**fields)
        len(segment.reward)
    except (KeyError, TypeError, AttributeError, NamedArrayError) as e:
        raise WireError(f"malformed sample segment: {e}") from e
    if layout is not None:
        layout.check(segment)
    return segment
