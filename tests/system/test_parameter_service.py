"""Tests for the parameter store, server and clients (real loopback sockets, random ports)."""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq
from served import ServedInThread

from api.errors import OperationalError, UserError
from system.errors import (
    ParameterNotFoundError,
    PeerTimeoutError,
    PolicyNameError,
    VersionError,
    WireError,
)
from system.parameters.client import ParameterClient
from system.parameters.inproc import InprocParameterService
from system.parameters.interfaces import ParameterClientBase
from system.parameters.service import SHM_TOPIC, ParameterServer
from system.parameters.store import ParameterStore, load_checkpoint_file
from system.streams import shm, transport

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


def test_store_tells_when_a_version_leaves_memory():
    store = ParameterStore(keep=2)
    left = []
    store.on_evict(lambda policy, version: left.append((policy, version)))
    store.on_evict(lambda policy, version: 1 / 0)  # a failing listener changes nothing
    for v in (1, 2, 3):
        store.publish("p", v, params(v))
    store.tag("p", 2, "eval")
    store.publish("p", 4, params(4))
    assert left == [("p", 1)]
    store.tag("p", 4, "eval")  # version 2 is neither tagged nor among the newest 2 now
    assert left == [("p", 1), ("p", 2)]
    assert store.versions_in_memory("p") == [3, 4]


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
class Service(ServedInThread):
    """A ParameterServer polled by a background thread, with one subscribed client."""

    def __init__(self, store: ParameterStore, subscribe=("p", "marker"), shm=True, **server):
        server = ParameterServer(store, **server)
        self.client = ParameterClient(
            server.request_endpoint,
            server.push_endpoint,
            subscribe=list(subscribe),
            shm=shm,
            shm_min_bytes=0,  # every version through shared memory, however small
        )
        # Wait for the subscriptions to arrive (instead of sleeping) before polling elsewhere.
        server.wait_subscribers(len(subscribe), timeout_s=TIMEOUT_S)
        super().__init__(server)

    def close(self):
        self.client.close()
        super().close()


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    """A shared-memory directory of this test's own (in /dev/shm when there is one), made the
    configured one for this process and the processes it starts."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tmp_path
    directory = Path(tempfile.mkdtemp(prefix="pytest-shm-", dir=base))
    monkeypatch.setenv(shm.ENV_DIR, str(directory))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def troupe_files(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith("troupe-"))


@pytest.fixture(params=["shm", "socket"])
def service(request, tmp_path, monkeypatch):
    """Every service test runs twice: weights through shared memory, and over the socket."""
    if request.param == "shm":
        request.getfixturevalue("shm_dir")
    else:
        monkeypatch.setenv(shm.ENV_DIR, "off")
    svc = Service(ParameterStore(tmp_path))
    assert (svc.server.shm is not None) == (request.param == "shm")
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
    ctx = transport.context()
    raw = transport.socket_options(ctx.socket(zmq.DEALER))
    raw.connect(service.server.request_endpoint)
    rng = np.random.default_rng(5)
    try:
        for _ in range(20):
            raw.send_multipart([rng.bytes(int(rng.integers(1, 40))) for _ in range(3)])
        raw.send_multipart([b"", b"\xff\x00garbage"])  # delimiter, then not msgpack
        transport.send(raw, "publish", {"policy": "p", "version": 1})  # no id: cannot be answered
        transport.send(raw, "steal", {"id": 1})  # unknown kind: answered with an error
        error = transport.recv(raw, timeout_ms=int(TIMEOUT_S * 1000))[1]
        assert error.kind == "error"
        assert error.body == {"id": 1, "type": "WireError", "error": "unknown request kind 'steal'"}
        transport.send(raw, "get", {"id": 2, "policy": "p", "version": [1]})
        error = transport.recv(raw, timeout_ms=int(TIMEOUT_S * 1000))[1]
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
    ctx = transport.context()
    silent = transport.socket_options(ctx.socket(zmq.ROUTER))
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    client = ParameterClient(f"tcp://127.0.0.1:{port}")
    try:
        start = time.monotonic()
        with pytest.raises(PeerTimeoutError, match=r"did not answer 'get' within 0.2s"):
            client.get("p", timeout_s=0.2)
        assert 0.15 < time.monotonic() - start < 2.0
        envelope, first = transport.recv(silent, timeout_ms=int(TIMEOUT_S * 1000))
        transport.send(silent, "params", {"id": first.body["id"], "version": 1}, envelope=envelope)

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
    envelope, request = transport.recv(router, timeout_ms=int(TIMEOUT_S * 1000))
    transport.send(router, "params", {"id": -5, "version": 99}, envelope=envelope)
    transport.send(router, "params", {"id": request.body["id"], "version": 2}, envelope=envelope)


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
    ctx = transport.context()
    router = transport.socket_options(ctx.socket(zmq.ROUTER))
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
    envelope, request = transport.recv(router, timeout_ms=int(TIMEOUT_S * 1000))
    body = {"id": request.body["id"], "type": error_type, "error": "boom"}
    transport.send(router, "error", body, envelope=envelope)


# ------------------------------------------------------------------------------ shared memory
def weights(step: float, n: int = 100_000) -> dict:
    """Large enough that the array takes a frame (a place in the file) of its own."""
    return {"model": {"w": np.full((n,), step, np.float32)}, "step": int(step)}


def until(condition, what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def versions_in(directory: Path) -> set[int]:
    return {int(n.split("-v")[-1][:8]) for n in troupe_files(directory) if n.endswith(".params")}


def publish_until_notices(client: ParameterClient, policy: str, start: int) -> int:
    """Publish versions from ``start`` until ``client`` (subscribed to ``policy``) receives one
    through shared memory (its subscription switched); returns the next version number."""
    version = start
    while client.stats["shm_pushes"] == 0:
        assert version < start + 50, "no version ever came through shared memory"
        client.publish(policy, version, weights(version), timeout_s=TIMEOUT_S)
        assert client.poll_latest(policy, timeout_s=TIMEOUT_S)[0] == version
        version += 1
    return version


def _shm_server(out, stop) -> None:
    """Child process: a parameter server keeping 2 versions, with the configured shm dir."""
    server = ParameterServer(ParameterStore(keep=2))
    out.put((server.request_endpoint, server.push_endpoint, server.shm is not None))
    try:
        while not stop.is_set():
            server.poll(20)
    finally:
        server.close()


def _shm_subscriber(request, push, out, stop) -> None:
    """Child process: a subscribed client reporting each version it gets, then scribbling on it
    (a private mapping: nobody else may see that)."""
    client = ParameterClient(request, push, subscribe=["p"])
    try:
        while not stop.is_set():
            got = client.poll_latest("p", timeout_s=0.05)
            if got is None:
                continue
            version, params = got
            w = params["model"]["w"]
            out.put(
                (version, float(w.sum()), len(w), w.flags.writeable, client.stats["shm_pushes"])
            )
            w[:] = -1.0
    finally:
        client.close()


@pytest.mark.multiprocess
def test_shm_round_trip_across_processes(shm_dir):
    ctx = multiprocessing.get_context("spawn")
    stop, server_out, arrivals = ctx.Event(), ctx.Queue(), ctx.Queue()
    server = ctx.Process(target=_shm_server, args=(server_out, stop), daemon=True)
    server.start()
    children = [server]
    try:
        request, push, has_shm = server_out.get(timeout=60)
        assert has_shm
        child = ctx.Process(target=_shm_subscriber, args=(request, push, arrivals, stop))
        child.start()
        children.append(child)
        with ParameterClient(request, shm_min_bytes=0) as publisher:
            version, via_shm = 1, 0
            while via_shm == 0:  # until the subscriber switched to notices
                assert version < 100, "the subscriber never got a version through shared memory"
                publisher.publish("p", version, weights(version, 1000), timeout_s=TIMEOUT_S)
                try:
                    got, _, _, _, via_shm = arrivals.get(timeout=0.5)
                except Exception:
                    got = None
                version += 1
            while not arrivals.empty():
                arrivals.get()
            big = weights(7.0, 1_000_000)
            publisher.publish("p", version, big, timeout_s=TIMEOUT_S)
            got = arrivals.get(timeout=30)
            assert got[:4] == (version, 7.0 * 1_000_000, 1_000_000, True)
            assert got[4] > via_shm  # it came through shared memory
            assert publisher.stats["shm_publishes"] == version
            # the subscriber scribbled on its arrays: the stored version is untouched
            number, stored = publisher.get("p", timeout_s=TIMEOUT_S)
            assert number == version
            np.testing.assert_array_equal(stored["model"]["w"], big["model"]["w"])
            until(lambda: versions_in(shm_dir) == {version - 1, version}, "2 versions kept")
            files = troupe_files(shm_dir)
            assert sum(n.endswith(".lock") for n in files) == 1
            stop.set()
            server.join(60)  # a bound against a hang, not a speed check: a loaded machine is slow
            assert server.exitcode == 0
        assert troupe_files(shm_dir) == []  # the service and the publisher left nothing
    finally:
        stop.set()
        for process in children:
            process.join(TIMEOUT_S)
            if process.is_alive():
                process.kill()


def test_shm_publish_and_push_in_one_process(shm_dir, tmp_path):
    svc = Service(ParameterStore(tmp_path, keep=2))
    try:
        client = svc.client
        version = publish_until_notices(client, "p", 1)
        assert client.shm_peer is not None and client.shm_peer.dir == shm_dir
        client.publish("p", version, weights(3.0), persist=True, timeout_s=TIMEOUT_S)
        got_version, got = client.poll_latest("p", timeout_s=TIMEOUT_S)
        assert got_version == version
        assert got["model"]["w"].flags.writeable and got["step"] == 3
        np.testing.assert_array_equal(got["model"]["w"], weights(3.0)["model"]["w"])
        # persisted from the mapping: the checkpoint file reads back like any other
        on_disk = load_checkpoint_file(svc.server.store.checkpoint_path("p", version))
        np.testing.assert_array_equal(on_disk["params"]["model"]["w"], got["model"]["w"])
        assert svc.server.stats["shm_publishes"] == client.stats["shm_publishes"] == version
        # a final save of the latest version again: written to disk, its new file not kept
        client.publish("p", version, weights(3.0), persist=True, timeout_s=TIMEOUT_S)
        files = lambda: [n for n in troupe_files(shm_dir) if n.endswith(".params")]  # noqa: E731
        until(lambda: len(files()) == 2, "the final save's file gone")
        assert versions_in(shm_dir) == {version - 1, version}
    finally:
        svc.close()
    assert troupe_files(shm_dir) == []


def test_shm_superseded_versions_are_unlinked_and_readers_keep_theirs(shm_dir, tmp_path):
    svc = Service(ParameterStore(tmp_path, keep=2))
    try:
        client, server = svc.client, svc.server
        version = publish_until_notices(client, "p", 1)
        for v in range(version, version + 3):
            client.publish("p", v, weights(v), persist=(v == version), timeout_s=TIMEOUT_S)
        last = version + 2
        until(lambda: versions_in(shm_dir) == {last - 1, last}, "only the newest 2 files")
        # a reader that mapped a version before it is dropped keeps reading it after
        layout = server._layouts[("p", last)]
        held = server.shm.peer.open(layout, "p", last, writable=False)
        client.tag("p", last - 1, "eval", timeout_s=TIMEOUT_S)
        for v in (last + 1, last + 2):
            client.publish("p", v, weights(v), timeout_s=TIMEOUT_S)
        until(lambda: versions_in(shm_dir) == {last - 1, last + 1, last + 2}, "tagged one kept")
        np.testing.assert_array_equal(held["model"]["w"], weights(last)["model"]["w"])
        # a version dropped from memory but persisted is still there, from its checkpoint
        got_version, got = client.get("p", version, timeout_s=TIMEOUT_S)
        assert got_version == version
        np.testing.assert_array_equal(got["model"]["w"], weights(version)["model"]["w"])
        # too late for a dropped version: the file is gone (a newer version's notice follows)
        with pytest.raises(FileNotFoundError):
            client.shm_peer.open(layout, "p", last, writable=True)
    finally:
        svc.close()
    assert troupe_files(shm_dir) == []


def _killed_service(directory: str) -> None:
    """Child process: a service's shared memory with one version in it, then SIGKILL."""
    area = shm.ShmArea(directory)
    area.adopt(area.peer.write("p", 1, weights(1))["name"])
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.multiprocess
def test_files_of_dead_services_are_removed_and_live_ones_kept(shm_dir):
    child = multiprocessing.get_context("spawn").Process(
        target=_killed_service, args=(str(shm_dir),)
    )
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    dead = troupe_files(shm_dir)
    assert len(dead) == 2 and any(n.endswith(".params") for n in dead)

    live = shm.ShmArea(shm_dir)  # already cleans up the killed one
    assert live.removed_stale == 2
    live.adopt(live.peer.write("p", 1, weights(1))["name"])
    mine = troupe_files(shm_dir)
    old = shm_dir / "troupe-0123456789abcdef-p-v00000001-0123456789abcdef.params"
    fresh = shm_dir / "troupe-fedcba9876543210-0123456789abcdef.part"
    other = shm_dir / "not-troupe-0123456789abcdef.lock"
    for path in (old, fresh, other):
        path.write_bytes(b"x")
    os.utime(old, (time.time() - 2 * shm.STALE_AGE_S,) * 2)  # no lock, and old: a leftover
    second = shm.ShmArea(shm_dir)
    assert second.removed_stale == 1
    assert troupe_files(shm_dir) == sorted([*mine, fresh.name, f"{second.prefix}.lock"])
    second.close()
    live.close()
    assert troupe_files(shm_dir) == [fresh.name]  # too young to say it is a leftover
    assert other.exists()


