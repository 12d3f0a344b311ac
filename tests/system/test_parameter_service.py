"""Tests for the parameter store, server and clients (real loopback sockets, random ports)."""

from __future__ import annotations

import logging
import socket
import threading
import time

import numpy as np
import pytest
import torch
import zmq

from api.errors import OperationalError, PeerTimeoutError, UserError, WireError
from system import wire
from system.parameter_service import (
    InprocParameterService,
    ParameterClient,
    ParameterClientBase,
    ParameterServer,
)
from system.parameter_store import (
    ParameterNotFoundError,
    ParameterStore,
    PolicyNameError,
    VersionError,
    load_checkpoint_file,
)

TIMEOUT_S = 5.0


def params(step: float, n: int = 4) -> dict:
    return {
        "model": {"w": np.full((n,), step, np.float32), "b": np.float64(step)},
        "step": int(step),
    }


def assert_params(got: dict, expected: dict) -> None:
    np.testing.assert_array_equal(got["model"]["w"], expected["model"]["w"])
    assert got["model"]["w"].dtype == expected["model"]["w"].dtype
    assert got["model"]["b"] == expected["model"]["b"]
    assert got["step"] == expected["step"]


# ------------------------------------------------------------------------------------- store
def test_store_versions_only_go_up():
    store = ParameterStore()
    store.publish("p", 1, params(1))
    store.publish("p", 5, params(5))
    assert store.latest_version("p") == 5
    with pytest.raises(VersionError, match=r"policy 'p' is already at version 5; version 5 must"):
        store.publish("p", 5, params(5))
    with pytest.raises(VersionError, match="version 3 must be newer"):
        store.publish("p", 3, params(3))
    for bad in (-1, True, 2.0, "7"):
        with pytest.raises(VersionError, match="version of policy 'p' must be an int >= 0"):
            store.publish("p", bad, params(0))
    assert store.latest_version("other") is None


def test_store_get_by_number_and_tag():
    store = ParameterStore()
    for v in (1, 2, 3):
        store.publish("p", v, params(v))
    assert store.get("p")[0] == 3
    assert_params(store.get("p", 2)[1], params(2))
    store.tag("p", 2, "eval")
    assert store.get("p", "eval")[0] == 2
    assert store.tags("p") == {"latest": 3, "eval": 2}
    with pytest.raises(ParameterNotFoundError, match=r"policy 'p' has no tag 'best'; tags: \["):
        store.get("p", "best")
    with pytest.raises(
        ParameterNotFoundError, match=r"policy 'p' has no version 9 \(latest is 3\)"
    ):
        store.get("p", 9)
    with pytest.raises(
        ParameterNotFoundError, match=r"no parameters for policy 'q'; known: \['p'\]"
    ):
        store.get("q")
    with pytest.raises(ParameterNotFoundError, match="cannot tag version 9 of policy 'p'"):
        store.tag("p", 9, "eval")
    for bad in ("latest", "", "12"):
        with pytest.raises(UserError, match="is not allowed: 'latest' is automatic"):
            store.tag("p", 1, bad)


def test_store_keeps_the_newest_k_and_tagged_versions():
    store = ParameterStore(keep=3)
    for v in (1, 2, 3):
        store.publish("p", v, params(v))
    store.tag("p", 1, "eval")
    for v in (4, 5, 6):
        store.publish("p", v, params(v))
    assert store.versions_in_memory("p") == [1, 4, 5, 6]
    with pytest.raises(
        ParameterNotFoundError, match=r"policy 'p' has no version 2 \(latest is 6\)"
    ):
        store.get("p", 2)
    store.tag("p", 6, "eval")  # the old eval version is no longer held for the tag
    assert store.versions_in_memory("p") == [4, 5, 6]


