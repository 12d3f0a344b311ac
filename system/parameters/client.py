"""The parameter service's clients: what trainers publish through and policy workers poll.

This module holds :class:`ParameterClientBase`, the interface workers program against, and its
two implementations: :class:`ParameterClient`, which talks to a
:class:`~system.parameters.service.ParameterServer` over sockets (the protocol and the constants
both sides share are in :mod:`system.parameters.service`), and :class:`InprocParameterService`.

Replies are matched to requests by ``id``, and a client whose request timed out replaces its
DEALER socket, so a lost or late reply can never wedge it (the trouble with REQ).

Shared memory (:mod:`system.streams.shm`): when a client finds from ``hello`` that it shares the
service's shared-memory directory (same host, same ``/dev/shm``, same user), a publish of at
least :data:`SHM_MIN_BYTES` writes the arrays once into a file there and sends only its layout
(``shm``); the service maps the file as the stored version (no copy) and pushes the layout; a
subscriber maps the file privately and hands out arrays onto it (writable, copy-on-write: to
whoever calls ``poll_latest`` they are just its own arrays, as before). Such a client subscribes
to ``@<policy>`` instead of ``<policy>``. Any client that does not share it (another node,
another container) uses the socket exactly as before, and a client falls back to the socket
whenever shared memory fails (the service refuses a file, the directory is full, a notice
cannot be mapped three times in a row).

:class:`InprocParameterService` offers the same client interface on a store in this process, for
workers wired together in one process; parameters still go through the wire codec there, so a
policy sees exactly what it would see over a socket.
"""

from __future__ import annotations

import abc
import itertools
import logging
import os
import time
from collections import Counter
from typing import Any

import zmq

from api.errors import OperationalError, PeerTimeoutError, TroupeError, UserError, WireError
from system.parameters.service import PUSH_HWM, SHM_TOPIC, ms_left
from system.parameters.store import (
    LATEST,
    ParameterNotFoundError,
    ParameterStore,
    PolicyNameError,
    VersionError,
    check_policy_name,
)
from system.ratelimit import BadMessages
from system.streams import shm, wire

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
SHM_MIN_BYTES = 1 << 20
"""Versions whose arrays hold fewer bytes go over the socket even when shared memory is there:
below about a megabyte a file's system calls cost more than the copies they save. The
environment variable ``TROUPE_SHM_MIN_BYTES`` overrides it (0: every version)."""
SHM_FAILURES = 3
"""Consecutive notices a subscriber cannot map before it goes back to full pushes."""

# The only error types a reply may name; anything else becomes a plain OperationalError.
_REMOTE_ERRORS: dict[str, type[TroupeError]] = {
    cls.__name__: cls
    for cls in (VersionError, ParameterNotFoundError, PolicyNameError, UserError, WireError)
}


def _owns_frames(endpoint: str | None) -> bool:
    """Frames received over this transport are this process's own memory (not the sender's,
    as inproc's are), so arrays onto them may be made writable instead of copied."""
    return endpoint is not None and endpoint.startswith(("tcp://", "ipc://"))


