"""The parameter service: trainers publish versions, policy workers receive them.

Two sockets on the server (:class:`ParameterServer`, run inside the parameter-service worker):

- a ROUTER for requests from :class:`ParameterClient`'s DEALER. Kinds and bodies:
  ``publish {id, policy, version, params, persist}`` -> ``ack {id, version}``;
  ``get {id, policy, version}`` (a number or a tag) -> ``params {id, policy, version, params}``;
  ``tag {id, policy, version, tag}`` -> ``ack {id, version}``;
  any refused request -> ``error {id, type, error}``, raised again by the client as that type.
- an XPUB that pushes every accepted publish as ``params {policy, version, params}`` with the
  policy name as topic frame. XPUB rather than PUB so the server sees who subscribed and
  :meth:`ParameterServer.wait_subscribers` can wait for that instead of sleeping.

Replies are matched to requests by ``id``, and a client whose request timed out replaces its
DEALER socket, so a lost or late reply can never wedge it (the trouble with REQ).

:class:`InprocParameterService` offers the same client interface on a store in this process, for
workers wired together in one process; parameters still go through the wire codec there, so a
policy sees exactly what it would see over a socket.
"""

from __future__ import annotations

import abc
import itertools
import logging
import time
from collections import Counter
from typing import Any

import zmq

from api.errors import OperationalError, PeerTimeoutError, TroupeError, UserError, WireError
from system import wire
from system.parameter_store import (
    LATEST,
    ParameterNotFoundError,
    ParameterStore,
    PolicyNameError,
    VersionError,
    check_policy_name,
)
from system.ratelimit import BadMessages

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
PUSH_HWM = 16
"""Pushes queued per subscriber. Only the newest one matters to a subscriber, so a short queue is
enough; a subscriber that fell this far behind still gets every later push, or can ``get``."""

# The only error types a reply may name; anything else becomes a plain OperationalError.
_REMOTE_ERRORS: dict[str, type[TroupeError]] = {
    cls.__name__: cls
    for cls in (VersionError, ParameterNotFoundError, PolicyNameError, UserError, WireError)
}


def _field(body: dict, name: str, kind: type, request: str) -> Any:
    value = body.get(name)
    if type(value) is not kind:
        raise WireError(f"'{request}' request needs a {kind.__name__} '{name}', got {value!r}")
    return value


def _ms_left(deadline: float) -> int:
    return max(0, int((deadline - time.monotonic()) * 1000))