def test_a_service_sweeps_files_it_never_took(shm_dir):
    area = shm.ShmArea(shm_dir)
    try:
        taken = area.peer.write("p", 1, weights(1))["name"]
        area.adopt(taken)
        dropped = area.peer.write("p", 2, weights(2))["name"]  # its publisher died
        area.peer.prepare(400_064)
        assert area.sweep() == 0  # all too young
        assert area.sweep(min_age_s=0) == 2  # the unadopted version and the spare
        assert troupe_files(shm_dir) == sorted([taken, f"{area.prefix}.lock"])
        assert not (shm_dir / dropped).exists()
        area.peer.write("p", 3, weights(3))  # a swept spare is noticed, not used
    finally:
        area.peer.close()
        area.close()
    assert troupe_files(shm_dir) == []


def test_malformed_shm_publishes_are_refused(shm_dir):
    svc = Service(ParameterStore())
    ctx = transport.context()
    raw = transport.socket_options(ctx.socket(zmq.DEALER))
    raw.connect(svc.server.request_endpoint)
    area = svc.server.shm
    good = area.peer.write("p", 1, weights(1))
    lookalike = f"{area.prefix}-p-v00000001-{'0' * 16}.params"
    (shm_dir / f"{area.prefix}-p-v00000001-{'1' * 16}.params").symlink_to(shm_dir / good["name"])
    os.mkfifo(shm_dir / f"{area.prefix}-p-v00000001-{'2' * 16}.params")
    (shm_dir / f"{area.prefix}-p-v00000001-{'3' * 16}.params").write_bytes(b"NOTMAGIC" * 8)
    bad = {
        "../../etc/passwd": {**good, "name": "../../etc/passwd"},
        "/etc/passwd": {**good, "name": "/etc/passwd"},
        "another service's": {
            **good,
            "name": good["name"].replace(area.prefix, "troupe-" + "a" * 16),
        },
        "another version's": {**good, "name": good["name"].replace("v00000001", "v00000002")},
        "missing": {**good, "name": lookalike},
        "symlink": {**good, "name": f"{area.prefix}-p-v00000001-{'1' * 16}.params"},
        "fifo": {**good, "name": f"{area.prefix}-p-v00000001-{'2' * 16}.params"},
        "no magic": {**good, "name": f"{area.prefix}-p-v00000001-{'3' * 16}.params", "size": 64},
        "size too big": {**good, "size": good["size"] + 64},
        "frame outside": {**good, "frames": [[good["size"] - 8, 400_000]]},
        "frames overlap": {**good, "frames": [[64, 400_000], [100, 8]]},
        "frames missing": {**good, "frames": []},
        "header garbage": {**good, "header": b"\xc1garbage"},
        "not a dict": "a string",
        "extra keys": {**good, "path": "/etc/passwd"},
    }
    try:
        for i, (case, layout) in enumerate(bad.items()):
            body = {"id": i, "policy": "p", "version": 1, "persist": False, "shm": layout}
            transport.send(raw, "publish", body)
            reply = transport.recv(raw, timeout_ms=int(TIMEOUT_S * 1000))[1]
            assert reply.kind == "error", case  # the file's fault: a client sends by socket
            assert reply.body["type"] == "SharedMemoryRefused", case
        assert svc.server.stats["bad_messages"] == len(bad)
        assert svc.server.store.latest_version("p") is None
        assert os.path.exists("/etc/passwd")
        assert (shm_dir / good["name"]).exists()  # refused requests unlink nothing
        transport.send(
            raw, "publish", {"id": 99, "policy": "p", "version": 1, "persist": False, "shm": good}
        )
        reply = transport.recv(raw, timeout_ms=int(TIMEOUT_S * 1000))[1]
        assert (reply.kind, reply.body) == ("ack", {"id": 99, "version": 1})
        np.testing.assert_array_equal(
            svc.client.get("p")[1]["model"]["w"], weights(1)["model"]["w"]
        )
    finally:
        raw.close(linger=0)
        svc.close()


