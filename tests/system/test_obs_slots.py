"""Issue 15, item 2: observations through an actor's shared-memory slots on one host.

Real sockets on loopback, real files in a shared-memory directory of the test's own; the socket
then carries only a descriptor, a reused slot is never read as if it were the chunk sent, a
receiver that cannot map the sender's area keeps frames, and no file outlives its writer, also
when the writer is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from test_parameter_service import shm_dir, troupe_files  # noqa: F401 - a fixture
from test_workers import segment

from api.policy import RolloutRequest, RolloutResult
from system.errors import WireError
from system.streams import shm
from system.streams.inference import ZmqInferenceClient, ZmqInferenceServer
from system.streams.obs_slots import SlotReader, SlotWriter
from system.streams.samples import ZmqSampleConsumer, ZmqSampleProducer

ROOT = Path(__file__).resolve().parents[2]


def frames(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (n, 4, 84, 84), dtype=np.uint8)


def request(obs: np.ndarray) -> RolloutRequest:
    column = np.zeros((len(obs), 1))
    return RolloutRequest(obs=obs, on_reset=column.astype(bool),
                          is_evaluation=column.astype(bool),
                          client_id=np.arange(len(obs)).reshape(-1, 1),
                          request_id=column.astype(np.int64))  # fmt: skip


def result(n: int) -> RolloutResult:
    return RolloutResult(action=np.zeros(n, np.int64))


def test_a_slot_reads_back_what_was_written_and_a_reuse_is_detected(shm_dir):  # noqa: F811
    writer, reader = SlotWriter(), SlotReader()
    assert reader.accepts(writer.info)
    first = writer.put("samples", 2, 0, frames(3))
    np.testing.assert_array_equal(reader.copy(first), frames(3))
    view = reader.view(first)
    assert not view.flags.writeable
    writer.put("samples", 2, 0, frames(3, seed=1))  # the slot is written again
    assert reader.copy(first) is None  # its stamp changed: the old descriptor is refused
    np.testing.assert_array_equal(view, frames(3, seed=1))
    writer.close()
    assert troupe_files(shm_dir) == []


def test_descriptors_naming_foreign_files_or_bounds_are_refused(shm_dir):  # noqa: F811
    writer, reader = SlotWriter(), SlotReader()
    desc = writer.put("inference", 2, 1, frames(2))
    with pytest.raises(WireError, match="not one of an accepted sender"):
        reader.view(desc)  # no offer was accepted from this writer yet
    assert reader.accepts(writer.info)
    for bad, match in [
        ({**desc, "ring": "../../etc/passwd"}, "not one of an accepted sender"),
        ({**desc, "slot": 2}, "not one of the ring's 2"),
        ({**desc, "shape": [3, 4, 84, 84]}, "does not fit"),
        ({**desc, "dtype": "|O"}, "numeric 'dtype'"),
        ({k: v for k, v in desc.items() if k != "stamp"}, "must have keys"),
    ]:
        with pytest.raises(WireError, match=match):
            reader.view(bad)
    assert not reader.accepts({**writer.info, "probe": "0" * 32})  # not the area's own lock
    writer.close()


def test_requests_go_through_shared_memory_once_the_policy_worker_accepts(shm_dir):  # noqa: F811
    server = ZmqInferenceServer("tcp://127.0.0.1:*")
    client = ZmqInferenceClient({"p": server.endpoint}, slots=SlotWriter())
    try:
        for seq in range(1, 4):
            obs = frames(4, seed=seq)
            client.post("p", 0, seq, request(obs))
            (pending,) = server.gather(64, 0)
            np.testing.assert_array_equal(pending.request.obs, obs)
            # the first request carries the frames and an offer; the next ones a descriptor
            assert client.slots.bytes_written == (seq - 1) * obs.nbytes
            server.reply(pending, result(4), version=1)
            assert [r.seq for r in client.poll(5000)] == [seq]
        assert client.shm["p"] is True
        assert client.slots.bytes_written == 2 * obs.nbytes
    finally:
        client.close()
        server.close()
    assert troupe_files(shm_dir) == []


def test_without_shared_memory_on_the_receiver_frames_go_on(shm_dir, monkeypatch):  # noqa: F811
    client = ZmqInferenceClient({}, slots=SlotWriter())
    monkeypatch.setenv(shm.ENV_DIR, "off")  # the policy worker's host has none (or another)
    server = ZmqInferenceServer("tcp://127.0.0.1:*")
    client.connect("p", server.endpoint)
    try:
        for seq in (1, 2):
            client.post("p", 0, seq, request(frames(4)))
            (pending,) = server.gather(64, 0)
            np.testing.assert_array_equal(pending.request.obs, frames(4))  # frames, each time
            server.reply(pending, result(4), version=1)
            client.poll(5000)
        assert client.shm["p"] is False and client.slots.bytes_written == 0
    finally:
        client.close()
        server.close()


def take_acks(producer: ZmqSampleProducer, policy: str, timeout_s: float = 30.0) -> None:
    """Until the trainer acknowledged every chunk sent (its slot is free again): an ack is a
    message of its own, which a loaded machine may deliver after any fixed wait."""
    deadline = time.monotonic() + timeout_s
    while producer.in_flight[policy] and time.monotonic() < deadline:
        producer.flush()
        time.sleep(0.005)
    assert not producer.in_flight[policy], "no ack came"


def test_sample_chunks_go_through_slots_freed_by_acks(shm_dir):  # noqa: F811
    consumer = ZmqSampleConsumer("tcp://127.0.0.1:*")
    producer = ZmqSampleProducer({"p": [consumer.endpoint]}, slots=SlotWriter())
    try:
        for version in range(1, 6):
            chunk = segment(version=version)
            chunk.obs = frames(len(chunk.reward), seed=version)[:, None]
            producer.post("p", chunk)
            (got,) = consumer.poll(timeout_ms=5000, max_items=1)
            np.testing.assert_array_equal(got.obs, chunk.obs)
            assert got.policy_version[0, 0, 0] == version
            take_acks(producer, "p")
        assert producer.shm["p"] == 1 and producer.slots.bytes_written == 4 * chunk.obs.nbytes
        assert sorted(producer.free_slots["p"]) == [0, 1]  # every slot back
        assert consumer.reused_slots == 0
    finally:
        producer.close()
        consumer.close()
    assert troupe_files(shm_dir) == []


def test_the_files_of_a_killed_writer_go_with_the_next_area(shm_dir):  # noqa: F811
    code = textwrap.dedent("""
        import sys, numpy as np
        from system.streams.obs_slots import SlotWriter
        w = SlotWriter()
        w.put("inference", 4, 0, np.zeros((4, 4, 84, 84), np.uint8))
        print("written", flush=True)
        sys.stdin.read()
    """)
    env = {**os.environ, shm.ENV_DIR: str(shm_dir)}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "written"
        assert any(n.endswith(".ring") for n in troupe_files(shm_dir))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    area = shm.ShmArea(shm_dir)  # a restarted actor's, or the parameter service's
    area.close()
    assert troupe_files(shm_dir) == []
