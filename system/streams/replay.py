"""The replay stream: a trainer asks its policy's replay worker for transition batches.

Request/reply, one request in flight per trainer. A request carries the priorities of the batch
the trainer trained on last (keys and new priorities, or none), so priorities go back to the
buffer without a message of their own and before the next batch is drawn. The replay worker
answers when its rate limiter lets it sample; until then the request waits on its side, so a
trainer that is ahead of the actors simply waits for data.

Each batch carries the replay worker's count of the frames inserted so far (the policy's
training frames, kept with the buffer across restarts and resumes): the trainer hands it to its
policy's ``observe_frames``, so an exploration schedule counted in frames (a Q policy's epsilon,
SAC's warm-up) travels in the published parameters and a restarted policy worker, or a resumed
run, goes on with it instead of exploring from the start again.

Process mode: the replay worker binds a ROUTER, each trainer connects a DEALER. Serial mode: the
same calls on in-process queues (:class:`InprocReplayHub`).
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass

import numpy as np
import zmq

from api.errors import NamedArrayError
from api.replay import TransitionBatch
from system.errors import WireError
from system.ratelimit import BadMessages
from system.streams import transport, wire
from system.streams.validation import BatchLayout, PriorityLayout

logger = logging.getLogger(__name__)


@dataclass
class ReplayRequest:
    """A trainer's request for one batch, with the priorities of its last one."""

    client: bytes
    """Who asked (the ROUTER identity, or the trainer's id in one process)."""
    keys: np.ndarray | None = None
    """``[B]`` int64 buffer keys of the last batch (None: no priorities to update)."""
    priorities: np.ndarray | None = None
    """``[B]`` float new priorities, row for row ``keys``."""


# ------------------------------------------------------------------------------ in process
class InprocReplayHub:
    """Serial mode: the requests and replies of every policy's replay stream, as queues."""

    def __init__(self) -> None:
        self.requests: dict[str, collections.deque[ReplayRequest]] = collections.defaultdict(
            collections.deque
        )
        self.replies: dict[bytes, collections.deque[tuple[TransitionBatch, int]]] = (
            collections.defaultdict(collections.deque)
        )
        """Per client: each batch and the frames inserted when it was drawn."""

    def server(self, policy: str) -> InprocReplayServer:
        return InprocReplayServer(self, policy)

    def client(self, policy: str, client_id: str) -> InprocReplayClient:
        return InprocReplayClient(self, policy, client_id.encode())


class InprocReplayServer:
    def __init__(self, hub: InprocReplayHub, policy: str):
        self.hub, self.policy = hub, policy

    def poll(self, timeout_ms: int) -> list[ReplayRequest]:
        queue = self.hub.requests[self.policy]
        out = list(queue)
        queue.clear()
        return out

    def reply(self, client: bytes, batch: TransitionBatch, inserted_frames: int = 0) -> None:
        self.hub.replies[client].append((batch, int(inserted_frames)))

    def close(self) -> None:
        pass


class ReplayClient:
    """A trainer's end of the replay stream, ``depth`` requests in flight. The trainer asks
    for its next batch the moment it has trained on one (:meth:`request`, with that batch's new
    priorities), so the replay worker samples it while the trainer publishes its version; with
    ``depth`` 2 (sockets) one batch more is always on its way, so a step never waits for the
    round trip (its priorities then reach the buffer one batch later)."""

    depth = 1

    def __init__(self) -> None:
        self.in_flight = 0
        self.inserted_frames = 0
        """The replay worker's count of inserted frames as of the last batch taken."""
        self._keys: list[np.ndarray] = []
        self._priorities: list[np.ndarray] = []
        """Priorities not sent yet (every request was in flight when they came)."""

    def request(self, keys: np.ndarray | None = None, priorities: np.ndarray | None = None) -> None:
        """Hand back a batch's priorities and ask for the next batch; with ``depth`` requests
        already in flight they go with the next one."""
        if keys is not None and priorities is not None:
            self._keys.append(np.asarray(keys, dtype=np.int64).reshape(-1))
            self._priorities.append(np.asarray(priorities, dtype=np.float64).reshape(-1))
        while self.in_flight < self.depth:
            keys = priorities = None
            if self._keys:
                keys, priorities = np.concatenate(self._keys), np.concatenate(self._priorities)
                self._keys, self._priorities = [], []
            self._send(keys, priorities)
            self.in_flight += 1

    def take(self, timeout_ms: int) -> TransitionBatch | None:
        """The next batch asked for (asking first if nothing is in flight), or None if it has
        not come within ``timeout_ms``."""
        self.request()
        batch = self._receive(timeout_ms)
        if batch is not None:
            self.in_flight -= 1
        return batch

    def wait(self, timeout_ms: int) -> bool:
        """Ask for a batch if none is in flight, then wait at most ``timeout_ms`` for it
        without taking it; False if it has not come. Lets the trainer tell the time it waits
        for the replay worker from the time it decodes."""
        self.request()
        return self._ready(timeout_ms)

    def _ready(self, timeout_ms: int) -> bool:
        return True

    def _send(self, keys, priorities) -> None:
        raise NotImplementedError

    def _receive(self, timeout_ms: int) -> TransitionBatch | None:
        raise NotImplementedError

    def close(self) -> None:
        """Release the connection (nothing to release in one process)."""


