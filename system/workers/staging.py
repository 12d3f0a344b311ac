"""A trainer's next batch, put on its device by the loader thread while this one trains.

The trainer worker's ``to_device`` stage copies a batch to the policy's device before each
step. On a GPU that copy goes from pageable memory, so the trainer's own thread first waits for
the stream to drain and then for the copy (about a tenth of a Pong trainer's time on the H200,
where the trainer is what the run waits for). With a loader thread
(:mod:`system.workers.batch_loader`) a :class:`DeviceStager` moves it there: the loader copies
the batch it has just cut into page-locked buffers and from them to the device on a stream of
its own, and waits for that copy itself. The trainer then takes a batch already on the device.

Only one copy is in flight at a time (the loader waits for each before it cuts the next), so
one set of page-locked buffers, reused from batch to batch, is enough. A device tensor made on
the loader's stream and freed after the trainer's step is marked as used by the trainer's
stream (``record_stream``): the allocator then keeps it until that stream's kernels are done
with it, instead of handing it to the next copy early.

On the CPU the "copy" is :func:`torch.as_tensor` (no copy at all), so the same hand-over runs
in every process-mode test on a machine without a GPU.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import torch

from api.policy import SampleBatch

logger = logging.getLogger(__name__)

KEEP = 2
"""Staged batches kept for the trainer: the one it is about to take, and the loader's next."""


class DeviceStager:
    """``prepare`` (loader thread) puts a batch on ``device``; ``take`` (trainer thread) gets
    the staged tensors of that same batch object, or None if it was never prepared."""

    def __init__(self, device: torch.device):
        self.device = device
        self._cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device) if self._cuda else None
        self._pinned: dict[str, torch.Tensor] = {}
        self._staged: list[tuple[SampleBatch, SampleBatch]] = []
        self._lock = threading.Lock()
        self.failed = False

    def prepare(self, batch: SampleBatch) -> None:
        """Copy ``batch`` to the device and wait until it is there (in the calling thread).

        A copy that fails here (out of page-locked memory, say) is said once, and staging
        stops: the trainer then copies each batch itself, as it does without a loader."""
        if self.failed:
            return
        try:
            staged = self._copy(batch) if self._cuda else to_device(batch, self.device)
        except RuntimeError as e:
            self.failed = True
            logger.warning(
                "the trainer's loader could not put a batch on %s (%s); the trainer copies "
                "each batch itself from now on",
                *(self.device, e),
            )
            return
        with self._lock:
            self._staged = [*self._staged[-(KEEP - 1) :], (batch, staged)]

    def take(self, batch: SampleBatch) -> SampleBatch | None:
        """The tensors ``prepare`` made of this very batch (once; None if none)."""
        with self._lock:
            found = [i for i, (prepared, _) in enumerate(self._staged) if prepared is batch]
            if not found:
                return None
            staged = self._staged.pop(found[0])[1]
        if self._cuda:
            stream = torch.cuda.current_stream(self.device)
            for _, tensor in staged.flatten():
                tensor.record_stream(stream)
        return staged

    def _copy(self, batch: SampleBatch) -> SampleBatch:
        """Each leaf through its page-locked buffer to the device, on the loader's stream."""
        assert self._stream is not None
        on_device: dict[int, torch.Tensor] = {}  # by the leaf's id: the batch keeps it alive
        with torch.cuda.stream(self._stream):
            for name, value in batch.flatten():
                on_device[id(value)] = self._through_pinned(name, np.asarray(value))
        self._stream.synchronize()  # the pinned buffers are free again; the trainer may read
        return batch.apply(lambda value: on_device[id(value)])

    def _through_pinned(self, name: str, array: np.ndarray) -> torch.Tensor:
        pinned = self._pinned.get(name)
        if pinned is None or pinned.shape != array.shape or pinned.numpy().dtype != array.dtype:
            dtype = torch.from_numpy(np.empty(0, array.dtype)).dtype
            pinned = torch.empty(array.shape, dtype=dtype, pin_memory=True)
            self._pinned[name] = pinned
        np.copyto(pinned.numpy(), array)  # any strides, read-only or not; frees the GIL
        return pinned.to(self.device, non_blocking=True)


def to_device(batch: SampleBatch, device: torch.device) -> SampleBatch:
    """The batch as tensors on ``device``, copied in the calling thread (none on the CPU): what
    the trainer does with a batch its loader did not stage."""
    return batch.apply(lambda x: torch.as_tensor(np.asarray(x), device=device))