def test_store_refuses_bad_policy_names_and_persist_without_disk():
    store = ParameterStore()
    for bad in ("", "../x", "a/b", ".hidden", 3):
        with pytest.raises(PolicyNameError, match="is not allowed: use 1-128 letters"):
            store.publish(bad, 1, params(1))
    with pytest.raises(UserError, match=r"publish\(persist=True\) needs a ParameterStore with a"):
        store.publish("p", 1, params(1), persist=True)


def test_store_persists_atomically_and_restores(tmp_path):
    store = ParameterStore(tmp_path, keep=1)
    mixed = {"w": torch.arange(3.0), "n": np.int32(4), "a": np.ones((2, 2), np.float16)}
    store.publish("p", 1, {**params(1), "mixed": mixed}, persist=True)
    store.publish("p", 2, params(2))  # not persisted: lost on restart
    store.publish("p", 3, params(3), persist=True)
    store.tag("p", 1, "eval")
    store.publish("q", 10, params(10), persist=True)
    folder = tmp_path / "checkpoints" / "p"
    names = sorted(f.name for f in folder.iterdir())
    assert names == ["tags.json", "v00000001.ckpt", "v00000003.ckpt"]

    restored = ParameterStore.restore(tmp_path)
    assert restored.policies() == ["p", "q"]
    assert restored.latest_version("p") == 3
    assert restored.latest_version("q") == 10
    assert restored.versions_in_memory("p") == [3]  # older versions stay on disk until asked for
    assert_params(restored.get("p")[1], params(3))
    version, old = restored.get("p", "eval")
    assert version == 1
    assert_params(old, params(1))
    # on disk as on the wire: tensors come back as numpy arrays (no torch needed to read them)
    np.testing.assert_array_equal(old["mixed"]["w"], mixed["w"].numpy())
    assert old["mixed"]["n"] == np.int32(4) and type(old["mixed"]["n"]) is np.int32
    np.testing.assert_array_equal(old["mixed"]["a"], mixed["a"])
    with pytest.raises(ParameterNotFoundError, match="policy 'p' has no version 2"):
        restored.get("p", 2)
    with pytest.raises(VersionError, match="already at version 3"):
        restored.publish("p", 3, params(3))
    restored.publish("p", 4, params(4))


def test_restore_skips_an_unreadable_newest_checkpoint(tmp_path, caplog):
    store = ParameterStore(tmp_path)
    store.publish("p", 1, params(1), persist=True)
    (tmp_path / "checkpoints" / "p" / "v00000002.ckpt").write_bytes(b"not a checkpoint")
    (tmp_path / "checkpoints" / "p" / ".v00000003.ckpt.tmp-1-1").write_bytes(b"half written")
    with caplog.at_level(logging.WARNING):
        restored = ParameterStore.restore(tmp_path)
    assert restored.latest_version("p") == 1
    assert "skipping unreadable checkpoint" in caplog.text


def test_restored_checkpoints_cannot_run_code(tmp_path):
    class Trap:
        def __reduce__(self):
            return (print, ("code ran",))

    folder = tmp_path / "checkpoints" / "p"
    folder.mkdir(parents=True)
    # a pickle (what torch.save writes) under a checkpoint's name is refused, never unpickled
    torch.save({"policy": "p", "version": 1, "params": Trap()}, folder / "v00000001.ckpt")
    assert ParameterStore.restore(tmp_path).latest_version("p") is None


def test_a_truncated_checkpoint_is_refused_with_its_name(tmp_path):
    store = ParameterStore(tmp_path)
    store.publish("p", 1, params(1), persist=True)
    path = store.checkpoint_path("p", 1)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ValueError, match=r"v00000001\.ckpt"):
        load_checkpoint_file(path)


def test_store_wait_newer_wakes_on_publish():
    store = ParameterStore()
    assert store.wait_newer("p", None, 0.0) is None
    publisher = threading.Timer(0.05, store.publish, args=("p", 1, params(1)))
    publisher.start()
    assert store.wait_newer("p", None, TIMEOUT_S) == 1
    assert store.wait_newer("p", 1, 0.01) is None
    publisher.join()


