"""Where a trainer's batches come from: its actors' segments, or its replay worker's batches.

A trainer worker reads from one :class:`BatchSource` and names neither: the source says how it
waits (its stage), what it does after a step (a replay source hands the batch's priorities back
with the request for the next one) and how old a batch's samples were (an on-policy batch's
*lag*, which its loss suffers and which is warned about; a replay batch's *age*, old by design).

:class:`SegmentSource` takes ``[T, k]`` segments from the sample stream until exactly
``batch_segments`` are in, never more (what stays in the stream holds its actors back), drops
segments older than ``max_policy_lag`` versions, and can cut batches on a loader thread of its
own (:mod:`system.workers.batch_loader`). :class:`ReplaySource` asks the replay worker.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from api.policy import SampleBatch
from system.streams.replay import ReplayClient
from system.streams.samples import SampleConsumer
from system.timing import StageClock
from system.workers.batch_loader import BatchLoader
from system.workers.trajectory import segment_count, take_columns

logger = logging.getLogger(__name__)

LAG_WARNING_EVERY_S = 30.0
"""At most one policy-lag warning (samples dropped, or kept but old) this often per trainer."""


class BatchSource(Protocol):
    stream: Any
    """The socket end it reads (a peer watch reconnects a replay client that moved)."""

    def take(self, timeout_ms: int, clock: StageClock) -> SampleBatch | None:
        """The next batch, waiting at most ``timeout_ms``; None when none is in yet."""

    def prefetch(self, clock: StageClock) -> None:
        """While the worker waits for something else (a data-parallel peer's batch): keep the
        stream moving without waiting, so the actors' credits do not sit idle."""

    def trained(self, batch: SampleBatch, trainer: Any) -> None:
        """After a step on ``batch``."""

    def age(self, version_before: int, batch: SampleBatch) -> dict[str, float]:
        """How old ``batch``'s samples were at the step, for the trainer's stats."""

    def stats(self) -> dict[str, float]:
        """Its own figures for the trainer's heartbeat (segments dropped as stale, so far)."""

    def stages(self) -> dict[str, StageClock]: ...
    def close(self) -> None: ...


class SegmentSource:
    """On-policy: segments from the actors, cut into ``[T, batch_segments]`` batches."""

    def __init__(
        self,
        samples: SampleConsumer,
        policy_name: str,
        batch_segments: int,
        version: Callable[[], int],
        *,
        max_policy_lag: int | None = None,
        warn_policy_lag: int | None = None,
    ):
        """``version``: the trained policy's current version (what a segment's lag is
        counted from)."""
        self.stream = samples
        self.policy_name = policy_name
        self.batch_segments = batch_segments
        self.version = version
        self.dropped = 0
        """Segments dropped as stale so far (the loader thread drops them too)."""
        self._dropped_lock = threading.Lock()
        self.max_policy_lag = max_policy_lag
        self.warn_policy_lag = warn_policy_lag
        self.buffer: list[SampleBatch] = []
        self.loader: BatchLoader | None = None
        self._next_lag_warning = 0.0

    def start_loader(self, name: str, prepare: Callable[[SampleBatch], None] | None = None) -> None:
        """From now on the next batch is received and cut (and ``prepare``d: put on the
        trainer's device) while this one trains; the sample stream is the loader's alone."""
        self.loader = BatchLoader(self._cut, name, prepare)
        self.loader.start()

    @property
    def pending_segments(self) -> int:
        return sum(segment_count(c) for c in self.buffer)

    def take(self, timeout_ms: int, clock: StageClock) -> SampleBatch | None:
        if self.loader is not None:
            clock.enter("wait_batch")
            return self.loader.take(timeout_ms)
        return self._cut(timeout_ms, clock)

    def prefetch(self, clock: StageClock) -> None:
        """Take (and so acknowledge) up to one more batch of segments, without waiting."""
        self.gather(0, clock)

    def gather(self, timeout_ms: int, clock: StageClock) -> None:
        """Take chunks of ``[T, k]`` segments from the sample stream until a batch is in.

        Never more: what stays in the stream holds its actors back (back-pressure), while what
        was buffered beyond one batch would only age, adding policy lag."""
        while self.pending_segments < self.batch_segments:
            clock.enter("wait_samples")
            if not self.stream.wait(timeout_ms):
                return
            clock.enter("receive")
            chunks = self.stream.poll(timeout_ms=0, max_items=1)
            if not chunks:
                return
            self.buffer.extend(c for c in map(self._drop_stale, chunks) if c is not None)
            timeout_ms = 0

    def _cut(self, timeout_ms: int, clock: StageClock) -> SampleBatch | None:
        """Gather segments, and cut a batch once ``batch_segments`` are in (in this thread,
        or in the loader's; ``clock`` is that thread's)."""
        self.gather(timeout_ms, clock)
        if self.pending_segments < self.batch_segments:
            return None
        clock.enter("receive")
        batch, self.buffer = take_columns(self.buffer, self.batch_segments)
        return batch

    def _drop_stale(self, chunk: SampleBatch) -> SampleBatch | None:
        """Without the segments whose oldest step is more than ``max_policy_lag`` versions
        behind (None when none is left): on-policy losses go wrong on samples that old."""
        if self.max_policy_lag is None:
            return chunk
        count = segment_count(chunk)
        versions = np.reshape(chunk.policy_version, (len(chunk.policy_version), count, -1))
        lag = self.version() - versions.min(axis=(0, 2))
        keep = np.flatnonzero(lag <= self.max_policy_lag)
        dropped = count - len(keep)
        if dropped == 0:
            return chunk
        with self._dropped_lock:
            self.dropped += dropped
            so_far = self.dropped
        if self._lag_warning_due():
            logger.warning(
                "trainer of policy '%s' dropped %d segment(s) more than max_policy_lag=%d "
                "versions old (%d so far): the trainer cannot keep up with the actors; use fewer "
                "actors (actors.workers), more trainer workers or a larger batch_segments, or "
                "raise max_policy_lag",
                *(self.policy_name, dropped, self.max_policy_lag, so_far),
            )
        return chunk[:, keep] if len(keep) else None

    def trained(self, batch: SampleBatch, trainer: Any) -> None:
        """Nothing goes back: the actors' credits were acknowledged on receipt."""

    def age(self, version_before: int, batch: SampleBatch) -> dict[str, float]:
        """The oldest step of the batch: what an on-policy loss suffers (warned about)."""
        lag = float(np.max(version_before - np.asarray(batch.policy_version)))
        self._warn_lag(lag)
        return {"version_lag": lag}

    def _lag_warning_due(self) -> bool:
        now = time.monotonic()
        if now < self._next_lag_warning:
            return False
        self._next_lag_warning = now + LAG_WARNING_EVERY_S
        return True

    def _warn_lag(self, lag: float) -> None:
        """Say so (and what to change) when a batch was more than ``warn_policy_lag`` old."""
        if self.warn_policy_lag is None or lag <= self.warn_policy_lag:
            return
        if not self._lag_warning_due():
            return
        p = f"policies.{self.policy_name}"
        logger.warning(
            "trainer of policy '%s' trains on samples up to %d versions old "
            "(%s.warn_policy_lag=%d): the trainer cannot keep up with the actors, whose samples "
            "wait for it; use fewer actors (actors.workers, actors.envs_per_worker), more "
            "trainer workers (%s.trainer_workers) or a larger %s.batch_segments, a trainer that "
            "corrects for lag (impala, or ppo with vtrace=True), or drop older samples with "
            "%s.max_policy_lag",
            *(self.policy_name, lag, p, self.warn_policy_lag, p, p, p),
        )

    def stats(self) -> dict[str, float]:
        with self._dropped_lock:
            return {"stale_segments_dropped": self.dropped} if self.dropped else {}

    def stages(self) -> dict[str, StageClock]:
        return {} if self.loader is None else {"loader": self.loader.stages}

    def close(self) -> None:
        if self.loader is not None:
            self.loader.stop()  # before its socket is closed
        self.stream.close()


class ReplaySource:
    """Off-policy: transition batches from the policy's replay worker; each batch's
    priorities go back with the request for the next one.

    A message may hold several batches one after another (``batches_per_message``): they are
    handed out one a step, and the priorities of those trained while the next request was
    already out go with the request after, so a request hands back at most one message's."""

    def __init__(self, replay: ReplayClient, *, batches_per_message: int = 1):
        self.stream = replay
        self.batches_per_message = batches_per_message
        self.pending: collections.deque[SampleBatch] = collections.deque()
        """Batches of the last message not trained on yet."""

    def take(self, timeout_ms: int, clock: StageClock) -> SampleBatch | None:
        if self.pending:
            return self.pending.popleft()
        clock.enter("wait_replay")
        if not self.stream.wait(timeout_ms):
            return None
        clock.enter("receive")
        message = self.stream.take(0)
        if message is None or self.batches_per_message == 1:
            return message
        rows, rest = divmod(len(message.action), self.batches_per_message)
        if rows == 0 or rest:
            logger.warning(
                "dropped a replay message of %d transitions: it does not split into %d batches "
                "(replay.batches_per_message) of one size",
                len(message.action), self.batches_per_message,
            )  # fmt: skip
            return None
        self.pending.extend(
            message[i * rows : (i + 1) * rows] for i in range(1, self.batches_per_message)
        )
        return message[:rows]

    def prefetch(self, clock: StageClock) -> None:
        """The replay worker holds this trainer's one request: nothing to take meanwhile."""

    def trained(self, batch: SampleBatch, trainer: Any) -> None:
        """Hand back the batch's priorities, and move the policy's exploration count on to
        the frames the replay worker has taken in: it goes out with the next published
        version (see :mod:`system.streams.replay`)."""
        self.stream.request(batch.key, getattr(trainer, "priorities", None))
        observe = getattr(trainer.policy, "observe_frames", None)
        if observe is not None:
            observe(self.stream.inserted_frames)

    def age(self, version_before: int, batch: SampleBatch) -> dict[str, float]:
        """Old by design: how old on average, not a lag to act on (never warned)."""
        return {
            "sample_age_versions": float(np.mean(version_before - np.asarray(batch.policy_version)))
        }

    def stats(self) -> dict[str, float]:
        return {}

    def stages(self) -> dict[str, StageClock]:
        return {}

    def close(self) -> None:
        self.stream.close()
