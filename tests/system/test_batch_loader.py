"""The trainer's loader thread (system.workers.batch_loader)."""

from __future__ import annotations

import threading
import time

import pytest

from system.workers.batch_loader import BatchLoader, LoaderFailed


class Segments:
    """Batches 0, 1, 2, ... as fast as asked, counting how far ahead of the taker it got."""

    def __init__(self, fail_at: int | None = None):
        self.made = 0
        self.fail_at = fail_at
        self.threads: set[str] = set()

    def assemble(self, timeout_ms, clock):
        self.threads.add(threading.current_thread().name)
        if self.made == self.fail_at:
            raise OSError("the socket went away")
        clock.enter("receive")
        self.made += 1
        return self.made - 1


def test_batches_come_in_order_from_a_thread_of_their_own_one_ahead_at_most():
    segments = Segments()
    loader = BatchLoader(segments.assemble, "trainer/default/0")
    loader.start()
    try:
        taken = [loader.take(timeout_ms=5000) for _ in range(5)]
        assert taken == [0, 1, 2, 3, 4]
        assert segments.threads == {"trainer/default/0-loader"}
        # one batch waits for the trainer, and the loader with it: it starts on the next one
        # only once that one is taken (back-pressure reaches the actors, samples age one step)
        assert _until(lambda: segments.made == 6 and loader.stages.stage == "wait_trainer")
        assert loader._ready.qsize() == 1
        assert loader.take(timeout_ms=5000) == 5
        assert _until(lambda: segments.made == 7 and loader.stages.stage == "wait_trainer")
    finally:
        loader.stop()
    stats = loader.stages.take(prefix="loader.")
    assert stats["loader.stage/receive"] >= 0.0
    assert stats["loader.stage/wait_trainer"] > 0.0  # it waited for us to take the next one
    assert stats["loader.stage_wall_s"] == pytest.approx(sum(
        v for k, v in stats.items() if "stage/" in k
    ))  # fmt: skip


def _until(condition, timeout_s: float = 5.0) -> bool:
    done = threading.Event()
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        done.wait(0.01)
    return True


def test_nothing_ready_is_none_after_the_timeout():
    loader = BatchLoader(lambda timeout_ms, clock: None, "t")
    loader.start()
    try:
        assert loader.take(timeout_ms=20) is None
    finally:
        loader.stop()


def test_an_error_in_the_thread_fails_the_trainer_with_it():
    loader = BatchLoader(Segments(fail_at=2).assemble, "t")
    loader.start()
    assert loader.take(timeout_ms=5000) == 0
    assert loader.take(timeout_ms=5000) == 1
    loader._thread.join(5)  # it ended on the error
    with pytest.raises(LoaderFailed, match="loader thread failed: OSError"):
        loader.take(timeout_ms=0)
    loader.stop()