# ------------------------------------------------------------------------------ server + client
class Service:
    """A ParameterServer polled by a background thread, with one subscribed client."""

    def __init__(self, store: ParameterStore, subscribe=("p", "marker")):
        self.server = ParameterServer(store)
        self.client = ParameterClient(
            self.server.request_endpoint, self.server.push_endpoint, subscribe=list(subscribe)
        )
        # Wait for the subscriptions to arrive (instead of sleeping) before polling elsewhere.
        self.server.wait_subscribers(len(subscribe), timeout_s=TIMEOUT_S)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop.is_set():
            self.server.poll(20)

    def close(self):
        self._stop.set()
        self._thread.join(TIMEOUT_S)
        self.client.close()
        self.server.close()


@pytest.fixture
def service(tmp_path):
    svc = Service(ParameterStore(tmp_path))
    yield svc
    svc.close()


def flush_pushes(client: ParameterClient, marker: list[int]) -> None:
    """Return once every push sent so far has reached ``client``.

    Pushes travel in order over one connection, so once a push to "marker" sent after them
    arrives, so have they.
    """
    marker[0] += 1
    client.publish("marker", marker[0], {}, timeout_s=TIMEOUT_S)
    assert client.poll_latest("marker", timeout_s=TIMEOUT_S)[0] == marker[0]


def test_publish_reaches_a_subscriber(service):
    service.client.publish("p", 1, params(1), timeout_s=TIMEOUT_S)
    version, got = service.client.poll_latest("p", timeout_s=TIMEOUT_S)
    assert version == 1
    assert_params(got, params(1))
    assert got["model"]["w"].flags.writeable
    assert service.client.poll_latest("p") is None
    assert service.server.stats["pushes"] == 1


def test_poll_latest_returns_only_the_newest_and_never_an_old_one(service):
    client, marker = service.client, [0]
    for v in (1, 2, 3):
        client.publish("p", v, params(v), timeout_s=TIMEOUT_S)
    flush_pushes(client, marker)
    version, got = client.poll_latest("p")
    assert version == 3
    assert_params(got, params(3))
    assert client.poll_latest("p") is None
    assert client.stats["pushes"] == 3 + 1

    client.publish("p", 4, params(4), timeout_s=TIMEOUT_S)
    assert client.get("p", timeout_s=TIMEOUT_S)[0] == 4  # loading latest counts as handed out
    flush_pushes(client, marker)
    assert client.poll_latest("p") is None


def test_get_by_version_and_tag(service):
    client = service.client
    for v in (1, 2, 3):
        client.publish("p", v, params(v), persist=(v == 2), timeout_s=TIMEOUT_S)
    client.tag("p", 2, "eval", timeout_s=TIMEOUT_S)
    assert client.get("p", 1, timeout_s=TIMEOUT_S)[0] == 1
    version, got = client.get("p", "eval", timeout_s=TIMEOUT_S)
    assert version == 2
    assert_params(got, params(2))
    assert service.server.store.checkpoint_path("p", 2).is_file()


def test_refused_requests_raise_their_own_type(service):
    client = service.client
    client.publish("p", 1, params(1), timeout_s=TIMEOUT_S)
    with pytest.raises(ParameterNotFoundError, match="no parameters for policy 'nope'; known: "):
        client.get("nope", timeout_s=TIMEOUT_S)
    with pytest.raises(
        ParameterNotFoundError, match=r"policy 'p' has no version 7 \(latest is 1\)"
    ):
        client.get("p", 7, timeout_s=TIMEOUT_S)
    with pytest.raises(VersionError, match="policy 'p' is already at version 1"):
        client.publish("p", 1, params(1), timeout_s=TIMEOUT_S)
    with pytest.raises(PolicyNameError, match=r"policy name '\.\./etc' is not allowed"):
        client.publish("../etc", 1, params(1), timeout_s=TIMEOUT_S)
    with pytest.raises(UserError, match=r"not subscribed to 'q'; pass subscribe=\['q'\]"):
        client.poll_latest("q")
    assert service.server.stats["errors"] == 4
    assert client.get("p", timeout_s=TIMEOUT_S)[0] == 1