class InprocReplayClient(ReplayClient):
    def __init__(self, hub: InprocReplayHub, policy: str, client: bytes):
        super().__init__()
        self.hub, self.policy, self.client = hub, policy, client

    def _send(self, keys, priorities) -> None:
        self.hub.requests[self.policy].append(ReplayRequest(self.client, keys, priorities))

    def _receive(self, timeout_ms: int) -> TransitionBatch | None:
        replies = self.hub.replies[self.client]
        if not replies:
            return None
        batch, self.inserted_frames = replies.popleft()
        return batch


# ------------------------------------------------------------------------------ sockets
class ZmqReplayServer:
    """The replay worker's ROUTER; every trainer of the policy is a peer."""

    def __init__(self, bind: str = "tcp://127.0.0.1:*", *, layout: PriorityLayout | None = None):
        """``layout``: the requests this run's trainers send; a request handing back more
        priorities than a batch holds is dropped and counted, and the socket refuses messages
        larger than the largest legal request."""
        self.layout = layout
        limit = None if layout is None else layout.max_message_bytes
        self.socket = transport.make_socket(
            zmq.ROUTER, server=True, hwm=16, max_message_bytes=limit
        )
        self.socket.bind(bind)
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.bad_messages = BadMessages(logger, "replay server")

    def poll(self, timeout_ms: int) -> list[ReplayRequest]:
        out: list[ReplayRequest] = []
        while True:
            try:
                got = transport.recv(
                    self.socket, timeout_ms=timeout_ms if not out else 0, copy=True
                )
                if got is None:
                    return out
                envelope, message = got
                out.append(_request_from(envelope, message, self.layout))
            except WireError as e:
                self.bad_messages.record(e)
            timeout_ms = 0

    def reply(self, client: bytes, batch: TransitionBatch, inserted_frames: int = 0) -> None:
        body = {"batch": batch, "inserted_frames": int(inserted_frames)}
        transport.send(self.socket, "replay_batch", body, envelope=[client])

    def close(self) -> None:
        self.socket.close(linger=0)


REQUEST_FIELDS = {"keys", "priorities"}
"""What a trainer's request holds (either None when it hands back no priorities)."""


def _request_from(
    envelope: list[bytes], message: wire.Message, layout: PriorityLayout | None = None
) -> ReplayRequest:
    body = message.body
    if message.kind != "replay_sample" or not isinstance(body, dict) or len(envelope) != 1:
        raise WireError(f"replay server expects 'replay_sample' requests, got '{message.kind}'")
    if set(body) != REQUEST_FIELDS:  # a stranger's dict is no request for a batch
        raise WireError(f"replay request has fields {sorted(body)}, not {sorted(REQUEST_FIELDS)}")
    keys, priorities = body.get("keys"), body.get("priorities")
    if (keys is None) != (priorities is None):
        raise WireError("replay request: keys and priorities come together or not at all")
    if keys is not None:
        if not isinstance(keys, np.ndarray) or not isinstance(priorities, np.ndarray):
            raise WireError("replay request: keys and priorities must be arrays")
        if keys.shape != priorities.shape or keys.ndim != 1 or keys.dtype.kind not in "iu":
            raise WireError("replay request: keys [B] ints and priorities [B], row for row")
        if priorities.dtype.kind != "f" or not np.all(np.isfinite(priorities)):
            raise WireError("replay request: priorities must be finite floats")
        if layout is not None:
            layout.check(keys)
    return ReplayRequest(envelope[0], keys, priorities)


class ZmqReplayClient(ReplayClient):
    """A trainer's DEALER to its policy's replay worker."""

    depth = 2

    def __init__(self, address: str, *, layout: BatchLayout | None = None):
        """``layout``: the batches this run's replay worker sends; the socket refuses messages
        larger than the largest of them."""
        super().__init__()
        self.max_message_bytes = None if layout is None else layout.max_message_bytes
        self.socket = self._connect(address)
        self.bad_messages = BadMessages(logger, "replay client")

    def _connect(self, address: str) -> zmq.Socket:
        socket = transport.make_socket(
            zmq.DEALER, server=False, hwm=16, max_message_bytes=self.max_message_bytes
        )
        socket.connect(address)
        return socket

    def reconnect(self, address: str) -> None:
        """Follow a restarted replay worker to its new address. The request in flight died
        with the old process, so a fresh one goes out; the priorities it carried are dropped
        (their keys named slots of the old buffer)."""
        self.socket.close(linger=0)
        self.socket = self._connect(address)
        self.in_flight = 0
        self._keys, self._priorities = [], []
        self.request()

    def _ready(self, timeout_ms: int) -> bool:
        return bool(self.socket.poll(timeout_ms, zmq.POLLIN))

    def _send(self, keys, priorities) -> None:
        transport.send(self.socket, "replay_sample", {"keys": keys, "priorities": priorities})

    def _receive(self, timeout_ms: int) -> TransitionBatch | None:
        try:
            got = transport.recv(self.socket, timeout_ms=timeout_ms, copy=True)
            if got is None:
                return None
            _, message = got
            if message.kind != "replay_batch" or not isinstance(message.body, dict):
                raise WireError(f"replay client expects 'replay_batch', got '{message.kind}'")
            batch = TransitionBatch(**dict(message.body["batch"].items()))
            len(batch.reward)
            inserted = message.body["inserted_frames"]
            if type(inserted) is not int or inserted < 0:
                raise WireError(f"replay batch: inserted_frames {inserted!r} is no count")
            self.inserted_frames = inserted
            return batch
        except (KeyError, TypeError, AttributeError, NamedArrayError) as e:
            self.bad_messages.record(WireError(f"malformed replay batch: {e}"))
        except WireError as e:
            self.bad_messages.record(e)
        return None

    def close(self) -> None:
        self.socket.close(linger=0)