# ------------------------------------------------------------------------------------- server
class ParameterServer:
    """Serves a :class:`ParameterStore` over a ROUTER and pushes new versions over an XPUB.

    ``request_address`` and ``push_address`` are bind addresses; ``*`` as port picks a free one,
    and the resolved addresses are ``request_endpoint`` and ``push_endpoint``. Call :meth:`poll`
    from the owning thread's loop; close with :meth:`close`.
    """

    def __init__(
        self,
        store: ParameterStore,
        request_address: str = "tcp://127.0.0.1:*",
        push_address: str = "tcp://127.0.0.1:*",
        *,
        push_hwm: int = PUSH_HWM,
        max_batch: int = 100,
    ):
        self.store = store
        self.max_batch = max_batch
        self.stats: Counter[str] = Counter()
        self._subscriptions: Counter[bytes] = Counter()
        self._bad_messages = BadMessages(logger, "parameter server")
        self._router = wire.make_socket(zmq.ROUTER, server=True)
        self._xpub = wire.make_socket(zmq.XPUB, server=True, hwm=push_hwm)
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
        self._poller = zmq.Poller()
        self._poller.register(self._router, zmq.POLLIN)
        self._poller.register(self._xpub, zmq.POLLIN)
        self._handlers = {"publish": self._publish, "get": self._get, "tag": self._tag}

    def poll(self, timeout_ms: int) -> int:
        """Wait up to ``timeout_ms`` for traffic, handle what is there; returns messages handled."""
        ready = dict(self._poller.poll(timeout_ms))
        handled = 0
        if self._xpub in ready:
            handled += self._drain_subscriptions()
        if self._router in ready:
            handled += self._drain_requests()
        return handled

    def subscriber_count(self, policy: str | None = None) -> int:
        """Subscriptions to ``policy`` (or to anything, when None) currently known."""
        if policy is None:
            return sum(self._subscriptions.values())
        return self._subscriptions[policy.encode()]

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
            self.poll(_ms_left(deadline))

    def close(self) -> None:
        self._router.close(linger=0)
        self._xpub.close(linger=0)

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
                got = wire.recv(self._router, timeout_ms=0, zero_copy=True)
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
            kind, reply = "error", {"type": "WireError", "error": str(e)}
        except (TroupeError, OSError) as e:
            self.stats["errors"] += 1
            kind, reply = "error", {"type": type(e).__name__, "error": str(e)}
        reply["id"] = request_id
        try:
            wire.send(self._router, kind, reply, envelope=envelope, flags=zmq.NOBLOCK)
        except zmq.Again:
            logger.warning("parameter server could not reply to a '%s' request", message.kind)

    def _publish(self, body: dict) -> tuple[str, dict]:
        policy = _field(body, "policy", str, "publish")
        version = _field(body, "version", int, "publish")
        persist = _field(body, "persist", bool, "publish")
        if "params" not in body:
            raise WireError("'publish' request has no 'params'")
        params = body["params"]
        already = self.store.latest_version(policy) == version  # a final save, not news
        self.store.publish(policy, version, params, persist=persist)
        self.stats["publishes"] += 1
        if already:
            return "ack", {"version": version}
        push = {"policy": policy, "version": version, "params": params}
        try:
            wire.send(self._xpub, "params", push, envelope=[policy.encode()], flags=zmq.NOBLOCK)
            self.stats["pushes"] += 1
        except zmq.Again:  # XPUB drops rather than blocks; kept in case a transport differs
            logger.warning("parameter server could not push version %d of '%s'", version, policy)
        return "ack", {"version": version}

    def _get(self, body: dict) -> tuple[str, dict]:
        policy = _field(body, "policy", str, "get")
        version = body.get("version")
        if type(version) not in (int, str):
            raise WireError(f"'get' request needs an int or str 'version', got {version!r}")
        number, params = self.store.get(policy, version)
        self.stats["gets"] += 1
        return "params", {"policy": policy, "version": number, "params": params}

    def _tag(self, body: dict) -> tuple[str, dict]:
        policy = _field(body, "policy", str, "tag")
        version = _field(body, "version", int, "tag")
        self.store.tag(policy, version, _field(body, "tag", str, "tag"))
        return "ack", {"version": version}


