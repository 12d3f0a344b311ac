"""Where a trainer's batches come from (system.workers.batch_source): a segment source takes
exactly ``batch_segments`` from the stream and no more, drops (and counts) segments older than
``max_policy_lag``, warns about lag once per period, and cuts batches on its loader thread; a
replay source takes the replay worker's batches over real sockets and sends priorities back."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
from gymnasium.spaces import Box, Discrete
from test_workers import segment

from algorithm.q_policies.policy import QPolicy
from api.replay import TransitionBatch
from system.streams import transport
from system.streams.replay import ZmqReplayClient, ZmqReplayServer
from system.streams.samples import InprocSampleHub, ZmqSampleConsumer, ZmqSampleProducer
from system.timing import StageClock
from system.workers.batch_source import ReplaySource, SegmentSource


def _source(consumer, batch_segments: int, version: int = 0, **lag) -> SegmentSource:
    return SegmentSource(consumer, "p", batch_segments, lambda: version, **lag)


def test_a_batch_takes_exactly_batch_segments_and_leaves_the_rest_in_the_stream():
    hub = InprocSampleHub()
    source, producer = _source(hub.consumer("p"), batch_segments=3), hub.producer()
    for v in range(3):
        producer.post("p", segment(version=v, segments=2))
    batch = source.take(0, StageClock())
    assert batch.reward.shape[:2] == (5, 3)
    assert batch.policy_version[0, :, 0].tolist() == [0, 0, 1]
    assert source.pending_segments == 1 and len(hub.queues["p"]) == 1  # back-pressure
    assert source.take(0, StageClock()).policy_version[0, :, 0].tolist() == [1, 2, 2]
    assert source.take(0, StageClock()) is None and source.pending_segments == 0


def test_segments_older_than_max_policy_lag_are_dropped_and_counted(caplog):
    hub = InprocSampleHub()
    source = _source(hub.consumer("p"), batch_segments=2, version=10, max_policy_lag=2)
    chunk = segment(version=10, segments=3)
    chunk.policy_version[:, 0] = 7  # three versions behind: too old
    hub.producer().post("p", chunk)
    hub.producer().post("p", segment(version=5, segments=2))  # all too old
    with caplog.at_level(logging.WARNING):
        batch = source.take(0, StageClock())
    assert batch.policy_version[0, :, 0].tolist() == [10, 10]
    assert source.stats() == {"stale_segments_dropped": 1}
    assert source.take(0, StageClock()) is None and source.pending_segments == 0
    assert source.stats() == {"stale_segments_dropped": 3}  # so far, as its warning says
    assert len([r for r in caplog.records if "max_policy_lag=2" in r.message]) == 1  # once


def test_a_lag_above_warn_policy_lag_is_warned_about_once_per_period(caplog):
    source = _source(InprocSampleHub().consumer("p"), batch_segments=1, warn_policy_lag=4)
    with caplog.at_level(logging.WARNING):
        assert source.age(9, segment(version=6)) == {"version_lag": 3.0}
        assert not caplog.records  # within the limit
        assert source.age(9, segment(version=2)) == {"version_lag": 7.0}
        assert source.age(9, segment(version=1)) == {"version_lag": 8.0}
    assert len(caplog.records) == 1 and "warn_policy_lag=4" in caplog.text


def test_a_loader_thread_cuts_batches_from_a_real_socket():
    consumer = ZmqSampleConsumer("tcp://127.0.0.1:*")
    producer = ZmqSampleProducer({"p": [consumer.endpoint]})
    source = _source(consumer, batch_segments=2)
    try:
        source.start_loader("trainer/p/0")
        assert set(source.stages()) == {"loader"}
        producer.post("p", segment(version=4, segments=2))
        batch = source.take(10_000, StageClock())
        assert batch is not None and batch.policy_version[0, :, 0].tolist() == [4, 4]
    finally:
        source.close()
        producer.close()
    assert consumer.socket.closed and not source.loader._thread.is_alive()


def test_a_replay_source_takes_batches_and_hands_their_priorities_back():
    server = ZmqReplayServer("tcp://127.0.0.1:*")
    source = ReplaySource(ZmqReplayClient(server.endpoint))
    try:
        assert source.take(0, StageClock()) is None  # asks; nothing came yet
        requests = server.poll(timeout_ms=10_000)
        for _ in range(10):  # the client keeps two requests in flight
            requests += [] if len(requests) == 2 else server.poll(timeout_ms=1000)
        batch = TransitionBatch(
            obs=np.ones((2, 3), np.float32), action=np.arange(2),
            reward=np.ones((2, 1), np.float32), discount=np.ones((2, 1), np.float32),
            next_obs=np.zeros((2, 3), np.float32), weight=np.ones((2, 1), np.float32),
            key=np.array([10, 11]), policy_version=np.array([[2], [6]]),
        )  # fmt: skip
        server.reply(requests[0].client, batch, inserted_frames=5000)
        got = source.take(10_000, StageClock())
        assert got.key.tolist() == [10, 11]
        assert source.age(8, got) == {"sample_age_versions": 4.0}
        policy = QPolicy(Box(-1, 1, (3,)), Discrete(2), hidden_sizes=[4])
        policy.explore_frames = 100  # what this copy counted itself
        trainer = SimpleNamespace(priorities=np.array([0.5, 2.0]), policy=policy)
        source.trained(got, trainer)
        (request,) = server.poll(timeout_ms=10_000)
        assert request.keys.tolist() == [10, 11] and request.priorities.tolist() == [0.5, 2.0]
        # the replay worker's count of the run's frames moves the trainer's copy on, and
        # goes out with its next published checkpoint
        assert policy.get_checkpoint()["explore_frames"] == 5000
        server.reply(request.client, batch, inserted_frames=10)  # never backwards
        source.trained(source.take(10_000, StageClock()), trainer)
        assert policy.explore_frames == 5000
    finally:
        source.close()
        server.close()


def _transitions(keys: list[int]) -> TransitionBatch:
    n = len(keys)
    return TransitionBatch(
        obs=np.ones((n, 3), np.float32), action=np.arange(n),
        reward=np.ones((n, 1), np.float32), discount=np.ones((n, 1), np.float32),
        next_obs=np.zeros((n, 3), np.float32), weight=np.ones((n, 1), np.float32),
        key=np.array(keys), policy_version=np.zeros((n, 1), np.int64),
    )  # fmt: skip


def test_a_message_of_several_batches_is_trained_one_batch_a_step(caplog):
    """batches_per_message=3: one reply of 6 transitions is three steps of 2; the priorities
    of the steps trained while two requests were out go back together with the next request;
    a reply that does not split into three batches is dropped with a warning."""
    server = ZmqReplayServer("tcp://127.0.0.1:*")
    source = ReplaySource(ZmqReplayClient(server.endpoint), batches_per_message=3)
    clock = StageClock()
    try:
        assert source.take(0, clock) is None
        requests = server.poll(timeout_ms=10_000)
        for _ in range(10):
            requests += [] if len(requests) == 2 else server.poll(timeout_ms=1000)
        server.reply(requests[0].client, _transitions([0, 1, 2, 3, 4, 5]))
        taken = []
        for _ in range(3):
            batch = source.take(10_000, clock)
            taken.append(batch.key.tolist())
            source.trained(batch, SimpleNamespace(priorities=batch.key * 0.5, policy=None))
        assert taken == [[0, 1], [2, 3], [4, 5]]
        # the first step's priorities went at once (a request had come back); the other two
        # wait for the next reply, as two requests are out again
        (request,) = server.poll(timeout_ms=10_000)
        assert request.keys.tolist() == [0, 1] and request.priorities.tolist() == [0.0, 0.5]
        assert source.take(0, clock) is None and server.poll(timeout_ms=100) == []
        server.reply(requests[1].client, _transitions([6, 7, 8, 9, 10, 11]))
        batch = source.take(10_000, clock)
        assert batch.key.tolist() == [6, 7]
        source.trained(batch, SimpleNamespace(priorities=batch.key * 0.5, policy=None))
        (request,) = server.poll(timeout_ms=10_000)
        assert request.keys.tolist() == [2, 3, 4, 5, 6, 7]
        server.reply(request.client, _transitions([0, 1, 2, 3]))  # four rows: not three batches
        with caplog.at_level(logging.WARNING):
            for _ in range(2):
                source.take(0, clock)  # the two left of the last message
            assert source.take(10_000, clock) is None
        assert "does not split into 3 batches" in caplog.text
    finally:
        source.close()
        server.close()


def test_a_replay_batch_without_a_true_frame_count_is_dropped_and_counted():
    """The count moves every policy worker's exploration: a reply whose ``inserted_frames``
    is missing, negative or not an integer is refused like any malformed message, and the
    next good one is taken."""
    server = ZmqReplayServer("tcp://127.0.0.1:*")
    client = ZmqReplayClient(server.endpoint)
    try:
        client.request()
        request = server.poll(timeout_ms=10_000)[0]
        batch = _transitions([1, 2])
        for body in ({"batch": batch}, {"batch": batch, "inserted_frames": -1},
                     {"batch": batch, "inserted_frames": 2.5}):  # fmt: skip
            transport.send(server.socket, "replay_batch", body, envelope=[request.client])
            assert client._receive(10_000) is None
        assert client.bad_messages.count == 3 and client.inserted_frames == 0
        server.reply(request.client, batch, inserted_frames=7)
        assert client._receive(10_000).key.tolist() == [1, 2] and client.inserted_frames == 7
    finally:
        client.close()
        server.close()
