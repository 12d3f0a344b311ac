"""The push side of a parameter client: a SUB socket on the server's XPUB, newest version kept.

A subscriber receives each policy's pushes on topic ``<policy>`` (full parameters) or, when it
shares the server's shared memory, on ``@<policy>`` (a file's layout). Only the newest version
not yet handed out is kept per policy. A push sent before the subscription reached the server is
lost (ZeroMQ's slow joiner), so a policy worker starts from ``get`` and then polls.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import zmq

from system.errors import WireError
from system.parameters.protocol import SHM_TOPIC
from system.streams import shm, transport, wire

_SHM_PREFIX = SHM_TOPIC.decode()


class PushSubscription:
    """Pushes of the subscribed policies; :meth:`take` gives the newest one held."""

    def __init__(
        self,
        endpoint: str,
        policies: set[str],
        *,
        hwm: int,
        writable: bool,
        own_frames: bool,
        stats: Counter[str],
        bad: Callable[[Exception], None],
        max_message_bytes: int | None = None,
    ):
        self.policies = policies
        self.stats = stats
        self._bad = bad
        self._writable = writable
        self._copy = writable and not own_frames
        self.socket = transport.make_socket(
            zmq.SUB, server=False, hwm=hwm, max_message_bytes=max_message_bytes
        )
        self._topics: set[bytes] = set()  # subscribed topics
        self._retire: dict[bytes, bytes] = {}  # topic -> topic to drop once this one delivers
        self._received: dict[str, int] = {}  # newest version pushed per policy, either topic
        self._pending: dict[str, tuple[int, object, bool]] = {}  # version, payload, in shm?
        for policy in sorted(policies):
            self._topic(policy.encode(), True)
        self.socket.connect(endpoint)

    def switch(self, *, to_shm: bool) -> None:
        """Move every policy to its shared-memory topic, or back.

        The new topic is subscribed now, the old one dropped only once the new one delivered:
        until the server has the new subscription, pushes still come on the old topic. So no
        version falls between; one may come twice, and the second is ignored.
        """
        for policy in sorted(self.policies):
            plain, notices = policy.encode(), SHM_TOPIC + policy.encode()
            new, old = (notices, plain) if to_shm else (plain, notices)
            self._topic(new, True)
            self._retire.pop(old, None)
            self._retire[new] = old

    def _topic(self, topic: bytes, on: bool) -> None:
        if (topic in self._topics) != on:
            self.socket.setsockopt(zmq.SUBSCRIBE if on else zmq.UNSUBSCRIBE, topic)
            (self._topics.add if on else self._topics.discard)(topic)

    def take(self, policy: str) -> tuple[int, object, bool] | None:
        """The newest push held for ``policy``: ``(version, params or layout, in_shm)``."""
        return self._pending.pop(policy, None)

    def drain(self, is_new: Callable[[str, int], bool]) -> None:
        """Receive every push waiting, keeping only the newest new one per policy."""
        while True:
            try:
                got = transport.recv(self.socket, timeout_ms=0, copy=self._copy, zero_copy=True)
            except WireError as e:
                self._bad(e)
                continue
            if got is None:
                return
            self._absorb(*got, is_new)

    def _absorb(self, envelope: list[bytes], message: wire.Message, is_new) -> None:
        body = message.body
        topic = envelope[0].decode(errors="replace") if envelope else ""
        local = topic.startswith(_SHM_PREFIX)  # its topic for shared-memory peers
        if envelope and topic.removeprefix(_SHM_PREFIX) not in self.policies:
            # SUB filters by prefix: subscribing to "a" also brings "ab"'s pushes.
            self.stats["other_pushes"] += 1
            return
        in_shm = local and isinstance(body, dict) and "shm" in body
        payload = "shm" if in_shm else "params"
        if (
            message.kind != "params"
            or not isinstance(body, dict)
            or type(body.get("version")) is not int
            or body.get("policy") not in self.policies
            or envelope != [(SHM_TOPIC if local else b"") + body["policy"].encode()]
            or payload not in body
        ):
            self._bad(WireError(f"unexpected push '{message.kind}' on topic {envelope}"))
            return
        policy, version = body["policy"], body["version"]
        retired = self._retire.pop(envelope[0], None)
        if retired is not None:
            self._topic(retired, False)
        if version == self._received.get(policy):  # on both topics while switching
            self.stats["duplicate_pushes"] += 1
            return
        self._received[policy] = max(version, self._received.get(policy, -1))
        self.stats["pushes"] += 1
        held = self._pending.get(policy)
        if is_new(policy, version) and (held is None or version > held[0]):
            value = body[payload]
            if not in_shm and self._writable and not self._copy:
                value = shm.make_writable(value)
            self._pending[policy] = (version, value, in_shm)

    def close(self) -> None:
        self.socket.close(linger=0)