class ParameterClientBase(abc.ABC):
    """What trainers and policy workers use, whether the service is remote or in this process."""

    def __init__(self) -> None:
        self._returned: dict[str, int] = {}  # newest version handed out per policy

    @abc.abstractmethod
    def publish(
        self,
        policy: str,
        version: int,
        params: Any,
        *,
        persist: bool = False,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Store ``version`` of ``policy`` (newer than the latest) and push it to subscribers."""

    @abc.abstractmethod
    def get(
        self, policy: str, version: int | str = LATEST, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> tuple[int, Any]:
        """``(version, params)`` for a version number or a tag (``"latest"``, ``"eval"``)."""

    @abc.abstractmethod
    def tag(
        self, policy: str, version: int, tag: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        """Point ``tag`` at ``version`` of ``policy``."""

    @abc.abstractmethod
    def poll_latest(self, policy: str, *, timeout_s: float = 0.0) -> tuple[int, Any] | None:
        """The newest version of ``policy`` not handed out yet, or None.

        Never returns a version <= one already returned (by this method or by ``get`` of
        ``"latest"``), so a policy worker never reloads an unchanged version. Waits up to
        ``timeout_s`` for one (default: does not block).
        """

    def close(self) -> None:
        """Release sockets, if any."""
        return None

    def _hand_out(self, policy: str, version: int) -> None:
        self._returned[policy] = max(version, self._returned.get(policy, -1))

    def _is_new(self, policy: str, version: int) -> bool:
        return version > self._returned.get(policy, -1)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ParameterClient(ParameterClientBase):
    """Talks to the service's ParameterServer: requests over a DEALER, pushes over a SUB.

    ``subscribe`` names the policies whose pushes :meth:`poll_latest` receives (needs
    ``push_endpoint``). A push sent before the subscription reached the server is lost (ZeroMQ's
    slow joiner), so a policy worker starts from ``get(policy)`` and then polls.

    ``writable=True``: received arrays are the client's own, writable, and writing them changes
    nothing anyone else sees (arrays onto a private copy-on-write mapping of a shared-memory
    version, or onto the received message; copies when the transport is inproc). With False
    they are read-only views (onto the shared mapping or the received frames).

    ``shm=True`` (default): use the service's shared memory when this process shares it (asked
    with ``hello``: a subscriber asks at once and switches topics when the answer comes, a
    publisher before its first publish), else the socket; a publisher sends versions with fewer
    than ``shm_min_bytes`` bytes of arrays (default :data:`SHM_MIN_BYTES`) over the socket all
    the same. ``shm=False``: always the socket.
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
    ):
        super().__init__()
        self.request_endpoint = request_endpoint
        self.writable = writable
        self.stats: Counter[str] = Counter()
        self._ids = itertools.count(1)
        self._bad_messages = BadMessages(logger, f"parameter client of {request_endpoint}")
        self._pending: dict[str, tuple[int, Any, bool]] = {}  # version, params or layout, shm?
        self._subscribed = {check_policy_name(p) for p in subscribe}
        if self._subscribed and push_endpoint is None:
            raise UserError("ParameterClient(subscribe=...) needs the server's push_endpoint")
        self._own_replies = _owns_frames(request_endpoint)
        self._own_pushes = _owns_frames(push_endpoint)
        self.shm_peer: shm.ShmPeer | None = None
        """The service's shared memory, once ``hello`` found this process shares it."""
        self._shm_wanted = shm
        self.shm_min_bytes = _min_bytes() if shm_min_bytes is None else shm_min_bytes
        self._shm_known = not shm  # True once hello was answered (or shared memory is off)
        self._hello_id: int | None = None
        self._shm_failures = 0
        self._dealer = self._new_dealer()
        self._sub: zmq.Socket | None = None
        self._poller: zmq.Poller | None = None
        self._topics: set[bytes] = set()  # subscribed topics
        self._retire: dict[bytes, bytes] = {}  # topic -> topic to drop once this one delivers
        self._received: dict[str, int] = {}  # newest version pushed per policy, either topic
        if self._subscribed:
            self._sub = wire.make_socket(zmq.SUB, server=False, hwm=push_hwm)
            for policy in sorted(self._subscribed):
                self._topic(policy.encode(), True)
            self._sub.connect(push_endpoint)
            if not self._shm_known:
                self._send_hello()

    def _new_dealer(self) -> zmq.Socket:
        dealer = wire.make_socket(zmq.DEALER, server=False)
        dealer.connect(self.request_endpoint)
        return dealer

    def publish(self, policy, version, params, *, persist=False, timeout_s=DEFAULT_TIMEOUT_S):
        deadline = time.monotonic() + timeout_s
        self._learn_shm(deadline, timeout_s)
        peer = self.shm_peer
        if peer is not None and _nameable(policy, version, persist):
            layout = self._write_shm(peer, policy, version, params)
            if layout is not None:
                body = {"policy": policy, "version": version, "shm": layout, "persist": persist}
                try:
                    self._request("publish", body, timeout_s, deadline)
                    self.stats["shm_publishes"] += 1
                    self._shm_failures = 0
                    peer.prepare(layout["size"])  # the next version's pages, while idle
                    return
                except PeerTimeoutError:
                    raise  # the service may have taken the file; else it removes it in time
                except WireError as e:  # e.g. a restarted service: ask again, then give up
                    peer.discard(layout)
                    self._shm_failed(f"the parameter service refused a shared-memory file: {e}")
                except BaseException:
                    peer.discard(layout)
                    raise
        body = {"policy": policy, "version": version, "params": params, "persist": persist}
        self._request("publish", body, timeout_s, deadline)

    def get(self, policy, version=LATEST, *, timeout_s=DEFAULT_TIMEOUT_S):
        body = self._request("get", {"policy": policy, "version": version}, timeout_s)
        number, params = body.get("version"), body.get("params")
        if type(number) is not int:
            raise WireError(f"'get' reply has no int 'version': {number!r}")
        if version == LATEST:
            self._hand_out(policy, number)
        if self.writable and self._own_replies:
            params = shm.make_writable(params)
        return number, params

    def tag(self, policy, version, tag, *, timeout_s=DEFAULT_TIMEOUT_S):
        self._request("tag", {"policy": policy, "version": version, "tag": tag}, timeout_s)

    def poll_latest(self, policy: str, *, timeout_s: float = 0.0) -> tuple[int, Any] | None:
        if policy not in self._subscribed:
            raise UserError(
                f"this ParameterClient is not subscribed to '{policy}'; "
                f"pass subscribe=[{policy!r}] (subscribed: {sorted(self._subscribed)})"
            )
        assert self._sub is not None
        deadline = time.monotonic() + timeout_s
        while True:
            if not self._shm_known:
                self._take_replies()
            self._drain_pushes()
            newest = self._pending.pop(policy, None)
            if newest is not None and self._is_new(policy, newest[0]):
                version, params, in_shm = newest
                if not in_shm or (params := self._map_notice(policy, version, params)) is not None:
                    self._hand_out(policy, version)
                    return version, params
            if time.monotonic() >= deadline or not self._wait(ms_left(deadline)):
                return None

    def close(self) -> None:
        self._dealer.close(linger=0)
        if self._sub is not None:
            self._sub.close(linger=0)
        if self.shm_peer is not None:
            self.shm_peer.close()

    # ------------------------------------------------------------------ shared memory
    def _send_hello(self) -> None:
        try:
            request_id = next(self._ids)
            wire.send(self._dealer, "hello", {"id": request_id}, flags=zmq.NOBLOCK)
            self._hello_id = request_id
        except zmq.Again:
            self._hello_id = None  # sent again on the next occasion

    def _on_hello(self, reply: wire.Message) -> None:
        self._hello_id = None
        self._shm_known = True
        info = reply.body.get("shm") if reply.kind == "hello" else None  # an old server: error
        peer = shm.peer_from_info(info) if self._shm_wanted else None
        if peer is None:
            logger.debug("parameters from %s come over the socket", self.request_endpoint)
            return
        logger.debug("parameters from %s come through %s", self.request_endpoint, peer.dir)
        self.shm_peer = peer
        self._resubscribe(to_shm=True)

    def _shm_failed(self, reason: str) -> None:
        """Shared memory failed: use the socket until ``hello`` is answered again; after
        SHM_FAILURES failures in a row, for good (a failure that would only repeat)."""
        self._shm_failures += 1
        self.stats["shm_failures"] += 1
        final = self._shm_failures >= SHM_FAILURES
        logger.warning(
            "parameter client of %s %s shared memory: %s",
            *(self.request_endpoint, "stops using" if final else "asks again about", reason),
        )
        self._shm_wanted = self._shm_wanted and not final
        self._shm_known = not self._shm_wanted
        if self.shm_peer is not None:
            self.shm_peer.close()
            self.shm_peer = None
            self._resubscribe(to_shm=False)

    def _resubscribe(self, *, to_shm: bool) -> None:
        # Subscribe to the new topic now, drop the old one only once the new one delivered:
        # until the server has the new subscription, pushes still come on the old topic. So no
        # version falls between; one may come twice, and the second is ignored.
        for policy in sorted(self._subscribed):
            plain, notices = policy.encode(), SHM_TOPIC + policy.encode()
            new, old = (notices, plain) if to_shm else (plain, notices)
            self._topic(new, True)
            self._retire.pop(old, None)
            self._retire[new] = old

    def _topic(self, topic: bytes, on: bool) -> None:
        if self._sub is not None and (topic in self._topics) != on:
            self._sub.setsockopt(zmq.SUBSCRIBE if on else zmq.UNSUBSCRIBE, topic)
            (self._topics.add if on else self._topics.discard)(topic)

    def _learn_shm(self, deadline: float, timeout_s: float) -> None:
        """Before a publish: know whether this process shares the service's shared memory."""
        if self._shm_known:
            return
        if self._hello_id is None:
            self._send_hello()
            if self._hello_id is None:
                self._timed_out("publish", timeout_s)
        self._on_hello(self._await(self._hello_id, "publish", timeout_s, deadline))

    def _write_shm(self, peer: shm.ShmPeer, policy: str, version: int, params: Any) -> dict | None:
        """The layout of ``params`` written to shared memory; None if they are too small to be
        worth it or cannot be written (then they go over the socket)."""
        frames = wire.encode("params", params)
        if sum(frame.nbytes for frame in frames[1:]) < self.shm_min_bytes:
            return None
        try:
            return peer.write_frames(policy, version, frames)
        except OSError as e:  # a full or vanished directory: this version goes by socket
            self.stats["shm_write_errors"] += 1
            logger.warning(
                "cannot write version %d of '%s' to %s (%s); it goes over the socket",
                *(version, policy, peer.dir, e),
            )
            return None

    def _map_notice(self, policy: str, version: int, layout: Any) -> Any | None:
        """The parameters of a shared-memory notice, or None (counted; after SHM_FAILURES in a
        row this client goes back to full pushes for good)."""
        if self.shm_peer is None:
            return None  # a notice still queued from before a fallback
        try:
            params = self.shm_peer.open(layout, policy, version, writable=self.writable)
        except FileNotFoundError:  # dropped by the service: a newer version is on its way
            self.stats["shm_missed"] += 1
            failed = f"the file of version {version} is gone"
        except (WireError, OSError) as e:
            self._bad(e)
            failed = str(e)
        else:
            self._shm_failures = 0
            self.stats["shm_pushes"] += 1
            return params
        if self._shm_failures + 1 >= SHM_FAILURES:
            self._shm_failed(f"{SHM_FAILURES} notices in a row could not be mapped ({failed})")
        else:
            self._shm_failures += 1
        return None

    # ------------------------------------------------------------------------------ internals
    def _wait(self, timeout_ms: int) -> bool:
        """Wait for a push (or, while asking ``hello``, for its reply too)."""
        if self._hello_id is None:
            return bool(self._sub.poll(timeout_ms))
        if self._poller is None:
            self._poller = zmq.Poller()
            self._poller.register(self._sub, zmq.POLLIN)
            self._poller.register(self._dealer, zmq.POLLIN)
        return bool(self._poller.poll(timeout_ms))

    def _take_replies(self) -> None:
        """Without waiting: handle the hello reply if it came (anything else is stale)."""
        if self._hello_id is None:
            self._send_hello()
            return
        while True:
            try:
                got = wire.recv(self._dealer, timeout_ms=0)
            except WireError as e:
                self._bad(e)
                continue
            if got is None:
                return
            self._other_reply(got[1])

    def _other_reply(self, reply: wire.Message) -> None:
        """A reply that is not the one being waited for: hello's, or a timed-out request's."""
        hello = self._hello_id
        if hello is not None and isinstance(reply.body, dict) and reply.body.get("id") == hello:
            self._on_hello(reply)
        else:
            self.stats["stale_replies"] += 1

    def _drain_pushes(self) -> None:
        """Receive every push waiting, keeping only the newest per policy."""
        copy = self.writable and not self._own_pushes
        while True:
            try:
                got = wire.recv(self._sub, timeout_ms=0, copy=copy, zero_copy=True)
            except WireError as e:
                self._bad(e)
                continue
            if got is None:
                return
            envelope, message = got
            body = message.body
            topic = envelope[0].decode(errors="replace") if envelope else ""
            local = topic.startswith(SHM_TOPIC.decode())  # its topic for shared-memory peers
            if envelope and topic.removeprefix(SHM_TOPIC.decode()) not in self._subscribed:
                # SUB filters by prefix: subscribing to "a" also brings "ab"'s pushes.
                self.stats["other_pushes"] += 1
                continue
            in_shm = local and isinstance(body, dict) and "shm" in body
            payload = "shm" if in_shm else "params"
            if (
                message.kind != "params"
                or not isinstance(body, dict)
                or type(body.get("version")) is not int
                or body.get("policy") not in self._subscribed
                or envelope != [(SHM_TOPIC if local else b"") + body["policy"].encode()]
                or payload not in body
            ):
                self._bad(WireError(f"unexpected push '{message.kind}' on topic {envelope}"))
                continue
            policy, version = body["policy"], body["version"]
            retired = self._retire.pop(envelope[0], None)
            if retired is not None:
                self._topic(retired, False)
            if version == self._received.get(policy):  # on both topics while switching
                self.stats["duplicate_pushes"] += 1
                continue
            self._received[policy] = max(version, self._received.get(policy, -1))
            self.stats["pushes"] += 1
            held = self._pending.get(policy)
            if self._is_new(policy, version) and (held is None or version > held[0]):
                payload = body[payload]
                if not in_shm and self.writable and not copy:
                    payload = shm.make_writable(payload)
                self._pending[policy] = (version, payload, in_shm)

    def _bad(self, error: Exception) -> None:
        self.stats["bad_messages"] += 1
        self._bad_messages.record(error)

    def _request(
        self, kind: str, body: dict, timeout_s: float, deadline: float | None = None
    ) -> dict:
        request_id = next(self._ids)
        deadline = time.monotonic() + timeout_s if deadline is None else deadline
        try:
            wire.send(self._dealer, kind, {**body, "id": request_id}, flags=zmq.NOBLOCK)
        except zmq.Again:
            self._timed_out(kind, timeout_s)
        reply = self._await(request_id, kind, timeout_s, deadline)
        if reply.kind == "error":
            error = _REMOTE_ERRORS.get(reply.body.get("type"), OperationalError)
            raise error(str(reply.body.get("error")))
        return reply.body

    def _await(self, request_id: int, kind: str, timeout_s: float, deadline: float) -> wire.Message:
        copy = self.writable and not self._own_replies
        while True:
            try:
                got = wire.recv(
                    self._dealer, timeout_ms=ms_left(deadline), copy=copy, zero_copy=True
                )
            except WireError as e:
                self._bad(e)
                continue
            if got is None:
                self._timed_out(kind, timeout_s)
            reply = got[1]
            if isinstance(reply.body, dict) and reply.body.get("id") == request_id:
                return reply
            self._other_reply(reply)  # the answer to a request that timed out, or hello's

    def _timed_out(self, kind: str, timeout_s: float) -> None:
        # A fresh socket forgets the unanswered request: it is neither delivered late nor
        # answered into a later request's wait.
        self._dealer.close(linger=0)
        self._dealer = self._new_dealer()
        self._poller = None
        self._hello_id = None  # a pending hello was lost with the socket: asked again
        self.stats["timeouts"] += 1
        raise PeerTimeoutError(
            f"parameter service at {self.request_endpoint} did not answer '{kind}' within "
            f"{timeout_s}s; is the parameter-service worker running?"
        )


