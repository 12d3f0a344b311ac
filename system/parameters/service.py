"""The parameter service's side: trainers publish versions, policy workers receive them.

This module holds :class:`ParameterServer`, run inside the parameter-service worker. The
message types and constants it shares with the clients are in :mod:`system.parameters.protocol`,
so the two sides cannot drift apart.

Two sockets on the server:

- a ROUTER for requests from :class:`~system.parameters.client.ParameterClient`'s DEALER. Kinds
  and bodies:
  ``publish {id, policy, version, params | shm, persist}`` -> ``ack {id, version}``;
  ``get {id, policy, version}`` (a number or a tag) -> ``params {id, policy, version, params}``;
  ``tag {id, policy, version, tag}`` -> ``ack {id, version}``;
  ``trainer_state {id, policy}`` -> ``trainer_state {id, policy, version, state}`` (a
  trainer's own state, shipped with ``trainer_state`` in a persisting ``publish`` and saved
  beside the checkpoints; both None when there is none);
  ``hello {id}`` -> ``hello {id, shm}`` (``shm``: the service's shared memory, or None);
  any refused request -> ``error {id, type, error}``, raised again by the client as that type.
- an XPUB that pushes every accepted publish as ``params {policy, version, params}`` with the
  policy name as topic frame, and first, with topic ``@<policy>`` for subscribers that share
  the service's shared memory, a notice ``params {policy, version, shm}`` (the same full push
  when the version came over a socket). XPUB rather than PUB so the server sees who subscribed
  and :meth:`ParameterServer.wait_subscribers` can wait for that instead of sleeping.

Shared memory (:mod:`system.streams.shm`): the service offers its shared-memory directory in
``hello``.
A publish that names a file there (``shm``) instead of carrying ``params`` is mapped as the
stored version (no copy) and its layout pushed on ``@<policy>``; the service owns the file from
then on, unlinks it once the store drops the version (when idle, or after
:data:`RELEASE_AFTER_S`), and sweeps up files of publishes it never acknowledged. A file it
cannot take is refused as ``SharedMemoryRefused`` (the client sends by socket instead), a
version that does not fit the run as ``WireError`` whichever way it came. Which client
uses a file and which the socket is decided in :mod:`system.parameters.client`.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from typing import Any

import zmq

from api.errors import RunFolderError, TroupeError
from system.errors import PeerTimeoutError, PolicyNameError, SharedMemoryRefused, WireError
from system.parameters.protocol import (
    PUSH_HWM,
    REMOTE_ERRORS,
    SHM_TOPIC,
    Get,
    GetTrainerState,
    Publish,
    Tag,
    ms_left,
)
from system.parameters.store import ParameterStore, check_policy_name
from system.parameters.trainer_state import array_bytes
from system.ratelimit import BadMessages
from system.streams import shm, transport, wire
from system.streams.validation import HEADROOM_BYTES, ParamsLayout

logger = logging.getLogger(__name__)

SHM_SWEEP_S = 10.0
RELEASE_AFTER_S = 0.05
"""A dropped version's file is unlinked when the server is idle, or this long after at most."""
SUBSCRIPTION_MAX_BYTES = 4096
"""The longest message the push socket takes: a (un)subscription to a policy's topic is at most
130 bytes, but with CURVE the handshake's INITIATE command (about 300 bytes and its metadata)
must pass the same limit, or every encrypted subscriber is dropped before it subscribes. ZeroMQ
keeps every subscription a peer sends in memory, so an unbounded one (50 MB) could exhaust it."""
AUTO = "auto"
"""``ParameterServer(shm_dir=AUTO)``: :func:`system.streams.shm.configured_dir` (``/dev/shm``)."""


