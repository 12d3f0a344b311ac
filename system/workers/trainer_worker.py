"""The trainer worker: turns sample segments into trainer steps and publishes each new version.

Its batches come from one :class:`~system.workers.batch_source.BatchSource`, which it reads
without naming: the actors' segments (on-policy), or, for an off-policy trainer
(``needs_replay``), its replay worker's transition batches, whose priorities go back with the
request for the next one.

Its stages (:mod:`system.timing`): ``wait_samples`` (or ``wait_replay``), ``receive``
(decoding chunks and cutting a batch from them), ``to_device`` (for a trainer that
``accepts_device_batches``), ``compute`` (``Trainer.step``) and ``publish``. With a loader
thread (:mod:`system.workers.batch_loader`, ``load_ahead``) the first three are the loader's
(:mod:`system.workers.staging` puts its batches on the device), and the trainer's own wait is
``wait_batch``.

Back-pressure comes from the sample stream (bounded queues), so actors slow down when training
does. After every step the new parameters go to the parameter service, which pushes them to the
policy workers; every ``checkpoint_every`` versions the service also writes them to disk, and
this worker's own state (optimiser, schedules) goes with that publish, for the service to write
beside them, so a run can resume. The trainer writes no file itself: a restarted trainer (every
rank of a data-parallel group) reads its state back from the service, so trainers need no run
folder of their own (``troupe deploy k8s --storage pod`` mounts none on them).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from api.policy import SampleBatch
from api.train_result import TrainResult
from api.trainer import Trainer
from system.errors import (
    NonFiniteLossError,
    ParameterNotFoundError,
    PeerTimeoutError,
    TrainerContractError,
)
from system.parameters import trainer_state
from system.parameters.interfaces import ParameterPublisher
from system.roles import Role
from system.streams.samples import SampleConsumer
from system.timing import StageClock
from system.workers.base import Worker
from system.workers.batch_source import BatchSource, SegmentSource
from system.workers.staging import DeviceStager, to_device
from system.workers.trainer_hooks import TrainerHooks

logger = logging.getLogger(__name__)
LEGACY_TRAINER_FILE = "trainer.pt"
"""Where trainers of older runs wrote their state themselves (``torch.save``), in
``checkpoint_dir/<policy>/``: read on resume when the service holds none."""


PUBLISH_RETRY_S = 10.0
"""How long a trainer trains on without publishing after the parameter service did not answer,
unless the controller says where the restarted service is first (then it publishes at once)."""


def segment_source(
    samples: SampleConsumer,
    policy_name: str,
    trainer: Trainer,
    batch_segments: int,
    *,
    max_policy_lag: int | None = None,
    warn_policy_lag: int | None = None,
) -> SegmentSource:
    """An on-policy trainer's source: ``trainer``'s actors' segments, their lag counted from
    the version it trains."""
    return SegmentSource(
        samples,
        policy_name,
        batch_segments,
        lambda: trainer.policy.version,
        max_policy_lag=max_policy_lag,
        warn_policy_lag=warn_policy_lag,
    )


class TrainerWorker(Worker):
    role = Role.TRAINER

    def __init__(
        self,
        worker_id: str,
        policy_name: str,
        trainer: Trainer,
        source: BatchSource,
        params: ParameterPublisher,
        *,
        checkpoint_every: int = 50,
        checkpoint_every_s: float | None = None,
        checkpoint_dir: str | Path | None = None,
        publish_every: int = 1,
        hooks: TrainerHooks | None = None,
        max_steps: int | None = None,
    ):
        """``source``: where its batches come from (:func:`segment_source` for an on-policy
        trainer, a :class:`ReplaySource` for one that learns from replay); ``max_steps``: the
        run's ``stop.trainer_steps``, after which its batches go untrained until the stop."""
        super().__init__(worker_id)
        self.source = source
        self.hooks = hooks
        """The experiment's trainer callbacks (system.workers.trainer_hooks), if any."""
        self.policy_name = policy_name
        self.trainer = trainer
        self.params = params
        self.checkpoint_every = checkpoint_every
        self.checkpoint_every_s = checkpoint_every_s
        """Also persist a version once this long has passed since the last persisted one: a
        trainer with slow steps went minutes between checkpoints by count alone, all lost to a
        run killed at once (a preempted job)."""
        self._persisted_at = time.monotonic()
        self.publish_every = publish_every
        """Publish every this many steps (persisted versions always): see PolicyConfig."""
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        """The run's checkpoints folder, only read: an older run's ``trainer.pt`` (resume)."""
        self.last_batch: SampleBatch | None = None
        self.steps = 0
        """Trainer steps of the run: this process's, or the trainer's own count where that is
        further (its state restored on a resume or after a restart)."""
        self._published = False
        self._owed_persist = False
        """A persisted publish failed: the next publish persists, so no checkpoint is skipped."""
        self._retry_at = 0.0
        """After a publish timed out: when to try again on the same client (a restarted
        service's new address, from :meth:`reconnect`, comes sooner)."""
        self.stager: DeviceStager | None = None
        """Set by :meth:`load_ahead` for a trainer that takes device batches."""
        self.max_steps = max_steps

    def thread_stages(self) -> dict[str, StageClock]:
        return self.source.stages()

    def load_ahead(self) -> None:
        """Receive, cut and (for a trainer that ``accepts_device_batches``) put on the device
        the next batch on a loader thread while this one trains. Process mode only: the
        source must be a :class:`SegmentSource`, read by this one trainer."""
        if not isinstance(self.source, SegmentSource):
            raise TypeError(f"only segments are loaded ahead, not {type(self.source).__name__}")
        device = self._device()
        if device is not None:
            self.stager = DeviceStager(device)
        prepare = None if self.stager is None else self.stager.prepare
        self.source.start_loader(self.worker_id, prepare)

    def collect_stats(self) -> dict[str, Any]:
        """Its stats, with the version it holds once that is published: a resumed run's
        panel showed ``v0`` until its trainer's first step, not the version it resumed at."""
        held = {"version": self.trainer.policy.version} if self._published else {}
        return {**held, **super().collect_stats(), **self.source.stats()}

    def poll(self) -> int:
        if not self._published and time.monotonic() >= self._retry_at:
            self.stages.enter("publish")
            # policy workers start from these weights: their answer is waited for, so a
            # refusal fails here; sent without waiting, a refused first version left every
            # policy worker waiting for parameters that never came (restarts, no error)
            self.publish(persist=self._owed_persist, wait=True)
        batch = self.take_batch(timeout_ms=20)
        if batch is None:
            return 0
        if self.max_steps is not None and self.steps >= self.max_steps:
            # stop.trainer_steps is met: stepping on until the controller's stop took a run of
            # 100 to 113-115. Batches are still taken, so no actor waits on this trainer.
            return 0
        self.train(batch)
        return 1

    def _numbers(self, stats: dict[str, Any]) -> dict[str, Any]:
        """``stats`` as plain numbers: a one-value tensor or array becomes its number (a 0-d
        tensor left in went missing from the metrics without a word); anything else says which
        stat it is, where torch's own error named none."""
        out = {}
        for key, value in stats.items():
            if not isinstance(value, (bool, int, float)) and callable(getattr(value, "item", None)):
                with contextlib.suppress(ValueError, RuntimeError):  # more than one: below
                    value = value.item()
            if not isinstance(value, (bool, int, float)):
                shape = getattr(value, "shape", None)
                raise TrainerContractError(
                    f"trainer of policy '{self.policy_name}': stat '{key}' is "
                    f"{type(value).__name__}{'' if shape is None else f' of shape {tuple(shape)}'}"
                    "; a stat is one number (log a mean, or each value under a key of its own)"
                )
            out[key] = value
        return out

    def take_batch(self, timeout_ms: int = 0) -> SampleBatch | None:
        """The next batch from its source, once one is in."""
        return self.source.take(timeout_ms, self.stages)

    def train(self, batch: SampleBatch) -> dict[str, float]:
        started = time.perf_counter()
        version_before = self.trainer.policy.version
        self.stages.enter("to_device")
        staged = self._to_device(batch)
        self.stages.enter("compute")
        result = self.trainer.step(staged)
        result.stats = self._numbers(result.stats)
        if self.trainer.policy.version <= version_before:
            raise TrainerContractError(
                f"trainer of policy '{self.policy_name}': step {result.step} left the policy at "
                f"version {self.trainer.policy.version}; a step that changed the parameters "
                "calls self.policy.inc_version() (the parameter service takes only newer ones)"
            )
        bad = [k for k, v in result.stats.items() if not math.isfinite(float(v))]
        if bad:
            raise NonFiniteLossError(
                f"trainer of policy '{self.policy_name}' produced non-finite {bad} at step "
                f"{result.step}; lower the learning rate or check the rewards for NaN/inf"
            )
        # the trainer's own count goes on across a restart or a resume (its state is restored);
        # this process's alone would start from 0 again (stop.trainer_steps, PBT's intervals)
        self.steps = max(self.steps + 1, int(result.step))
        self.last_batch = batch
        self.source.trained(batch, self.trainer)
        version = self.trainer.policy.version
        persist = self._persist_due(version)
        if persist or self.steps % self.publish_every == 0:  # the final one goes at stop
            self.stages.enter("publish")
            self.publish(persist=persist)
        stats = dict(result.stats)
        stats["version"] = version
        stats.update(self.source.age(version_before, batch))
        stats["step_s"] = time.perf_counter() - started
        stats["steps"] = self.steps
        if self.hooks is not None:
            stats.update(self.hooks.after_step(self._result(batch, stats)))
        self.stats.update(stats)
        self.stats["samples"] = self.stats.get("samples", 0) + int(np.prod(batch.reward.shape))
        return stats

    def _persist_due(self, version: int) -> bool:
        """Whether ``version`` is written to the run folder: every ``checkpoint_every``
        versions, or once ``checkpoint_every_s`` has passed since the last one written."""
        if self.checkpoint_every <= 0:  # no run folder (serial mode)
            return False
        if version % self.checkpoint_every == 0:
            return True
        every_s = self.checkpoint_every_s
        return every_s is not None and time.monotonic() - self._persisted_at >= every_s

    def _result(self, batch: SampleBatch, stats: dict[str, float]) -> TrainResult:
        return TrainResult(
            policy=self.policy_name,
            worker=self.worker_id,
            steps=self.steps,
            version=int(stats["version"]),
            stats=dict(stats),
            batch=batch,
            trainer=self.trainer,
        )

    def _device(self) -> torch.device | None:
        """The policy's device, for a trainer that takes batches there; None otherwise."""
        device = getattr(self.trainer.policy, "device", None)
        if not self.trainer.accepts_device_batches or not isinstance(device, torch.device):
            return None
        return device

    def _to_device(self, batch: SampleBatch) -> SampleBatch:
        """The batch as tensors on the policy's device, for a trainer that takes them
        (``accepts_device_batches``): the loader's, if it staged this batch; otherwise the
        batch itself, which ``step`` converts."""
        staged = None if self.stager is None else self.stager.take(batch)
        if staged is not None:
            return staged
        device = self._device()
        if device is None:
            return batch
        return to_device(batch, device)

    def publish(self, persist: bool, wait: bool = False) -> None:
        """Publish the current version. If the parameter service does not answer (it is being
        restarted), training goes on and the newest version is published once it is back: until
        the retry is due (or :meth:`reconnect` says where the service now is), new versions are
        not sent into the silence, each waiting out its own timeout, but owed."""
        persist = persist or self._owed_persist
        if time.monotonic() < self._retry_at:
            self._published, self._owed_persist = False, persist
            return
        try:
            self._publish(persist, wait)
        except PeerTimeoutError as e:
            self._published = False
            self._owed_persist = persist
            self._retry_at = time.monotonic() + PUBLISH_RETRY_S
            self.stats["publish_timeouts"] = self.stats.get("publish_timeouts", 0) + 1
            logger.warning("%s: version %d not published yet: %s", self.worker_id,
                           self.trainer.policy.version, e)  # fmt: skip

    def _publish(self, persist: bool, wait: bool = False) -> None:
        """A persisted version takes the trainer's own state along (see the module doc) and is
        waited for. Any other goes without waiting for the service's answer, which the next
        publish takes (and raises what it raised): on a busy 2-core machine, waiting took 13%
        of cartpole-dqn's trainer, a version every 10 steps."""
        policy = self.trainer.policy
        if not persist and not wait:
            self.params.publish_nowait(self.policy_name, policy.version, policy.get_checkpoint())
        elif not persist:
            self.params.publish(self.policy_name, policy.version, policy.get_checkpoint())
        else:
            self.params.publish(
                self.policy_name,
                policy.version,
                policy.get_checkpoint(),
                persist=True,
                trainer_state=trainer_state.wrap(self.trainer.get_checkpoint(), self.steps),
            )
        self._published, self._retry_at = True, 0.0
        self._owed_persist = self._owed_persist and not persist
        if persist:
            self._persisted_at = time.monotonic()

    def reconnect(self, params: ParameterPublisher) -> None:
        """The parameter service was restarted at new addresses: publish there from now on. It
        starts from the newest version it announced; if that is older than ours, ours follows
        on the next poll."""
        old, self.params = self.params, params
        old.close()
        self._retry_at = 0.0
        try:
            version, _ = params.get(self.policy_name)
        except (ParameterNotFoundError, PeerTimeoutError):
            version = None
        caught_up = version is not None and version >= self.trainer.policy.version
        self._published = caught_up and not self._owed_persist

    def mark_published(self) -> None:
        """The current version is already in the parameter service (resume, restart)."""
        self._published = True

    def on_stop(self) -> None:
        """Persist the final version, so the run folder ends with its last parameters."""
        try:
            self.params.settle()  # an earlier version's answer: it must not stop the last one
        except Exception as e:  # the final publish below reports its own errors
            logger.warning("%s: an earlier version was not published: %s", self.worker_id, e)
        self._publish(persist=True)  # no service to take it is an error worth reporting

    def restore(self, policy_checkpoint: dict[str, Any] | None) -> None:
        """Resume: load published parameters and, if the parameter service saved one, this
        trainer's own state (that of the newest persisted version). A run folder of an older
        run may hold it as ``trainer.pt`` instead: read when the service has none."""
        if policy_checkpoint is not None:
            self.trainer.policy.load_checkpoint(policy_checkpoint)
        saved = self.params.trainer_state(self.policy_name)
        if saved is not None:
            version, wired = saved
            state, steps = trainer_state.unwrap(wired)
            self.trainer.load_checkpoint(state)
            self.steps = max(self.steps, steps or 0)
            if trainer_state.is_empty(state):
                logger.info("%s: version %d restored at step %d; its trainer keeps no state of "
                            "its own (get_checkpoint() returns {})", self.worker_id, version,
                            self.steps)  # fmt: skip
            else:
                logger.info("%s: trainer state of version %d restored at step %d",
                            self.worker_id, version, self.steps)  # fmt: skip
            return
        path = (
            self.checkpoint_dir / self.policy_name / LEGACY_TRAINER_FILE
            if self.checkpoint_dir
            else None
        )
        if path is not None and path.exists():
            state = torch.load(path, weights_only=False)
            self.trainer.load_checkpoint(state["trainer"])
            logger.info("%s: trainer state restored from %s", self.worker_id, path)

    def close(self) -> None:
        self.source.close()
        self.params.close()
