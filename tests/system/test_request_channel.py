"""The parameter client's request side (system.parameters.channel) against a real ROUTER socket
that the test answers by hand: replies matched by id, stale and late ones counted, a timeout that
replaces the socket, a wait cut short when the service moved, a refusal raised as its type."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
import zmq

from system.errors import PeerTimeoutError, VersionError
from system.parameters.channel import RequestChannel, hello_info, owns_frames
from system.streams import transport, wire


@pytest.fixture
def router():
    sock = transport.make_socket(zmq.ROUTER, server=True)
    sock.bind("tcp://127.0.0.1:*")
    yield sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)
    sock.close(linger=0)


def _channel(endpoint: str, **kw) -> tuple[RequestChannel, Counter, list]:
    stats, hellos = Counter(), []
    channel = RequestChannel(endpoint, stats, pytest.fail, hellos.append, copy_replies=True, **kw)
    return channel, stats, hellos


def _request(sock):
    return transport.recv(sock, timeout_ms=5_000)


def test_a_reply_is_matched_to_its_request_and_a_stale_one_counted(router):
    sock, endpoint = router
    channel, stats, _ = _channel(endpoint)
    with pytest.raises(PeerTimeoutError, match=r"did not answer 'get' within 0\.2s"):
        channel.request("get", {"policy": "p"}, 0.2, time.monotonic() + 0.2)
    _, first = _request(sock)  # the request that timed out reached the server
    assert stats["timeouts"] == 1
    deadline = time.monotonic() + 5

    def serve():
        env2, second = _request(sock)
        # the late answer to the first request arrives first, on the new socket's identity
        transport.send(sock, "params", {"id": first.body["id"], "version": 1}, envelope=env2)
        transport.send(sock, "params", {"id": second.body["id"], "version": 2}, envelope=env2)

    thread = threading.Thread(target=serve)
    thread.start()
    body = channel.request("get", {"policy": "p"}, 5.0, deadline)
    thread.join()
    assert body["version"] == 2 and stats["stale_replies"] == 1
    channel.close()


def test_a_refusal_is_raised_as_the_error_it_names(router):
    sock, endpoint = router
    channel, _, _ = _channel(endpoint)

    def refuse():
        envelope, request = _request(sock)
        body = {"id": request.body["id"], "type": "VersionError", "error": "v3 < v5"}
        transport.send(sock, "error", body, envelope=envelope)

    thread = threading.Thread(target=refuse)
    thread.start()
    with pytest.raises(VersionError, match="v3 < v5"):
        channel.request("publish", {"policy": "p"}, 5.0, time.monotonic() + 5)
    thread.join()
    channel.close()


def test_a_wait_ends_early_once_the_service_is_known_to_have_moved(router):
    _, endpoint = router
    moved = {"now": False}
    channel, _, _ = _channel(endpoint, abandon=lambda: moved["now"])
    moved["now"] = True
    started = time.monotonic()
    with pytest.raises(PeerTimeoutError, match="was restarted elsewhere"):
        channel.request("get", {"policy": "p"}, 30.0, time.monotonic() + 30)
    assert time.monotonic() - started < 5  # not the 30 s timeout
    channel.close()


def test_hello_is_answered_whenever_it_comes(router):
    sock, endpoint = router
    channel, _, hellos = _channel(endpoint)
    channel.take_replies()  # sends the hello without waiting
    envelope, hello = _request(sock)
    assert hello.kind == "hello"
    answer = {"id": hello.body["id"], "shm": {"dir": "/dev/shm/x"}}
    transport.send(sock, "hello", answer, envelope=envelope)
    deadline = time.monotonic() + 5
    while not hellos and time.monotonic() < deadline:
        channel.take_replies()
        time.sleep(0.01)
    assert hello_info(hellos[0]) == {"dir": "/dev/shm/x"}
    assert hello_info(wire.Message("error", {"error": "old server"})) is None
    channel.close()


def test_only_frames_off_a_network_transport_are_this_process_s_to_keep():
    assert owns_frames("tcp://h:1") and owns_frames("ipc:///tmp/x")
    assert not owns_frames("inproc://params") and not owns_frames(None)
