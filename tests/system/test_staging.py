"""The loader thread puts a trainer's next batch on its device (system.workers.staging): the
trainer takes exactly the tensors staged for the batch in hand, or converts it itself; on a GPU
the copy goes through reused page-locked buffers on a stream of the stager's own."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from test_workers import EchoPolicy, StubTrainer, segment

from system.parameters.inproc import InprocParameterService
from system.parameters.store import ParameterStore
from system.streams.samples import ZmqSampleConsumer, ZmqSampleProducer
from system.workers.batch_loader import BatchLoader
from system.workers.staging import DeviceStager
from system.workers.trainer_worker import TrainerWorker, segment_source

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _equal(staged, batch) -> bool:
    return all(
        np.array_equal(staged_leaf.cpu().numpy(), np.asarray(leaf))
        for (_, staged_leaf), (_, leaf) in zip(staged.flatten(), batch.flatten(), strict=True)
    )


def test_a_batch_staged_in_another_thread_is_taken_once_as_tensors_of_its_own_values():
    stager = DeviceStager(torch.device("cpu"))
    batch = segment(version=3, segments=2)
    batch.reward[:] = np.arange(10, dtype=np.float32).reshape(5, 2, 1)
    thread = threading.Thread(target=stager.prepare, args=(batch,))
    thread.start()
    thread.join()
    staged = stager.take(batch)
    assert staged is not None and type(staged) is type(batch)
    assert all(isinstance(leaf, torch.Tensor) for _, leaf in staged.flatten())
    assert _equal(staged, batch)
    assert stager.take(batch) is None  # taken once
    assert stager.take(segment()) is None  # never prepared: the trainer converts it itself


def test_a_stager_keeps_the_batch_about_to_be_taken_and_the_next_one_only():
    stager = DeviceStager(torch.device("cpu"))
    batches = [segment(version=v) for v in range(3)]
    for batch in batches:
        stager.prepare(batch)
    assert stager.take(batches[0]) is None  # a batch never taken is not kept
    assert stager.take(batches[2]) is not None and stager.take(batches[1]) is not None


def test_a_copy_that_fails_is_said_once_and_the_trainer_copies_from_then_on(caplog):
    stager = DeviceStager(torch.device("cpu"))
    calls = []

    def no_pinned_memory(batch):
        calls.append(batch)
        raise RuntimeError("CUDA error: out of memory")

    stager._cuda, stager._copy = True, no_pinned_memory  # as a GPU's copy would fail
    batches = [segment(version=v) for v in range(2)]
    with caplog.at_level("WARNING"):
        for batch in batches:
            stager.prepare(batch)
    assert len(calls) == 1 and stager.failed
    assert [stager.take(b) for b in batches] == [None, None]  # the trainer's own copy
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning == (
        "the trainer's loader could not put a batch on cpu (CUDA error: out of memory); the "
        "trainer copies each batch itself from now on"
    )


def test_a_loader_prepares_each_batch_in_its_thread_before_handing_it_over():
    prepared: list[tuple[int, str]] = []
    made = iter(range(100))

    def assemble(timeout_ms, clock):
        clock.enter("receive")
        return next(made)

    def prepare(batch):
        prepared.append((batch, threading.current_thread().name))

    loader = BatchLoader(assemble, "trainer/p/0", prepare)
    loader.start()
    try:
        assert [loader.take(timeout_ms=5000) for _ in range(3)] == [0, 1, 2]
    finally:
        loader.stop()
    assert prepared[:3] == [(i, "trainer/p/0-loader") for i in range(3)]
    assert loader.stages.take(prefix="l.")["l.stage/to_device"] >= 0.0


class DeviceTrainer(StubTrainer):
    """A trainer that takes device batches (as PPO, IMPALA, DQN and SAC do), noting what it got."""

    accepts_device_batches = True

    def step(self, samples):
        self.batches.append(samples)
        return super().step(samples)


def test_a_trainer_that_loads_ahead_trains_on_the_tensors_its_loader_staged():
    """Real sockets and the loader thread, as in process mode: each step's batch arrives as
    tensors the loader made, equal to the segments sent."""
    policy = EchoPolicy()
    policy.device = torch.device("cpu")
    trainer = DeviceTrainer(policy)
    trainer.batches = []
    consumer = ZmqSampleConsumer("tcp://127.0.0.1:*")
    producer = ZmqSampleProducer({"p": [consumer.endpoint]})
    source = segment_source(consumer, "p", trainer, 2)
    worker = TrainerWorker("t", "p", trainer, source, InprocParameterService(ParameterStore()))
    staged_by: list[str] = []
    prepare = DeviceStager.prepare

    def spy(self, batch):
        staged_by.append(threading.current_thread().name)
        prepare(self, batch)

    DeviceStager.prepare = spy
    try:
        worker.load_ahead()
        assert worker.stager is not None
        sent = [segment(version=v, segments=2) for v in range(3)]
        for batch in sent:
            producer.post("p", batch)
        deadline = time.monotonic() + 30
        while len(trainer.batches) < 3 and time.monotonic() < deadline:
            producer.flush()  # what the stream's high-water mark held back
            worker.poll()
    finally:
        DeviceStager.prepare = prepare
        source.close()
        producer.close()
    assert len(trainer.batches) == 3
    assert staged_by[:3] == ["t-loader"] * 3
    for got, batch in zip(trainer.batches, sent, strict=True):
        assert all(isinstance(leaf, torch.Tensor) for _, leaf in got.flatten())
        assert _equal(got, batch)
    assert worker.stager._staged == []  # every staged batch was taken by its step


def test_a_trainer_that_takes_host_batches_gets_no_stager():
    policy = EchoPolicy()
    trainer = StubTrainer(policy)
    consumer = ZmqSampleConsumer("tcp://127.0.0.1:*")
    source = segment_source(consumer, "p", trainer, 2)
    worker = TrainerWorker("t", "p", trainer, source, InprocParameterService(ParameterStore()))
    try:
        worker.load_ahead()
        assert worker.stager is None and source.loader is not None
    finally:
        source.close()


@needs_gpu
def test_on_a_gpu_a_staged_batch_is_on_the_device_through_reused_pinned_buffers():
    device = torch.device("cuda")
    stager = DeviceStager(device)
    first, second = segment(version=1, segments=4), segment(version=2, segments=4)
    first.reward[:] = 1.5
    stager.prepare(first)
    pinned = {name: t.data_ptr() for name, t in stager._pinned.items()}
    assert all(t.is_pinned() for t in stager._pinned.values())
    stager.prepare(second)
    assert {name: t.data_ptr() for name, t in stager._pinned.items()} == pinned  # reused
    a, b = stager.take(first), stager.take(second)
    assert all(leaf.device.type == "cuda" for _, leaf in a.flatten())
    assert _equal(a, first) and _equal(b, second)  # the second copy did not overwrite the first
    stager.prepare(segment(segments=8))  # another shape: buffers of its own
    assert {name: t.data_ptr() for name, t in stager._pinned.items()} != pinned
