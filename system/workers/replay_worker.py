"""The replay worker: the buffer between the actors and an off-policy trainer (DQN, SAC).

Actors send it their segments over the same credit-based sample stream an on-policy trainer
consumes; it inserts them into a :class:`~system.replay.buffer.ReplayBuffer` and answers the
trainer's requests (:mod:`system.streams.replay`) with sampled transition batches, taking the
priorities of the previous batch back with each request.

The rate limiter decides both sides. A request it refuses waits here until enough new frames are
in; a segment chunk it refuses is held, and the next one is not taken from the stream, so the
actors' credit runs out and they wait: the same back-pressure a slow on-policy trainer applies.

The buffer is checkpointed with the run: written to ``checkpoints/<policy>/replay.ckpt`` (the
run's checkpoint format: arrays only, never pickle, and a digest that refuses a damaged file; a
temporary file renamed over the old one; older runs' ``replay.npz`` is still read) every
``ReplayConfig.save_every_s`` seconds while frames come in, and when the run stops; a replay
worker loads it when it starts, so one restarted after a SIGKILL, or a run resumed after a crash,
goes on from the last save instead of refilling from empty. A save rewrites the whole buffer
inside one poll. Measured on a shared 2-core machine (state_dict + write + fsync + rename):
cartpole-dqn's 50k frames (3 MiB) take about 6 ms, 1M frames of 17 floats (125 MiB) about
0.2 s, 50k frames of 84x84x4 pixels (1.4 GiB) 2 to 10 s. The default 60 s interval keeps the
first two far below 1% of the worker's time; for buffers like the last, the next save waits at
least ``SAVE_SPACING`` times as long as the last one took (at most 2% of the time saving).
"""

from __future__ import annotations

import contextlib
import logging
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from api.config import ExperimentConfig
from api.policy import SampleBatch
from system import run_folder
from system.parameters.checkpoint_file import (
    load_checkpoint_file,
    write_checkpoint,
)
from system.replay.buffer import ReplayBuffer
from system.replay.buffer import ReplayConfig as BufferConfig
from system.replay.rate_limiter import RateLimiterConfig
from system.roles import Role
from system.run_folder import write_atomically
from system.streams.replay import ReplayRequest
from system.streams.samples import SampleConsumer
from system.workers.base import Worker

logger = logging.getLogger(__name__)

IDLE_WAIT_MS = 5
"""How long one poll waits for a segment or request when there is nothing else to do."""
SAVE_SPACING = 50.0
"""A periodic save waits at least this many times as long as the last one took, so a buffer
whose save is slow (gigabytes of pixels) spends at most 1/50 of the worker's time saving."""