class ParameterServer:
    """Serves a :class:`ParameterStore` over a ROUTER and pushes new versions over an XPUB.

    ``request_address`` and ``push_address`` are bind addresses; ``*`` as port picks a free one,
    and the resolved addresses are ``request_endpoint`` and ``push_endpoint``. ``shm_dir``: the
    shared-memory directory offered to clients on this host (default :data:`AUTO`; None: none).
    Call :meth:`poll` from the owning thread's loop; close with :meth:`close`.
    """

    def __init__(
        self,
        store: ParameterStore,
        request_address: str = "tcp://127.0.0.1:*",
        push_address: str = "tcp://127.0.0.1:*",
        *,
        push_hwm: int = PUSH_HWM,
        max_batch: int = 100,
        shm_dir: str | os.PathLike | None = AUTO,
        layout: ParamsLayout | None = None,
    ):
        self.store = store
        self.layout = layout
        self.max_batch = max_batch
        self.stats: Counter[str] = Counter()
        self._subscriptions: Counter[bytes] = Counter()
        self._bad_messages = BadMessages(logger, "parameter server")
        limit = None if layout is None else layout.max_message_bytes
        self._router = transport.make_socket(zmq.ROUTER, server=True, max_message_bytes=limit)
        self._xpub = transport.make_socket(
            zmq.XPUB, server=True, hwm=push_hwm, max_message_bytes=SUBSCRIPTION_MAX_BYTES
        )
        self.shm: shm.ShmArea | None = None
        self._layouts: dict[tuple[str, int], dict] = {}  # shared-memory versions in the store
        self._to_release: list[tuple[float, str]] = []  # (when dropped, file) to unlink
        try:
            # Verbose both ways: every (un)subscription reaches us, so the counts are exact.
            self._xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
            self._xpub.setsockopt(zmq.XPUB_VERBOSER, 1)
            self._router.bind(request_address)
            self._xpub.bind(push_address)
        except zmq.ZMQError:
            self.close()
            raise
        self.request_endpoint: str = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.push_endpoint: str = self._xpub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.shm = _open_shm_area(shm_dir)
        self._next_sweep = time.monotonic() + SHM_SWEEP_S
        store.on_evict(self._evicted)
        self._poller = zmq.Poller()
        self._poller.register(self._router, zmq.POLLIN)
        self._poller.register(self._xpub, zmq.POLLIN)
        self._handlers = {
            "publish": self._publish,
            "get": self._get,
            "tag": self._tag,
            "hello": self._hello,
            "trainer_state": self._trainer_state,
        }

    def wait(self, timeout_ms: int) -> bool:
        """Wait up to ``timeout_ms`` for traffic without handling it; False if none came."""
        return bool(self._poller.poll(timeout_ms))

    def poll(self, timeout_ms: int) -> int:
        """Wait up to ``timeout_ms`` for traffic, handle what is there; returns messages handled."""
        ready = dict(self._poller.poll(timeout_ms))
        handled = 0
        if self._xpub in ready:
            handled += self._drain_subscriptions()
        if self._router in ready:
            handled += self._drain_requests()
        if self.shm is not None:
            # Freeing a file's pages takes a while: not while subscribers load a new version.
            due = time.monotonic() - (0.0 if not ready else RELEASE_AFTER_S)
            while self._to_release and self._to_release[0][0] <= due:
                self.shm.release(self._to_release.pop(0)[1])
            if time.monotonic() >= self._next_sweep:
                self._next_sweep = time.monotonic() + SHM_SWEEP_S
                self.stats["shm_swept"] += self.shm.sweep()
        return handled

    def subscriber_count(self, policy: str | None = None, *, shm: bool | None = None) -> int:
        """Subscriptions to ``policy`` (or to anything, when None) currently known; ``shm``:
        only those for shared-memory notices (True), only full pushes (False), or both."""
        counts = [
            n
            for topic, n in self._subscriptions.items()
            if (shm is None or topic.startswith(SHM_TOPIC) == shm)
            and (policy is None or topic.removeprefix(SHM_TOPIC) == policy.encode())
        ]
        return sum(counts)

    def wait_subscribers(
        self, n: int, *, policy: str | None = None, timeout_s: float = 5.0
    ) -> None:
        """Poll (from the owning thread) until ``n`` subscriptions are known; else time out."""
        deadline = time.monotonic() + timeout_s
        while self.subscriber_count(policy) < n:
            if time.monotonic() >= deadline:
                what = "any policy" if policy is None else f"policy '{policy}'"
                raise PeerTimeoutError(
                    f"{self.subscriber_count(policy)} of {n} subscriptions to {what} arrived "
                    f"within {timeout_s}s at {self.push_endpoint}"
                )
            self.poll(ms_left(deadline))

    def close(self) -> None:
        self._router.close(linger=0)
        self._xpub.close(linger=0)
        if self.shm is not None:
            self._layouts.clear()
            self._to_release.clear()
            self.shm.close()  # mappings the store still holds stay readable

    # ------------------------------------------------------------------------------ internals
    def _bad(self, error: Exception) -> None:
        self.stats["bad_messages"] += 1
        self._bad_messages.record(error)

    def _drain_subscriptions(self) -> int:
        handled = 0
        while handled < self.max_batch:
            try:
                parts = self._xpub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            handled += 1
            if len(parts) != 1 or not parts[0] or parts[0][0] not in (0, 1):
                self._bad(WireError("XPUB received something that is not a (un)subscription"))
                continue
            topic = parts[0][1:]
            if not _is_topic(topic):
                self._bad(WireError(f"subscription to {topic[:40]!r}, not a policy's topic"))
                continue
            if parts[0][0] == 1:
                self._subscriptions[topic] += 1
            elif self._subscriptions[topic] > 0:
                self._subscriptions[topic] -= 1
            self.stats["subscription_events"] += 1
        return handled

    def _drain_requests(self) -> int:
        handled = 0
        while handled < self.max_batch:
            try:
                got = transport.recv(self._router, timeout_ms=0, zero_copy=True)
            except WireError as e:
                handled += 1
                self._bad(e)
                continue
            if got is None:
                break
            handled += 1
            self._handle(*got)
        return handled

    def _handle(self, envelope: list[bytes], message: wire.Message) -> None:
        body = message.body
        request_id = body.get("id") if isinstance(body, dict) else None
        if type(request_id) is not int:
            self._bad(WireError(f"'{message.kind}' request without an int 'id'"))
            return
        self.stats["requests"] += 1
        handler = self._handlers.get(message.kind)
        try:
            if handler is None:
                raise WireError(f"unknown request kind '{message.kind}'")
            kind, reply = handler(body)
        except WireError as e:
            self._bad(e)
            kind, reply = "error", {"type": _remote_type(e), "error": str(e)}
        except (TroupeError, OSError) as e:
            self.stats["errors"] += 1
            kind, reply = "error", {"type": type(e).__name__, "error": str(e)}
        reply["id"] = request_id
        try:
            transport.send(self._router, kind, reply, envelope=envelope, flags=zmq.NOBLOCK)
        except zmq.Again:
            logger.warning("parameter server could not reply to a '%s' request", message.kind)
        if kind == "error" and reply["type"] == RunFolderError.__name__:
            # A version that cannot be made durable must not be served: the run stops, with
            # the cause named (the controller does not restart a worker for a full disk).
            raise RunFolderError(reply["error"])

    def _publish(self, body: dict) -> tuple[str, dict]:
        request = Publish.from_body(body)
        policy, version, persist, layout = (
            request.policy,
            request.version,
            request.persist,
            request.shm,
        )
        if layout is not None:
            params = self._map_published(check_policy_name(policy), version, layout)
        else:
            params = request.params
        if self.layout is not None:
            self.layout.check(policy, params)
            self._check_trainer_state(policy, request.trainer_state)
        already = self.store.latest_version(policy) == version  # a final save, not news
        self.store.publish(
            policy, version, params, persist=persist, trainer_state=request.trainer_state
        )
        if request.trainer_state is not None:
            self.stats["trainer_states"] += 1
        self.stats["publishes"] += 1
        if layout is not None:  # ours from here on: kept while the store keeps the version
            if already:
                self._to_release.append((time.monotonic(), layout["name"]))
            else:
                self.shm.adopt(layout["name"])
                self._layouts[(policy, version)] = layout
                self.stats["shm_publishes"] += 1
        if already:
            return "ack", {"version": version}
        self._push(policy, version, params, layout)
        return "ack", {"version": version}

    def _check_trainer_state(self, policy: str, state: Any) -> None:
        """A trainer's own state is stored as it came, but no bigger than its bound (the
        socket's size limit allows for the largest policy's; this is the policy's own)."""
        if state is None:
            return
        limit = self.layout.max_trainer_state_bytes(policy) + HEADROOM_BYTES
        size = array_bytes(state)
        if size > limit:
            raise WireError(
                f"trainer state of policy '{policy}' holds {size} bytes of arrays, more than "
                f"its limit of {limit}"
            )

    def _map_published(self, policy: str, version: int, layout: Any) -> Any:
        """The version a shared-memory file holds; a file not taken is refused as such, so
        that the publisher sends it over the socket (a version refused for its layout is not
        the file's fault, and is said)."""
        if self.shm is None:
            raise SharedMemoryRefused("this parameter service has no shared memory; send 'params'")
        try:
            return self.shm.open(layout, policy, version)
        except SharedMemoryRefused:
            raise
        except WireError as e:
            raise SharedMemoryRefused(str(e)) from e

    def _push(self, policy: str, version: int, params: Any, layout: dict | None) -> None:
        """Full parameters on the policy's topic; on its shared-memory topic the layout, or
        the full parameters too when the version came over a socket."""
        topic = policy.encode()
        push = {"policy": policy, "version": version, "params": params}
        notice = push if layout is None else {"policy": policy, "version": version, "shm": layout}
        try:  # local subscribers first: theirs is the short path
            transport.send(
                self._xpub, "params", notice, envelope=[SHM_TOPIC + topic], flags=zmq.NOBLOCK
            )
            transport.send(self._xpub, "params", push, envelope=[topic], flags=zmq.NOBLOCK)
            self.stats["pushes"] += 1
        except zmq.Again:  # XPUB drops rather than blocks; kept in case a transport differs
            logger.warning("parameter server could not push version %d of '%s'", version, policy)

    def _evicted(self, policy: str, version: int) -> None:
        layout = self._layouts.pop((policy, version), None)
        if layout is not None and self.shm is not None:
            self._to_release.append((time.monotonic(), layout["name"]))

    def _get(self, body: dict) -> tuple[str, dict]:
        request = Get.from_body(body)
        policy = request.policy
        number, params = self.store.get(policy, request.version)
        self.stats["gets"] += 1
        return "params", {"policy": policy, "version": number, "params": params}

    def _tag(self, body: dict) -> tuple[str, dict]:
        request = Tag.from_body(body)
        self.store.tag(request.policy, request.version, request.tag)
        return "ack", {"version": request.version}

    def _trainer_state(self, body: dict) -> tuple[str, dict]:
        request = GetTrainerState.from_body(body)
        saved = self.store.trainer_state(request.policy)
        version, state = (None, None) if saved is None else saved
        self.stats["trainer_state_gets"] += 1
        return "trainer_state", {"policy": request.policy, "version": version, "state": state}

    def _hello(self, body: dict) -> tuple[str, dict]:
        return "hello", {"shm": None if self.shm is None else self.shm.info()}


def _is_topic(topic: bytes) -> bool:
    try:
        check_policy_name(topic.removeprefix(SHM_TOPIC).decode())
    except (UnicodeDecodeError, PolicyNameError):
        return False
    return True


def _remote_type(error: WireError) -> str:
    """The type a refusal names: its own where clients know it (a refused shared-memory file),
    else WireError."""
    name = type(error).__name__
    return name if name in REMOTE_ERRORS else WireError.__name__


def _open_shm_area(shm_dir: str | os.PathLike | None) -> shm.ShmArea | None:
    directory = shm.configured_dir() if shm_dir == AUTO else shm_dir
    if directory is None:
        return None
    try:
        return shm.ShmArea(directory)
    except OSError as e:
        logger.warning("parameter service goes without shared memory in %s: %s", directory, e)
        return None
