"""The trainer's loader thread: the next batch is received, decoded, cut and staged while this one
trains.

Without it a trainer does everything in turn: wait for segments, decode them (a Pong batch is tens
of megabytes of frames), cut a ``[T, B]`` batch, put it on the device, then train. With it, a
thread of the trainer worker's own does the first four while ``Trainer.step`` runs (torch releases
the GIL in its kernels, and a GPU step leaves the CPU idle), and hands over each batch through a
queue of one: the trainer waits only when the loader has nothing yet (``wait_batch`` in its
timings), and the loader only when the trainer has not taken its last batch (``wait_trainer``). The
loader starts on the next batch only once the trainer took the last one, so a batch is assembled
while exactly one trains: back-pressure still reaches the actors, and samples are one trainer step
older than without a loader, never more.

Only process mode starts one (``Wiring.threads``): serial mode polls every worker in turn, in one
thread, and stays deterministic. The thread owns the sample consumer's socket from its start
(ZeroMQ sockets belong to one thread); ``stop`` joins it before the socket is closed.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from api.policy import SampleBatch
from system.timing import SharedStageClock, StageClock

logger = logging.getLogger(__name__)

PUT_WAIT_S = 0.05
"""How often a loader holding a batch checks for a stop while the trainer has not taken it."""


class LoaderFailed(RuntimeError):
    """The loader thread raised: the trainer worker fails with its error (and is restarted)."""


class BatchLoader:
    """Runs ``assemble(timeout_ms, clock)`` in a thread until stopped; ``take`` gets a batch.

    ``prepare``, if given, runs on each batch in the same thread before it is handed over (a
    :class:`~system.workers.staging.DeviceStager` putting it on the trainer's device)."""

    def __init__(
        self,
        assemble: Callable[[int, StageClock], SampleBatch | None],
        name: str,
        prepare: Callable[[SampleBatch], None] | None = None,
    ):
        self._assemble = assemble
        self._prepare = prepare
        self.stages = SharedStageClock(first="wait_samples")
        """The loader thread's own stages, reported beside the trainer's (``trainer.loader``)."""
        self._ready: queue.Queue[SampleBatch] = queue.Queue(maxsize=1)
        self._taken = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"{name}-loader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def take(self, timeout_ms: int) -> SampleBatch | None:
        """The next batch, waiting at most ``timeout_ms`` for it; None if none is ready."""
        if self._error is not None:
            raise LoaderFailed(f"the trainer's loader thread failed: {self._error!r}") from (
                self._error
            )
        try:
            batch = self._ready.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            return None
        self._taken.set()
        return batch

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and wait for it (a batch it was assembling is dropped)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.warning("the trainer's loader thread did not stop in %.0fs", timeout_s)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                batch = self._assemble(20, self.stages)
                if batch is None:
                    continue
                if self._prepare is not None:
                    self.stages.enter("to_device")
                    self._prepare(batch)
                self._hand_over(batch)
        except BaseException as e:  # reported by the next take, in the trainer's own thread
            self._error = e

    def _hand_over(self, batch: SampleBatch) -> None:
        """Queue the batch, then wait until the trainer took it."""
        self.stages.enter("wait_trainer")
        self._taken.clear()
        self._ready.put(batch)  # never full: the last batch was taken
        while not self._stop.is_set() and not self._taken.wait(PUT_WAIT_S):
            pass