def buffer_config(cfg: ExperimentConfig, policy: str) -> BufferConfig:
    """The buffer of ``policy``'s replay worker, from ``PolicyConfig.replay``.

    The default tolerance of the samples-per-insert ratio fits one batch and one actor's chunk of
    segments, the least that guarantees neither side waits for the other forever."""
    rc = cfg.policies[policy].replay
    spi = rc.samples_per_insert
    chunk_frames = cfg.actors.segment_length * cfg.actors.envs_per_worker
    tolerance = rc.tolerance
    if tolerance is None:  # an environment's agents multiply the chunk: it widens to fit them
        tolerance = float(max(rc.message_rows, chunk_frames * (spi or 0.0)))
    return BufferConfig(
        capacity_frames=rc.capacity_frames,
        n_step=rc.n_step,
        gamma=rc.gamma,
        prioritized=rc.prioritized,
        priority_exponent=rc.alpha,
        importance_exponent=rc.beta,
        rate_limit=RateLimiterConfig(
            min_size=rc.min_size,
            samples_per_insert=spi,
            tolerance=tolerance,
            fitted=rc.tolerance is None,
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
        batches_per_message: int = 1,
        checkpoint_path: Path | None = None,
        save_every_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``server``: the replay stream's serving end (``ZmqReplayServer`` or in process).
        ``checkpoint_path``: where the buffer is saved, and loaded from when this worker starts
        (None: never saved, as in serial mode). ``save_every_s``: seconds between saves while
        frames come in (None: saved only when the run stops). ``batches_per_message``: batches
        of ``batch_size`` sampled at once and sent in one reply. ``clock``: seconds, for tests."""
        super().__init__(worker_id)
        self.policy_name = policy_name
        self.buffer = buffer
        self.samples = samples
        self.server = server
        self.batch_size = batch_size
        self.batches_per_message = batches_per_message
        self.held: SampleBatch | None = None
        """A chunk taken from the stream that the rate limiter did not let in yet."""
        self.waiting: list[ReplayRequest] = []
        """Requests the rate limiter has not let through yet, oldest first."""
        self.batches_served = 0
        self.checkpoint_path = checkpoint_path
        self.save_every_s = save_every_s
        self.clock = clock
        if checkpoint_path is not None:
            _remove_temporaries(checkpoint_path)
            legacy = checkpoint_path.with_name(LEGACY_REPLAY_FILE)
            if checkpoint_path.exists():
                self.restore(checkpoint_path)
            elif legacy.exists():
                self.restore(legacy)
            else:  # a restart before the first save: the frames of the one before are gone
                when = f"every {save_every_s:g} s and " if save_every_s else ""
                logger.info("%s: no saved replay buffer at %s; starting empty (it is saved %s"
                            "when the run stops)", worker_id, checkpoint_path, when)  # fmt: skip
        self._saved_inserted = self.buffer.limiter.inserted
        """Frames inserted when the buffer was last saved or loaded."""
        self._next_save = clock() + (save_every_s or 0.0)

    def poll(self) -> int:
        """Stages: ``insert`` (chunks into the buffer), ``serve`` (priorities in, batches
        sampled and sent), ``wait_samples`` or ``wait_requests`` (nothing to do), ``save``."""
        self.stages.enter("insert")
        work = self._insert(timeout_ms=0)
        self.stages.enter("serve")
        work += self._take_requests(timeout_ms=0) + self._serve()
        if not work:
            work = self._wait()
        self.stages.enter("save")
        self._save_when_due()
        self._report()
        return work

    def _wait(self) -> int:
        """Nothing moved: wait (at most :data:`IDLE_WAIT_MS`) for what can move it. With no
        chunk held, the actors' next one (a waiting request needs more frames in too); with one
        held back by the rate limiter, a trainer's request, the only thing that makes room.
        Returning at once instead spins a core the trainer needs (it did: 15k polls a second)."""
        if self.held is None:
            self.stages.enter("wait_samples")
            work = self._insert(timeout_ms=IDLE_WAIT_MS)
        else:
            self.stages.enter("wait_requests")
            work = self._take_requests(timeout_ms=IDLE_WAIT_MS)
        self.stages.enter("serve")
        return work + self._serve() if work else 0

    def _take_requests(self, timeout_ms: int) -> int:
        """Trainers' requests, each with the priorities of the batch it trained on."""
        requests = self.server.poll(timeout_ms=timeout_ms)
        for request in requests:
            if request.keys is not None and len(request.keys):
                self.buffer.update_priorities(request.keys, request.priorities)
        self.waiting += requests
        return len(requests)

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
        per_message = self.batches_per_message
        while self.waiting and self.buffer.can_sample(self.batch_size * per_message):
            request = self.waiting.pop(0)
            batch = self.buffer.sample(self.batch_size, per_message)
            self.server.reply(request.client, batch, self.buffer.limiter.inserted)
            served += per_message
        self.batches_served += served
        return served

    def _report(self) -> None:
        limiter = self.buffer.limiter
        self.stats["replay_frames"] = self.buffer.size
        self.stats["inserted_frames"] = limiter.inserted
        self.stats["sampled_transitions"] = limiter.sampled
        self.stats["batches_served"] = self.batches_served
        self.stats["waiting_requests"] = len(self.waiting)

    def _save_when_due(self) -> None:
        if self.checkpoint_path is None or self.save_every_s is None:
            return
        now = self.clock()
        if now < self._next_save or self.buffer.limiter.inserted == self._saved_inserted:
            return
        self.save()
        took = self.clock() - now
        self._next_save = now + max(self.save_every_s, SAVE_SPACING * took)
        logger.debug("%s: saved %d replay frames in %.3f s", self.worker_id, self.buffer.size, took)

    def on_stop(self) -> None:
        """Save the buffer a last time, so a resumed run starts with it full."""
        if self.checkpoint_path is None:
            return
        self.save()
        logger.info(
            "%s: saved %d replay frames to %s",
            self.worker_id,
            self.buffer.size,
            self.checkpoint_path,
        )

    def save(self) -> None:
        """Write the buffer to ``checkpoint_path`` atomically: a temporary file, synced and
        renamed over the last save, so a kill mid-save leaves the previous one. A failed write
        (a full disk) removes the temporary file and raises :class:`~api.errors.RunFolderError`."""
        state = self.buffer.state_dict(copy=False)  # nothing inserts until the write is done
        record = {"policy": self.policy_name, "replay": state}
        write_atomically(self.checkpoint_path, lambda f: write_checkpoint(f, record))
        self._saved_inserted = self.buffer.limiter.inserted
        self.stats["saved_frames"] = self.buffer.size

    def restore(self, path: Path) -> None:
        """Load a buffer saved by :meth:`save` (arrays only: no pickle is ever loaded). A file
        that cannot be read is reported and left for the next save to replace: the buffer
        refills from the actors, as a new one would."""
        try:
            self.buffer.load_state_dict(_read_state(path))
        except (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as e:
            self.buffer = ReplayBuffer(self.buffer.config)
            logger.warning(
                "%s: cannot load the saved replay buffer %s (%s: %s); starting with an empty "
                "buffer, which refills from the actors",
                self.worker_id,
                path,
                type(e).__name__,
                e,
            )
            return
        logger.info("%s: resumed %d replay frames from %s", self.worker_id, self.buffer.size, path)

    def close(self) -> None:
        self.samples.close()
        self.server.close()


REPLAY_FILE = "replay.ckpt"
LEGACY_REPLAY_FILE = "replay.npz"
"""Where runs before checksummed checkpoints saved the buffer (read on resume, never written)."""


def replay_file(run_dir: Path, policy: str) -> Path:
    """Where the run in ``run_dir`` keeps ``policy``'s replay buffer."""
    return run_dir / run_folder.CHECKPOINTS / policy / REPLAY_FILE


def _read_state(path: Path) -> dict[str, np.ndarray]:
    """A saved buffer's arrays; a damaged file raises ValueError naming it."""
    if path.name != LEGACY_REPLAY_FILE:
        state = load_checkpoint_file(path, field="replay")["replay"]
        if not isinstance(state, dict):
            raise ValueError(f"{path} holds no replay buffer")
        return {str(k): np.asarray(v) for k, v in state.items()}
    if not zipfile.is_zipfile(path):  # np.load would take it for a pickle
        raise ValueError("not a numpy .npz archive")
    with np.load(path, allow_pickle=False) as saved:
        return {k: saved[k] for k in saved.files}


def _remove_temporaries(path: Path) -> None:
    """Temporary files of saves that a kill interrupted (``write_atomically`` names them
    ``.<name>.tmp-<pid>-<thread>``); this worker is the only writer of ``path``."""
    for stale in path.parent.glob(f".{path.name}.tmp-*"):
        with contextlib.suppress(OSError):  # the next save reports a folder it cannot write
            stale.unlink(missing_ok=True)