class FakeService:
    """A ROUTER that answers hello with a real ShmArea's info and an XPUB to push anything."""

    def __init__(self, directory: Path):
        self.area = shm.ShmArea(directory)
        ctx = transport.context()
        self.router = transport.socket_options(ctx.socket(zmq.ROUTER))
        self.xpub = transport.socket_options(ctx.socket(zmq.XPUB))
        self.xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.request = f"tcp://127.0.0.1:{self.router.bind_to_random_port('tcp://127.0.0.1')}"
        self.push = f"tcp://127.0.0.1:{self.xpub.bind_to_random_port('tcp://127.0.0.1')}"

    def answer_hello(self) -> None:
        envelope, hello = transport.recv(self.router, timeout_ms=int(TIMEOUT_S * 1000))
        assert hello.kind == "hello"
        body = {"id": hello.body["id"], "shm": self.area.info()}
        transport.send(self.router, "hello", body, envelope=envelope)

    def wait_subscription(self, topic: bytes) -> None:
        while True:
            assert self.xpub.poll(int(TIMEOUT_S * 1000)), f"no subscription to {topic!r}"
            if self.xpub.recv() == b"\x01" + topic:
                return

    def notice(self, version: int, layout) -> None:
        body = {"policy": "p", "version": version, "shm": layout}
        transport.send(self.xpub, "params", body, envelope=[SHM_TOPIC + b"p"])

    def close(self) -> None:
        self.router.close(linger=0)
        self.xpub.close(linger=0)
        self.area.close()


