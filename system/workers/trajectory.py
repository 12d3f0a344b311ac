"""Trajectory building: batched step records in, fixed-length overlapping segments out.

A segment is ``segment_length + 1`` steps: the last step only bootstraps the return (its value),
and it is also the first step of the next segment, so no step is lost or trained on twice.
Segments run across episode boundaries; ``done``/``truncated``/``on_reset`` say where episodes end.

The buffer is allocated once, ``[T + 1, slots, ...]`` per field, and every step of many agents is
one vectorised write: no Python object per agent and step. Agents that step together (the usual
case) complete their segments together and leave as one ``[T + 1, k]`` batch.
"""

from __future__ import annotations

import numpy as np

from api.episode import SegmentFields
from api.namedarray import NamedArray, concatenate
from api.policy import SampleBatch


class SegmentBuffer:
    """Preallocated segments for a fixed set of agent slots (columns)."""

    def __init__(self, slots: int, segment_length: int):
        self.slots = slots
        self.length = segment_length + 1
        self.cursor = np.zeros(slots, dtype=np.int64)
        self.data: SampleBatch | None = None

    def write(self, columns: np.ndarray, step: SampleBatch) -> SampleBatch | None:
        """Record one step for ``columns`` (``step`` holds one row per column); return the
        segments completed by it, ``[T + 1, k, ...]``, or None."""
        if self.data is None:
            self.data = step.apply(self._allocate)
        self.data[(self.cursor[columns], columns)] = step
        self.cursor[columns] += 1
        full = np.flatnonzero(self.cursor == self.length)
        if len(full) == 0:
            return None
        segments = self.data[:, full]  # fancy indexing: a copy, safe to send
        self.data[0, full] = self.data[self.length - 1, full]  # the bootstrap step opens the next
        self.cursor[full] = 1
        return segments

    def drop(self, columns: np.ndarray) -> None:
        """Forget the unfinished steps of ``columns`` (their environment failed)."""
        self.cursor[columns] = 0

    def _allocate(self, leaf: np.ndarray) -> np.ndarray:
        leaf = np.asarray(leaf)
        return np.zeros((self.length, self.slots, *leaf.shape[1:]), dtype=leaf.dtype)


def batch_segments(chunks: list[SampleBatch]) -> SampleBatch:
    """Join ``[T, b_i, ...]`` chunks of segments into one time-major ``[T, B, ...]`` batch."""
    return chunks[0] if len(chunks) == 1 else concatenate(chunks, axis=1)


def take_columns(chunks: list[SampleBatch], count: int) -> tuple[SampleBatch, list[SampleBatch]]:
    """The first ``count`` segments of ``chunks`` as one batch, and what is left over."""
    batch = batch_segments(chunks)
    total = batch.reward.shape[1]
    rest = [batch[:, count:]] if total > count else []
    return (batch if total == count else batch[:, :count]), rest


def segment_count(chunk: NamedArray) -> int:
    return int(chunk.reward.shape[1])


def with_extras(segments: SampleBatch, fields: SegmentFields) -> SampleBatch:
    """``segments``, given ``extras`` holding the declared ``fields``, zero-filled
    (``[T, k, *shape]`` each): what actor callbacks write into before the segments are sent, and
    what the run's layouts expect (:mod:`system.run.declared`)."""
    if not fields:
        return segments
    steps, count = segments.reward.shape[:2]
    zeros = {k: np.zeros((steps, count, *shape), dtype) for k, (shape, dtype) in fields.items()}
    segments.extras = NamedArray(**zeros)
    return segments