def _min_bytes() -> int:
    value = os.environ.get("TROUPE_SHM_MIN_BYTES", "")
    try:
        return int(value) if value.strip() else SHM_MIN_BYTES
    except ValueError:
        logger.warning("ignoring TROUPE_SHM_MIN_BYTES=%r: not an integer", value)
        return SHM_MIN_BYTES


def _nameable(policy: Any, version: Any, persist: Any) -> bool:
    """Whether a publish may go through a file (else the socket path lets the service refuse
    what is wrong with it, as always)."""
    try:
        check_policy_name(policy)
    except PolicyNameError:
        return False
    return type(version) is int and version >= 0 and type(persist) is bool


class InprocParameterService(ParameterClientBase):
    """The client interface on a :class:`ParameterStore` in this process, no sockets.

    Give each worker its own instance over one shared store: what ``poll_latest`` has handed
    out is tracked per instance. Parameters pass through the wire codec on the way in and out,
    so callers get the same types (numpy arrays, generic NamedArrays) and their own copies, just
    as over a socket.
    """

    def __init__(self, store: ParameterStore | None = None):
        super().__init__()
        self.store = store if store is not None else ParameterStore()

    def publish(self, policy, version, params, *, persist=False, timeout_s=DEFAULT_TIMEOUT_S):
        self.store.publish(policy, version, _through_wire(params), persist=persist)

    def get(self, policy, version=LATEST, *, timeout_s=DEFAULT_TIMEOUT_S):
        number, params = self.store.get(policy, version)
        if version == LATEST:
            self._hand_out(policy, number)
        return number, _through_wire(params)

    def tag(self, policy, version, tag, *, timeout_s=DEFAULT_TIMEOUT_S):
        self.store.tag(policy, version, tag)

    def poll_latest(self, policy: str, *, timeout_s: float = 0.0) -> tuple[int, Any] | None:
        check_policy_name(policy)
        if self.store.wait_newer(policy, self._returned.get(policy), timeout_s) is None:
            return None
        number, params = self.store.get(policy, LATEST)
        self._hand_out(policy, number)
        return number, _through_wire(params)


def _through_wire(params: Any) -> Any:
    return wire.decode(wire.encode("params", params), copy=True).body