def test_malformed_notices_are_counted_and_the_client_falls_back(shm_dir):
    fake = FakeService(shm_dir)
    client = ParameterClient(fake.request, fake.push, subscribe=["p"])
    try:
        fake.wait_subscription(b"p")
        fake.answer_hello()
        until(lambda: client.poll_latest("p") is None and client.shm_peer is not None, "hello")
        fake.wait_subscription(SHM_TOPIC + b"p")
        good = fake.area.peer.write("p", 1, weights(1))
        fake.notice(1, good)
        version, got = client.poll_latest("p", timeout_s=TIMEOUT_S)
        assert version == 1 and got["model"]["w"].flags.writeable
        np.testing.assert_array_equal(got["model"]["w"], weights(1)["model"]["w"])
        for version, layout in ((2, good), (3, 17)):  # version 1's file; not a layout at all
            fake.notice(version, layout)
            assert client.poll_latest("p", timeout_s=0.2) is None
        assert client.stats["bad_messages"] == 2
        assert client.shm_peer is not None
        fake.notice(4, {**good, "name": f"{fake.area.prefix}-p-v00000004-{'0' * 16}.params"})
        assert client.poll_latest("p", timeout_s=0.2) is None  # missing: the third in a row
        assert client.stats["shm_missed"] == 1
        assert client.shm_peer is None  # back to full pushes, for good
        fake.wait_subscription(b"p")
        transport.send(
            fake.xpub,
            "params",
            {"policy": "p", "version": 5, "params": weights(5)},
            envelope=[b"p"],
        )
        version, got = client.poll_latest("p", timeout_s=TIMEOUT_S)
        assert version == 5 and got["model"]["w"].flags.writeable
        np.testing.assert_array_equal(got["model"]["w"], weights(5)["model"]["w"])
    finally:
        client.close()
        fake.close()