def test_garbage_is_counted_and_dropped(service):
    ctx = wire.context()
    raw = wire.socket_options(ctx.socket(zmq.DEALER))
    raw.connect(service.server.request_endpoint)
    rng = np.random.default_rng(5)
    try:
        for _ in range(20):
            raw.send_multipart([rng.bytes(int(rng.integers(1, 40))) for _ in range(3)])
        raw.send_multipart([b"", b"\xff\x00garbage"])  # delimiter, then not msgpack
        wire.send(raw, "publish", {"policy": "p", "version": 1})  # no id: cannot be answered
        wire.send(raw, "steal", {"id": 1})  # unknown kind: answered with an error
        error = wire.recv(raw, timeout_ms=int(TIMEOUT_S * 1000))[1]
        assert error.kind == "error"
        assert error.body == {"id": 1, "type": "WireError", "error": "unknown request kind 'steal'"}
        wire.send(raw, "get", {"id": 2, "policy": "p", "version": [1]})
        error = wire.recv(raw, timeout_ms=int(TIMEOUT_S * 1000))[1]
        assert error.body["error"] == "'get' request needs an int or str 'version', got [1]"
    finally:
        raw.close(linger=0)
    assert service.server.stats["bad_messages"] == 20 + 1 + 1 + 1 + 1
    # Raw bytes on the TCP port: ZeroMQ may take them for a ZMTP 1.0 peer's messages.
    host, port = service.server.request_endpoint.removeprefix("tcp://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as s:
        s.sendall(rng.bytes(4096))
    service.client.publish("p", 1, params(1), timeout_s=TIMEOUT_S)
    assert service.client.get("p", timeout_s=TIMEOUT_S)[0] == 1


def test_unanswered_request_times_out_and_a_late_reply_is_ignored():
    ctx = wire.context()
    silent = wire.socket_options(ctx.socket(zmq.ROUTER))
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    client = ParameterClient(f"tcp://127.0.0.1:{port}")
    try:
        start = time.monotonic()
        with pytest.raises(PeerTimeoutError, match=r"did not answer 'get' within 0.2s"):
            client.get("p", timeout_s=0.2)
        assert 0.15 < time.monotonic() - start < 2.0
        envelope, first = wire.recv(silent, timeout_ms=int(TIMEOUT_S * 1000))
        wire.send(silent, "params", {"id": first.body["id"], "version": 1}, envelope=envelope)

        answer = threading.Thread(target=_answer_twice, args=(silent,))
        answer.start()
        assert client.get("p", timeout_s=TIMEOUT_S) == (2, None)
        answer.join(TIMEOUT_S)
        assert client.stats["timeouts"] == 1
        assert client.stats["stale_replies"] == 1
    finally:
        client.close()
        silent.close(linger=0)


def _answer_twice(router: zmq.Socket) -> None:
    """Reply to one request first with a wrong id, then properly."""
    envelope, request = wire.recv(router, timeout_ms=int(TIMEOUT_S * 1000))
    wire.send(router, "params", {"id": -5, "version": 99}, envelope=envelope)
    wire.send(router, "params", {"id": request.body["id"], "version": 2}, envelope=envelope)


def test_wait_subscribers_times_out_without_subscribers():
    server = ParameterServer(ParameterStore())
    try:
        with pytest.raises(PeerTimeoutError, match="0 of 1 subscriptions to policy 'p' arrived"):
            server.wait_subscribers(1, policy="p", timeout_s=0.1)
    finally:
        server.close()


def test_unsubscribing_is_counted():
    server = ParameterServer(ParameterStore())
    client = ParameterClient(server.request_endpoint, server.push_endpoint, subscribe=["p"])
    try:
        server.wait_subscribers(1, policy="p", timeout_s=TIMEOUT_S)
        client.close()
        deadline = time.monotonic() + TIMEOUT_S
        while server.subscriber_count("p") and time.monotonic() < deadline:
            server.poll(50)
        assert server.subscriber_count("p") == 0
    finally:
        server.close()


def test_one_million_float_push_round_trip(service):
    weights = {"w": np.random.default_rng(0).standard_normal(1_000_000).astype(np.float32)}
    start = time.perf_counter()
    service.client.publish("p", 1, weights, timeout_s=TIMEOUT_S)
    version, got = service.client.poll_latest("p", timeout_s=TIMEOUT_S)
    seconds = time.perf_counter() - start
    assert version == 1
    np.testing.assert_array_equal(got["w"], weights["w"])
    print(f"\n1M float32 publish + push round trip: {seconds * 1000:.1f} ms")


# --------------------------------------------------------------------------- in-process service
def test_inproc_service_has_the_same_semantics(tmp_path):
    store = ParameterStore(tmp_path)
    trainer, worker = InprocParameterService(store), InprocParameterService(store)
    assert isinstance(worker, ParameterClientBase)
    assert worker.poll_latest("p") is None
    live = {"w": torch.zeros(3), "h": np.zeros(2)}
    trainer.publish("p", 1, live, persist=True)
    live["w"] += 1  # the trainer keeps training: the published version must not change
    live["h"][:] = 1
    version, got = worker.poll_latest("p")
    assert version == 1
    assert isinstance(got["w"], np.ndarray)  # what a socket would deliver
    np.testing.assert_array_equal(got["w"], np.zeros(3, np.float32))
    np.testing.assert_array_equal(got["h"], np.zeros(2))
    assert worker.poll_latest("p") is None
    for v in (2, 3):
        trainer.publish("p", v, params(v))
    assert worker.poll_latest("p")[0] == 3
    trainer.publish("p", 4, params(4))
    assert worker.get("p")[0] == 4
    assert worker.poll_latest("p") is None
    trainer.tag("p", 1, "eval")
    assert worker.get("p", "eval")[0] == 1
    with pytest.raises(VersionError, match="already at version 4"):
        trainer.publish("p", 2, params(2))
    with pytest.raises(ParameterNotFoundError, match="no parameters for policy 'q'"):
        worker.get("q")
    with pytest.raises(WireError, match="dtype object is not allowed"):
        trainer.publish("p", 5, {"bad": np.array([object()])})
    assert store.checkpoint_path("p", 1).is_file()


def test_inproc_poll_latest_can_wait():
    service = InprocParameterService()
    publisher = threading.Timer(0.05, service.publish, args=("p", 1, params(1)))
    publisher.start()
    assert service.poll_latest("p", timeout_s=TIMEOUT_S)[0] == 1
    publisher.join()


def test_remote_error_types_are_a_fixed_set(service):
    # A reply naming some other type becomes a plain OperationalError, never an import.
    ctx = wire.context()
    router = wire.socket_options(ctx.socket(zmq.ROUTER))
    port = router.bind_to_random_port("tcp://127.0.0.1")
    client = ParameterClient(f"tcp://127.0.0.1:{port}")
    try:
        replier = threading.Thread(target=_reply_error, args=(router, "os.system"))
        replier.start()
        with pytest.raises(OperationalError, match=r"^boom$") as info:
            client.get("p", timeout_s=TIMEOUT_S)
        assert type(info.value) is OperationalError
        replier.join(TIMEOUT_S)
    finally:
        client.close()
        router.close(linger=0)


def _reply_error(router: zmq.Socket, error_type: str) -> None:
    envelope, request = wire.recv(router, timeout_ms=int(TIMEOUT_S * 1000))
    body = {"id": request.body["id"], "type": error_type, "error": "boom"}
    wire.send(router, "error", body, envelope=envelope)
