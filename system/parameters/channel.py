"""The request side of a parameter client: one DEALER to the server, replies matched by ``id``.

A request whose reply does not come in time replaces the DEALER, so a lost or late reply can
never wedge the client (the trouble with REQ): the unanswered request is neither delivered late
nor answered into a later request's wait. ``hello`` (does this process share the server's shared
memory?) is asked without blocking and its answer handed to a callback whenever it arrives.

A wait for a reply is cut short when ``abandon`` says the service is known to be elsewhere (the
controller announced its restart at a new address): waiting out the timeout on a dead address
would hold a trainer's publish, and every version behind it, for seconds that buy nothing.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import zmq

from api.errors import OperationalError
from system.errors import PeerTimeoutError, WireError
from system.parameters.protocol import REMOTE_ERRORS, ms_left
from system.streams import transport, wire

logger = logging.getLogger(__name__)

ABANDON_CHECK_MS = 250
"""How often a wait for a reply asks ``abandon`` whether the service has moved."""


def owns_frames(endpoint: str | None) -> bool:
    """Frames received over this transport are this process's own memory (not the sender's,
    as inproc's are), so arrays onto them may be made writable instead of copied."""
    return endpoint is not None and endpoint.startswith(("tcp://", "ipc://"))


class RequestChannel:
    """Requests to the parameter server and their replies."""

    def __init__(
        self,
        endpoint: str,
        stats: Counter[str],
        bad: Callable[[Exception], None],
        on_hello: Callable[[wire.Message], None],
        *,
        copy_replies: bool,
        max_message_bytes: int | None = None,
        abandon: Callable[[], bool] | None = None,
    ):
        self.endpoint = endpoint
        self.abandon = abandon
        """Asked between slices of a wait: True ends it as a timeout (the service moved)."""
        self.moved = False
        """The last wait was given up because ``abandon`` said the service moved."""
        self.stats = stats
        self._bad = bad
        self._on_hello = on_hello
        self._copy = copy_replies
        self._max_bytes = max_message_bytes
        self._ids = itertools.count(1)
        self.hello_id: int | None = None
        """The id of the ``hello`` waiting for its answer, if one is."""
        self.socket = self._connect()

    @property
    def max_message_bytes(self) -> int | None:
        """The size bound of the sockets (the service's is the same, from the same layout)."""
        return self._max_bytes

    def _connect(self) -> zmq.Socket:
        dealer = transport.make_socket(zmq.DEALER, server=False, max_message_bytes=self._max_bytes)
        dealer.connect(self.endpoint)
        return dealer

    def request(self, kind: str, body: dict, timeout_s: float, deadline: float) -> dict:
        """Send a request and wait for its reply's body; a refusal raises the error it names."""
        return self.answer(self.send(kind, body, timeout_s), kind, timeout_s, deadline)

    def send(self, kind: str, body: dict, timeout_s: float, *, copy: bool = False) -> int:
        """Send a request without waiting; its id, for :meth:`answer`. ``copy``: ZeroMQ copies
        the arrays now (the caller may change them before the reply)."""
        request_id = next(self._ids)
        try:
            transport.send(
                self.socket, kind, {**body, "id": request_id}, flags=zmq.NOBLOCK, copy=copy
            )
        except zmq.Again:
            self.timed_out(kind, timeout_s)
        return request_id

    def answer(self, request_id: int, kind: str, timeout_s: float, deadline: float) -> dict:
        """Wait for the reply to a request sent; a refusal raises the error it names."""
        reply = self.await_reply(request_id, kind, timeout_s, deadline)
        if reply.kind == "error":
            error = REMOTE_ERRORS.get(reply.body.get("type"), OperationalError)
            raise error(str(reply.body.get("error")))
        return reply.body

    def send_hello(self) -> None:
        try:
            request_id = next(self._ids)
            transport.send(self.socket, "hello", {"id": request_id}, flags=zmq.NOBLOCK)
            self.hello_id = request_id
        except zmq.Again:
            self.hello_id = None  # sent again on the next occasion

    def await_reply(
        self, request_id: int, kind: str, timeout_s: float, deadline: float
    ) -> wire.Message:
        while True:
            try:
                got = self._recv(deadline)
            except WireError as e:
                self._bad(e)
                continue
            if got is None:
                self.timed_out(kind, timeout_s)
            reply = got[1]
            if isinstance(reply.body, dict) and reply.body.get("id") == request_id:
                return reply
            self._other_reply(reply)  # the answer to a request that timed out, or hello's

    def _recv(self, deadline: float) -> tuple[list[bytes], wire.Message] | None:
        """The next reply, or None at ``deadline`` or once ``abandon`` says to give up."""
        while True:
            left = ms_left(deadline)
            slice_ms = left if self.abandon is None else min(left, ABANDON_CHECK_MS)
            got = transport.recv(self.socket, timeout_ms=slice_ms, copy=self._copy, zero_copy=True)
            if got is not None or left <= slice_ms:
                return got
            if self.abandon is not None and self.abandon():
                self.moved = True
                return None

    def take_replies(self) -> None:
        """Without waiting: handle the hello reply if it came (anything else is stale)."""
        if self.hello_id is None:
            self.send_hello()
            return
        while True:
            try:
                got = transport.recv(self.socket, timeout_ms=0)
            except WireError as e:
                self._bad(e)
                continue
            if got is None:
                return
            self._other_reply(got[1])

    def _other_reply(self, reply: wire.Message) -> None:
        hello = self.hello_id
        if hello is not None and isinstance(reply.body, dict) and reply.body.get("id") == hello:
            self.hello_id = None
            self._on_hello(reply)
        else:
            self.stats["stale_replies"] += 1

    def timed_out(self, kind: str, timeout_s: float) -> None:
        """Replace the socket (forgetting the unanswered request) and raise PeerTimeoutError."""
        self.socket.close(linger=0)
        self.socket = self._connect()
        self.hello_id = None  # a pending hello was lost with the socket: asked again
        self.stats["timeouts"] += 1
        if self.moved:
            self.moved = False
            raise PeerTimeoutError(
                f"parameter service at {self.endpoint} was restarted elsewhere while '{kind}' "
                "waited for its answer; sent again at its new address"
            )
        raise PeerTimeoutError(
            f"parameter service at {self.endpoint} did not answer '{kind}' within "
            f"{timeout_s}s; is the parameter-service worker running?"
        )

    def close(self) -> None:
        self.socket.close(linger=0)


def hello_info(reply: wire.Message) -> Any:
    """The shared-memory info of a ``hello`` reply (None from a server that has none)."""
    return reply.body.get("shm") if reply.kind == "hello" else None  # an old server: error