def test_shm_falls_back_to_the_socket(shm_dir, tmp_path, monkeypatch):
    # a service without shared memory; a client that does not want it; a service whose
    # directory is not this process's configured one: all over the socket
    other = tmp_path / "other"
    other.mkdir()
    for server, client in (({"shm_dir": None}, True), ({}, False), ({"shm_dir": other}, True)):
        svc = Service(ParameterStore(), shm=client, **server)
        try:
            svc.client.publish("p", 1, weights(1), timeout_s=TIMEOUT_S)
            version, got = svc.client.poll_latest("p", timeout_s=TIMEOUT_S)
            assert version == 1 and got["model"]["w"].flags.writeable
            np.testing.assert_array_equal(got["model"]["w"], weights(1)["model"]["w"])
            assert svc.client.shm_peer is None, (server, client)
            assert svc.client.stats["shm_publishes"] == svc.server.stats["shm_publishes"] == 0
        finally:
            svc.close()
    assert troupe_files(shm_dir) == [] and troupe_files(other) == []

    # a service that refuses a file: that version goes by socket, then shared memory again
    svc = Service(ParameterStore())
    try:
        client = svc.client
        version = publish_until_notices(client, "p", 1)
        refuse = monkeypatch.setattr
        refuse(svc.server.shm, "open", lambda *a: (_ for _ in ()).throw(WireError("no")))
        client.publish("p", version, weights(version), timeout_s=TIMEOUT_S)
        assert client.shm_peer is None and client.stats["shm_failures"] == 1
        assert client.poll_latest("p", timeout_s=TIMEOUT_S)[0] == version
        monkeypatch.undo()
        monkeypatch.setenv(shm.ENV_DIR, str(shm_dir))
        client.publish("p", version + 1, weights(version + 1), timeout_s=TIMEOUT_S)
        assert client.shm_peer is not None
        assert client.poll_latest("p", timeout_s=TIMEOUT_S)[0] == version + 1
        # a full directory: that version goes by socket, and the next tries again
        full = OSError(28, "No space left on device")
        monkeypatch.setattr(shm.ShmPeer, "write_frames", lambda *a: (_ for _ in ()).throw(full))
        publishes = client.stats["shm_publishes"]
        client.publish("p", version + 2, weights(version + 2), timeout_s=TIMEOUT_S)
        assert client.stats["shm_write_errors"] == 1
        assert client.stats["shm_publishes"] == publishes
        assert client.poll_latest("p", timeout_s=TIMEOUT_S)[0] == version + 2
        assert client.shm_peer is not None
        # versions too small to be worth a file go over the socket
        monkeypatch.undo()
        monkeypatch.setenv(shm.ENV_DIR, str(shm_dir))
        client.shm_min_bytes = 400_001
        client.publish("p", version + 3, weights(version + 3), timeout_s=TIMEOUT_S)
        assert client.stats["shm_publishes"] == publishes
        client.shm_min_bytes = 400_000
        client.publish("p", version + 4, weights(version + 4), timeout_s=TIMEOUT_S)
        assert client.stats["shm_publishes"] == publishes + 1
        assert client.poll_latest("p", timeout_s=TIMEOUT_S)[0] == version + 4
    finally:
        svc.close()


