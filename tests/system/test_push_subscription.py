"""The parameter client's push side (system.parameters.subscription) on a real XPUB socket the
test publishes on: only the newest new version is kept, prefix-matched topics of other policies
and malformed pushes are counted and dropped, and a switch to the shared-memory topic loses no
version in between."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pytest
import zmq

from system.parameters.protocol import SHM_TOPIC
from system.parameters.subscription import PushSubscription
from system.streams import transport


@pytest.fixture
def xpub():
    sock = transport.make_socket(zmq.XPUB, server=True)
    sock.bind("tcp://127.0.0.1:*")
    yield sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)
    sock.close(linger=0)


def _subscribed(sock, topics: int) -> None:
    """Wait until the XPUB has seen ``topics`` subscription messages (the slow joiner)."""
    seen, deadline = 0, time.monotonic() + 5
    while seen < topics:
        assert time.monotonic() < deadline, f"{seen} of {topics} subscriptions"
        if sock.poll(100):
            sock.recv()
            seen += 1


def _push(sock, policy: str, version: int, *, shm: bool = False, extra: str = "") -> None:
    topic = (SHM_TOPIC if shm else b"") + (policy + extra).encode()
    body = {"policy": policy, "version": version}
    body |= {"shm": {"file": "x"}} if shm else {"params": {"w": np.full(3, version, np.float32)}}
    transport.send(sock, "params", body, envelope=[topic])


def _drain_until(sub: PushSubscription, done, is_new=lambda p, v: True) -> None:
    deadline = time.monotonic() + 5
    while not done():
        assert time.monotonic() < deadline
        sub.drain(is_new)
        time.sleep(0.01)


def _subscription(endpoint: str, bad: list) -> PushSubscription:
    return PushSubscription(
        endpoint, {"a"}, hwm=16, writable=False, own_frames=True, stats=Counter(),
        bad=bad.append,
    )  # fmt: skip


def test_only_the_newest_new_version_is_kept(xpub):
    sock, endpoint = xpub
    bad: list = []
    sub = _subscription(endpoint, bad)
    _subscribed(sock, 1)
    for version in (3, 5, 4):
        _push(sock, "a", version)
    _drain_until(sub, lambda: sub.stats["pushes"] == 3)
    version, params, in_shm = sub.take("a")
    assert version == 5 and params["w"][0] == 5.0 and not in_shm
    assert sub.take("a") is None  # handed out once
    _push(sock, "a", 6)
    _drain_until(sub, lambda: sub.stats["pushes"] == 4, is_new=lambda p, v: v > 6)
    assert sub.take("a") is None  # not newer than what the worker has
    assert bad == []
    sub.close()


def test_other_policies_and_malformed_pushes_are_counted_and_dropped(xpub):
    sock, endpoint = xpub
    bad: list = []
    sub = _subscription(endpoint, bad)
    _subscribed(sock, 1)
    _push(sock, "a", 1, extra="b")  # topic "ab": SUB matches it by prefix
    transport.send(sock, "params", {"policy": "a", "version": "7"}, envelope=[b"a"])
    transport.send(sock, "error", {"policy": "a", "version": 7}, envelope=[b"a"])
    _drain_until(sub, lambda: sub.stats["other_pushes"] == 1 and len(bad) == 2)
    assert sub.take("a") is None and all("unexpected push" in str(e) for e in bad)
    sub.close()


def test_switching_to_shared_memory_loses_no_version(xpub):
    sock, endpoint = xpub
    bad: list = []
    sub = _subscription(endpoint, bad)
    _subscribed(sock, 1)
    sub.switch(to_shm=True)
    _subscribed(sock, 1)  # the new topic reached the server; the old one is still held
    _push(sock, "a", 1)  # the plain topic still delivers until the new one has
    _push(sock, "a", 2)
    _push(sock, "a", 2, shm=True)  # the same version on the new topic: counted once
    _push(sock, "a", 3, shm=True)
    _drain_until(sub, lambda: sub.stats["pushes"] == 3 and sub.stats["duplicate_pushes"] == 1)
    assert sub.take("a") == (3, {"file": "x"}, True)
    _push(sock, "a", 4)  # the plain topic was retired by the first notice on the new one
    _push(sock, "a", 5, shm=True)
    _drain_until(sub, lambda: sub.stats["pushes"] == 4)
    assert sub.take("a")[0] == 5 and bad == []
    sub.close()
