"""The ZeroMQ sample stream's credits, the trainer's bounded gathering, and pacing."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import zmq
from test_workers import CountingEnv, EchoPolicy, StubTrainer, answer_all, eval_actor, segment

from system.ratelimit import Pace
from system.streams import transport
from system.streams.inference import InprocInferenceHub
from system.streams.samples import (
    ACK_MAX_BYTES,
    InprocSampleHub,
    ZmqSampleConsumer,
    ZmqSampleProducer,
)
from system.workers.trainer_worker import TrainerWorker, segment_source


@pytest.fixture
def stream():
    consumer = ZmqSampleConsumer("tcp://127.0.0.1:*")
    producer = ZmqSampleProducer({"p": [consumer.endpoint]})
    yield producer, consumer
    producer.close()
    consumer.close()


def take(consumer: ZmqSampleConsumer, timeout_ms: int = 5000):
    return consumer.poll(timeout_ms=timeout_ms, max_items=1)


def test_a_producer_sends_the_next_chunk_only_once_the_last_was_taken(stream):
    producer, consumer = stream
    producer.post("p", segment(version=1))
    producer.post("p", segment(version=2))
    assert producer.backlog == 1 and producer.backlogged  # one trainer: one chunk in flight
    assert take(consumer)[0].policy_version[0, 0, 0] == 1  # taking it acks it
    producer.flush(timeout_ms=5000)  # the ack arrives; the second chunk goes
    assert producer.backlog == 0
    assert take(consumer)[0].policy_version[0, 0, 0] == 2


def test_each_trainer_of_a_policy_earns_a_producer_one_credit():
    consumers = [ZmqSampleConsumer("tcp://127.0.0.1:*") for _ in range(2)]
    producer = ZmqSampleProducer({"p": [c.endpoint for c in consumers]})
    try:
        for v in range(3):
            producer.post("p", segment(version=v))
        assert producer.backlog == 1
        got = [take(c) for c in consumers]
        assert sorted(int(g[0].policy_version[0, 0, 0]) for g in got) == [0, 1]
    finally:
        producer.close()
        for c in consumers:
            c.close()


def test_reconnecting_forgets_chunks_a_dead_trainer_never_acked(stream):
    producer, _ = stream
    producer.post("p", segment(version=1))
    producer.post("p", segment(version=2))
    replacement = ZmqSampleConsumer("tcp://127.0.0.1:*")
    try:
        producer.connect("p", [replacement.endpoint])
        producer.flush(timeout_ms=5000)
        assert producer.backlog == 0
        assert take(replacement)[0].policy_version[0, 0, 0] == 2
    finally:
        replacement.close()


def test_an_actors_sample_socket_takes_no_message_larger_than_an_ack(stream):
    producer, consumer = stream
    assert producer.sockets["p"].getsockopt(zmq.MAXMSGSIZE) == ACK_MAX_BYTES
    producer.connect("p", [consumer.endpoint])  # after a trainer moved: the same bound
    assert producer.sockets["p"].getsockopt(zmq.MAXMSGSIZE) == ACK_MAX_BYTES


def test_a_slow_trainer_holds_the_actor_back_and_is_not_taken_for_gone(stream, monkeypatch, caplog):
    """Issue 16: with 64 actors a trainer that was alive but slow left chunks unacked for 10 s,
    which the actors counted as lost (57 warnings), sending more and deepening the lag."""
    from system.streams import samples

    clock = [0.0]
    monkeypatch.setattr(samples, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    producer, consumer = stream
    producer.post("p", segment(version=1))
    producer.post("p", segment(version=2))
    clock[0] = samples.SLOW_ACK_S + 1  # the trainer has not taken the first chunk yet
    with caplog.at_level(logging.INFO, logger=samples.__name__):
        producer.flush(timeout_ms=50)
        producer.flush(timeout_ms=50)
    assert producer.backlogged  # the actor waits: the second chunk was not sent
    assert [r.getMessage() for r in caplog.records] == [  # noted once, at INFO, never "lost"
        "the trainers of policy 'p' have not taken this actor's samples for 11s: they are "
        "slower than the actors, which wait for them"
    ]
    assert caplog.records[0].levelno == logging.INFO
    assert take(consumer)[0].policy_version[0, 0, 0] == 1
    assert take(consumer, timeout_ms=50) == []  # nothing more was sent meanwhile
    producer.flush(timeout_ms=5000)  # the ack of the first frees the credit
    assert producer.backlog == 0
    assert take(consumer)[0].policy_version[0, 0, 0] == 2


def test_a_chunk_unacked_for_minutes_is_taken_for_lost_in_transit(stream, monkeypatch, caplog):
    from system.streams import samples

    clock = [0.0]
    monkeypatch.setattr(samples, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    producer, consumer = stream
    producer.post("p", segment(version=1))
    producer.post("p", segment(version=2))
    clock[0] = samples.LOST_ACK_S + 1  # e.g. its ack went with a dropped connection
    with caplog.at_level(logging.WARNING, logger=samples.__name__):
        producer.flush()
    assert producer.backlog == 0
    assert [int(take(consumer)[0].policy_version[0, 0, 0]) for _ in range(2)] == [1, 2]
    assert [r.getMessage() for r in caplog.records] == [
        "samples for policy 'p' not acked in 301s although no trainer of it was restarted: "
        "taken for lost with a dropped connection, and the next chunk goes"
    ]


def test_foreign_messages_to_the_consumer_are_dropped_and_counted(stream):
    producer, consumer = stream
    intruder = transport.make_socket(zmq.DEALER, server=False)
    intruder.connect(consumer.endpoint)
    try:
        intruder.send_multipart([b"", b"\xc1 not msgpack"])
        transport.send(intruder, "rollout", {"x": 1})
        producer.post("p", segment(version=3))
        got = []
        for _ in range(10):
            got += take(consumer, timeout_ms=500)
            if got:
                break
        got += take(consumer, timeout_ms=200)  # the junk may be queued behind the chunk
        assert [int(g.policy_version[0, 0, 0]) for g in got] == [3]
        assert consumer.bad_messages.count == 2
    finally:
        intruder.close(linger=0)


def test_the_trainer_takes_only_the_chunks_one_batch_needs():
    hub = InprocSampleHub()
    trainer = StubTrainer(EchoPolicy())
    source = segment_source(hub.consumer("p"), "p", trainer, 2)
    worker = TrainerWorker("t", "p", trainer, source, _NoParams())
    producer = hub.producer()
    for v in range(5):
        producer.post("p", segment(version=v))
    assert worker.poll() == 1
    # What the trainer does not need stays in the stream, holding the actors back.
    assert source.pending_segments == 0
    assert len(hub.queues["p"]) == 3


def test_a_trainer_at_the_runs_trainer_steps_takes_batches_and_trains_no_more():
    """`stop.trainer_steps=100` ended at 113-115: the trainer stepped on until the stop came.
    It stops stepping at its budget, and still takes batches, so no actor waits on it."""
    hub = InprocSampleHub()
    trainer = StubTrainer(EchoPolicy())
    source = segment_source(hub.consumer("p"), "p", trainer, 1)
    worker = TrainerWorker("t", "p", trainer, source, _NoParams(), max_steps=2)
    producer = hub.producer()
    for v in range(4):
        producer.post("p", segment(version=v))
    assert [worker.poll() for _ in range(4)] == [1, 1, 0, 0]
    assert worker.steps == 2 and len(hub.queues["p"]) == 0


class _NoParams:
    def publish(self, *args, **kwargs) -> None:
        pass

    publish_nowait = publish
    settle = publish


def test_pace_holds_a_loop_to_its_rate(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("system.ratelimit.time.monotonic", lambda: clock[0])
    pace = Pace(rate=1000.0, burst_s=0.01)  # a burst of 10 events
    assert pace.wait_s() == 0.0
    pace.spend(30)
    assert pace.wait_s() == pytest.approx(0.02)  # 20 events over: 20 ms at 1000/s
    clock[0] += 0.021
    assert pace.wait_s() == 0.0
    clock[0] += 60.0  # a long pause earns no more than the burst
    assert pace.wait_s() == 0.0
    pace.spend(11)
    assert pace.wait_s() == pytest.approx(0.001)
    with pytest.raises(ValueError, match="rate must be more than 0"):
        Pace(0.0)


def test_segments_survive_the_trip_intact(stream):
    producer, consumer = stream
    sent = segment(version=9, segments=3)
    producer.post("p", sent)
    (got,) = take(consumer)
    for name in ("obs", "action", "reward", "done", "policy_version"):
        assert np.array_equal(getattr(got, name), getattr(sent, name))


def test_an_actor_with_max_fps_holds_back_once_over_its_pace(monkeypatch):
    monkeypatch.setattr("system.ratelimit.time.monotonic", lambda: 100.0)  # time stands still
    hub = InprocInferenceHub()
    actor = eval_actor(hub, "e", lambda i: CountingEnv(length=100), 4, max_fps=100.0)
    stepped = []
    for _ in range(4):
        stepped.append(actor.poll())
        answer_all(hub, "p")
    assert stepped == [0, 4, 4, 0]  # a burst of 5 frames allowed, then nothing until time passes


class _FakeSamples:
    backlogged = True

    def __init__(self):
        self.addresses = {"p": ["tcp://old:1"]}
        self.connected = []

    def connect(self, policy, addresses):
        self.connected.append((policy, addresses))
        self.addresses[policy] = addresses


def test_a_backlogged_actor_reconnects_only_to_trainers_that_moved(monkeypatch):
    from types import SimpleNamespace

    from system.run import peer_watch

    clock = [0.0]
    monkeypatch.setattr(peer_watch.time, "monotonic", lambda: clock[0])
    samples = _FakeSamples()
    ctl = SimpleNamespace(
        worker_id="actor/0", lookup=lambda name: where[name], moved=lambda names: {}
    )
    worker = SimpleNamespace(samples=samples, stalled_policies=lambda timeout_s: set())
    watchdog = peer_watch.ActorPeerWatchdog(ctl, worker, {}, {"p": ["samples/p/0"]})
    where = {"samples/p/0": "tcp://old:1"}
    for _ in range(3):  # a slow trainer: backlogged for long, same address
        watchdog()
        clock[0] += peer_watch.ActorPeerWatchdog.STALL_S + 1
    assert samples.connected == []
    where["samples/p/0"] = "tcp://new:2"  # restarted elsewhere
    watchdog()
    clock[0] += peer_watch.ActorPeerWatchdog.STALL_S + 1
    watchdog()
    assert samples.connected == [("p", ["tcp://new:2"])]