def test_durable_store_writes_every_version_and_a_restart_starts_from_the_newest(tmp_path):
    store = ParameterStore(tmp_path, keep=2, durable=True)
    for version in range(1, 6):
        store.publish("p", version, {"w": np.full(3, float(version), np.float32)}, persist=False)
    store.publish("p", 6, {"w": np.full(3, 6.0, np.float32)}, persist=True)  # a checkpoint
    store.publish("p", 7, {"w": np.full(3, 7.0, np.float32)})
    folder = tmp_path / "checkpoints" / "p"
    (folder / ".latest.ckpt.tmp-999999999-1").write_bytes(b"half")  # a writer killed mid-way
    restarted = ParameterStore(tmp_path, keep=2, durable=True)
    assert restarted.load_from_disk() == {"p": 7}  # latest.ckpt is newer than v00000006.ckpt
    version, params = restarted.get("p")
    assert version == 7 and params["w"].tolist() == [7.0, 7.0, 7.0]
    assert restarted.get("p", 6)[0] == 6
    assert not list(folder.glob(".*tmp*"))


def test_a_full_disk_is_a_run_folder_error_naming_the_file_and_leaves_no_tmp(tmp_path):
    from api.errors import RunFolderError

    store = ParameterStore(tmp_path, durable=True)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "p").write_text("not a folder")  # writes under it must fail
    with pytest.raises(RunFolderError, match=r"cannot write .*latest\.ckpt: .*; "):
        store.publish("p", 1, {"w": np.zeros(3, np.float32)})
    assert store.latest_version("p") is None  # not durable: not published, not announced