# ------------------------------------------------------------------------------------ clients
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
    """Talks to a :class:`ParameterServer`: requests over a DEALER, pushes over a SUB.

    ``subscribe`` names the policies whose pushes :meth:`poll_latest` receives (needs
    ``push_endpoint``). A push sent before the subscription reached the server is lost (ZeroMQ's
    slow joiner), so a policy worker starts from ``get(policy)`` and then polls. With
    ``writable=True`` received arrays are the client's own copies; with False they are read-only
    views onto the received frames (one copy fewer).
    """

    def __init__(
        self,
        request_endpoint: str,
        push_endpoint: str | None = None,
        subscribe: list[str] | tuple[str, ...] = (),
        *,
        writable: bool = True,
        push_hwm: int = PUSH_HWM,
    ):
        super().__init__()
        self.request_endpoint = request_endpoint
        self.writable = writable
        self.stats: Counter[str] = Counter()
        self._ids = itertools.count(1)
        self._bad_messages = BadMessages(logger, f"parameter client of {request_endpoint}")
        self._pending: dict[str, tuple[int, Any]] = {}
        self._subscribed = {check_policy_name(p) for p in subscribe}
        if self._subscribed and push_endpoint is None:
            raise UserError("ParameterClient(subscribe=...) needs the server's push_endpoint")
        self._dealer = self._new_dealer()
        self._sub: zmq.Socket | None = None
        if self._subscribed:
            self._sub = wire.make_socket(zmq.SUB, server=False, hwm=push_hwm)
            for policy in sorted(self._subscribed):
                self._sub.setsockopt(zmq.SUBSCRIBE, policy.encode())
            self._sub.connect(push_endpoint)

    def _new_dealer(self) -> zmq.Socket:
        dealer = wire.make_socket(zmq.DEALER, server=False)
        dealer.connect(self.request_endpoint)
        return dealer

    def publish(self, policy, version, params, *, persist=False, timeout_s=DEFAULT_TIMEOUT_S):
        body = {"policy": policy, "version": version, "params": params, "persist": persist}
        self._request("publish", body, timeout_s)

    def get(self, policy, version=LATEST, *, timeout_s=DEFAULT_TIMEOUT_S):
        body = self._request("get", {"policy": policy, "version": version}, timeout_s)
        number, params = body.get("version"), body.get("params")
        if type(number) is not int:
            raise WireError(f"'get' reply has no int 'version': {number!r}")
        if version == LATEST:
            self._hand_out(policy, number)
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
            self._drain_pushes()
            newest = self._pending.pop(policy, None)
            if newest is not None and self._is_new(policy, newest[0]):
                self._hand_out(policy, newest[0])
                return newest
            if time.monotonic() >= deadline or not self._sub.poll(_ms_left(deadline)):
                return None

    def close(self) -> None:
        self._dealer.close(linger=0)
        if self._sub is not None:
            self._sub.close(linger=0)

    # ------------------------------------------------------------------------------ internals
    def _drain_pushes(self) -> None:
        """Receive every push waiting, keeping only the newest per policy."""
        while True:
            try:
                got = wire.recv(self._sub, timeout_ms=0, copy=self.writable, zero_copy=True)
            except WireError as e:
                self._bad(e)
                continue
            if got is None:
                return
            envelope, message = got
            body = message.body
            if envelope and envelope[0].decode(errors="replace") not in self._subscribed:
                # SUB filters by prefix: subscribing to "a" also brings "ab"'s pushes.
                self.stats["other_pushes"] += 1
                continue
            if (
                message.kind != "params"
                or not isinstance(body, dict)
                or type(body.get("version")) is not int
                or body.get("policy") not in self._subscribed
                or envelope != [body["policy"].encode()]
            ):
                self._bad(WireError(f"unexpected push '{message.kind}' on topic {envelope}"))
                continue
            policy, version = body["policy"], body["version"]
            self.stats["pushes"] += 1
            held = self._pending.get(policy)
            if self._is_new(policy, version) and (held is None or version > held[0]):
                self._pending[policy] = (version, body.get("params"))

    def _bad(self, error: Exception) -> None:
        self.stats["bad_messages"] += 1
        self._bad_messages.record(error)

    def _request(self, kind: str, body: dict, timeout_s: float) -> dict:
        request_id = next(self._ids)
        deadline = time.monotonic() + timeout_s
        try:
            wire.send(self._dealer, kind, {**body, "id": request_id}, flags=zmq.NOBLOCK)
        except zmq.Again:
            self._timed_out(kind, timeout_s)
        while True:
            try:
                got = wire.recv(
                    self._dealer, timeout_ms=_ms_left(deadline), copy=self.writable, zero_copy=True
                )
            except WireError as e:
                self._bad(e)
                continue
            if got is None:
                self._timed_out(kind, timeout_s)
            reply = got[1]
            if not isinstance(reply.body, dict) or reply.body.get("id") != request_id:
                self.stats["stale_replies"] += 1  # the answer to a request that timed out
                continue
            if reply.kind == "error":
                error = _REMOTE_ERRORS.get(reply.body.get("type"), OperationalError)
                raise error(str(reply.body.get("error")))
            return reply.body

    def _timed_out(self, kind: str, timeout_s: float) -> None:
        # A fresh socket forgets the unanswered request: it is neither delivered late nor
        # answered into a later request's wait.
        self._dealer.close(linger=0)
        self._dealer = self._new_dealer()
        self.stats["timeouts"] += 1
        raise PeerTimeoutError(
            f"parameter service at {self.request_endpoint} did not answer '{kind}' within "
            f"{timeout_s}s; is the parameter-service worker running?"
        )


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
