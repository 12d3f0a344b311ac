"""The replay worker: the buffer between the actors and an off-policy trainer (DQN, SAC).

Actors send it their segments over the same credit-based sample stream an on-policy trainer
consumes; it inserts them into a :class:`~system.replay.buffer.ReplayBuffer` and answers the
trainer's requests (:mod:`system.streams.replay`) with sampled transition batches, taking the
priorities of the previous batch back with each request.

The rate limiter decides both sides. A request it refuses waits here until enough new frames are
in; a segment chunk it refuses is held, and the next one is not taken from the stream, so the
actors' credit runs out and they wait: the same back-pressure a slow on-policy trainer applies.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from api.config import ExperimentConfig
from api.errors import RunFolderError
from api.policy import SampleBatch
from system.replay.buffer import ReplayBuffer
from system.replay.buffer import ReplayConfig as BufferConfig
from system.replay.rate_limiter import RateLimiterConfig
from system.run.plan import Role
from system.streams.replay import ReplayRequest
from system.streams.samples import SampleConsumer
from system.workers.base import Worker

logger = logging.getLogger(__name__)

IDLE_WAIT_MS = 5
"""How long one poll waits for a segment or request when there is nothing else to do."""


def buffer_config(cfg: ExperimentConfig, policy: str) -> BufferConfig:
    """The buffer of ``policy``'s replay worker, from ``PolicyConfig.replay``.

    The default tolerance of the samples-per-insert ratio fits one batch and one actor's chunk of
    segments, the least that guarantees neither side waits for the other forever."""
    rc = cfg.policies[policy].replay
    spi = rc.samples_per_insert
    chunk_frames = cfg.actors.segment_length * cfg.actors.envs_per_worker
    tolerance = rc.tolerance
    if tolerance is None:
        tolerance = float(max(rc.batch_size, chunk_frames * (spi or 0.0)))
    return BufferConfig(
        capacity_frames=rc.capacity_frames,
        n_step=rc.n_step,
        gamma=rc.gamma,
        prioritized=rc.prioritized,
        priority_exponent=rc.alpha,
        importance_exponent=rc.beta,
        rate_limit=RateLimiterConfig(
            min_size=rc.min_size, samples_per_insert=spi, tolerance=tolerance
        ),
        seed=cfg.seed,
    )


class ReplayWorker(Worker):
    role = Role.REPLAY

    def __init__(
        self,
        worker_id: str,
        policy_name: str,
        buffer: ReplayBuffer,
        samples: SampleConsumer,
        server: Any,
        *,
        batch_size: int,
        checkpoint_path: Path | None = None,
    ):
        """``server``: the replay stream's serving end (``ZmqReplayServer`` or in process).
        ``checkpoint_path``: where the buffer is saved when the run stops, and loaded from when
        it resumes (None: not saved, as in serial mode)."""
        super().__init__(worker_id)
        self.policy_name = policy_name
        self.buffer = buffer
        self.samples = samples
        self.server = server
        self.batch_size = batch_size
        self.held: SampleBatch | None = None
        """A chunk taken from the stream that the rate limiter did not let in yet."""
        self.waiting: list[ReplayRequest] = []
        """Requests the rate limiter has not let through yet, oldest first."""
        self.batches_served = 0
        self.checkpoint_path = checkpoint_path
        if checkpoint_path is not None and checkpoint_path.exists():
            self.restore(checkpoint_path)

    def poll(self) -> int:
        idle = self.held is not None or not self.waiting
        work = self._insert(timeout_ms=0)
        requests = self.server.poll(timeout_ms=0)
        for request in requests:
            if request.keys is not None and len(request.keys):
                self.buffer.update_priorities(request.keys, request.priorities)
        self.waiting += requests
        work += len(requests) + self._serve()
        if not work and idle:
            work = self._insert(timeout_ms=IDLE_WAIT_MS)
        self._report()
        return work

    def _insert(self, timeout_ms: int) -> int:
        """Insert the held chunk and new ones while the rate limiter lets them in."""
        inserted = 0
        while True:
            if self.held is None:
                chunks = self.samples.poll(timeout_ms=timeout_ms, max_items=1)
                if not chunks:
                    return inserted
                self.held = chunks[0]
                timeout_ms = 0
            if not self.buffer.can_insert(self.held):
                return inserted
            self.buffer.insert(self.held)
            self.held = None
            inserted += 1

    def _serve(self) -> int:
        served = 0
        while self.waiting and self.buffer.can_sample(self.batch_size):
            request = self.waiting.pop(0)
            self.server.reply(request.client, self.buffer.sample(self.batch_size))
            served += 1
        self.batches_served += served
        return served

    def _report(self) -> None:
        limiter = self.buffer.limiter
        self.stats["replay_frames"] = self.buffer.size
        self.stats["inserted_frames"] = limiter.inserted
        self.stats["sampled_transitions"] = limiter.sampled
        self.stats["batches_served"] = self.batches_served
        self.stats["waiting_requests"] = len(self.waiting)

    def on_stop(self) -> None:
        """Save the buffer beside the run's checkpoints, so a resumed run starts with it full."""
        if self.checkpoint_path is None:
            return
        path = self.checkpoint_path
        tmp = path.with_name(path.name + ".tmp.npz")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(tmp, **self.buffer.state_dict())
            tmp.replace(path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise RunFolderError.from_os_error(path, e) from e
        logger.info("%s: saved %d replay frames to %s", self.worker_id, self.buffer.size, path)

    def restore(self, path: Path) -> None:
        """Load a buffer saved by :meth:`on_stop` (arrays only: no pickle is ever loaded)."""
        with np.load(path, allow_pickle=False) as saved:
            self.buffer.load_state_dict({k: saved[k] for k in saved.files})
        logger.info("%s: resumed %d replay frames from %s", self.worker_id, self.buffer.size, path)

    def close(self) -> None:
        self.samples.close()
        self.server.close()