# ------------------------------------------------------------ publishing without waiting
def test_a_publish_not_waited_for_is_stored_and_pushed(service):
    client, marker = service.client, [0]
    for v in (1, 2, 3):
        client.publish_nowait("p", v, params(v), timeout_s=TIMEOUT_S)  # settles the one before
    client.settle()
    assert client.get("p", timeout_s=TIMEOUT_S)[0] == 3
    flush_pushes(client, marker)
    assert service.server.stats["errors"] == 0
    assert client.stats["stale_replies"] == 0  # every answer went to the publish it answered


def test_what_a_publish_not_waited_for_raised_comes_with_the_next_call(service):
    client = service.client
    client.publish("p", 2, params(2), timeout_s=TIMEOUT_S)
    client.publish_nowait("p", 1, params(1), timeout_s=TIMEOUT_S)  # older: refused, later
    with pytest.raises(VersionError, match="policy 'p' is already at version 2"):
        client.publish_nowait("p", 3, params(3), timeout_s=TIMEOUT_S)
    client.publish_nowait("p", 3, params(3), timeout_s=TIMEOUT_S)  # said once, then goes on
    assert client.get("p", timeout_s=TIMEOUT_S)[0] == 3


def test_arrays_changed_after_a_publish_not_waited_for_do_not_change_the_version():
    """The trainer's next step may write the arrays it published. A large array, which the
    socket would send without a copy, is copied before ``publish_nowait`` returns: here the
    message waits in the client's queue (the service is not listening yet) while the array
    changes, and the service still receives the values published."""
    with socket.socket() as probe:  # a free port, not listening until the array has changed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = ParameterClient(f"tcp://127.0.0.1:{port}", shm=False)
    weights = np.zeros(1 << 18, np.float32)  # 1 MiB: far over the zero-copy threshold
    service = None
    try:
        client.publish_nowait("p", 1, {"w": weights}, timeout_s=TIMEOUT_S)
        weights += 7.0
        service = transport.socket_options(transport.context().socket(zmq.ROUTER))
        service.bind(f"tcp://127.0.0.1:{port}")
        _, message = transport.recv(service, timeout_ms=int(TIMEOUT_S * 1000), copy=True)
        assert message.kind == "publish" and message.body["version"] == 1
        assert float(np.abs(np.asarray(message.body["params"]["w"])).max()) == 0.0
    finally:
        client.close()
        if service is not None:
            service.close(linger=0)


def test_a_publish_not_waited_for_times_out_when_settled_not_when_sent():
    ctx = transport.context()
    silent = transport.socket_options(ctx.socket(zmq.ROUTER))
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    client = ParameterClient(f"tcp://127.0.0.1:{port}", shm=False)
    try:
        start = time.monotonic()
        client.publish_nowait("p", 1, params(1), timeout_s=3.0)
        assert time.monotonic() - start < 1.5  # sent, not waited for (a busy CI machine: slack)
        with pytest.raises(PeerTimeoutError, match=r"did not answer 'publish' within 3.0s"):
            client.settle()
        client.settle()  # nothing outstanding any more
    finally:
        client.close()
        silent.close(linger=0)
