"""test_pipeline's runtime half: environment, policy and trainer together, in one process.

It runs the runtime's own actor, policy and trainer workers wired together in this process
(``system.run.serial``), so what passes here is what a distributed run executes. Before the first
trainer step it checks the first sample batch and what ``policy.analyze`` returns against the
trainer's declared ``AnalyzedResult``; every action is checked against the action space; after
the run, that versions went up, the policy workers took the new parameters and losses stayed
finite. Any problem raises :class:`~api.errors.PipelineCheckError` saying what to fix.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from typing import Any

import numpy as np
import torch

from api.config import (
    ActorConfig,
    ComponentConfig,
    EvaluationConfig,
    ExperimentConfig,
    PolicyConfig,
    ReplayConfig,
    StopConfig,
)
from api.errors import PipelineCheckError, UserError
from api.policy import SampleBatch
from api.resolve import ENVIRONMENT_EXPERIMENT, for_environment, load_experiment
from api.testing import PipelineReport
from system.errors import WireError
from system.parameters import trainer_state
from system.roles import Role
from system.streams import wire


def run_pipeline_check(
    environment: str | ComponentConfig | None = None,
    policy: str | ComponentConfig | None = None,
    trainer: str | ComponentConfig | None = None,
    *,
    experiment: str | ExperimentConfig | None = None,
    trainer_steps: int = 3,
    episodes: int = 1,
    envs: int = 4,
    segment_length: int = 32,
    batch_segments: int = 4,
    seed: int = 0,
    max_env_frames: int = 200_000,
    algo: str | None = None,
) -> PipelineReport:
    """The runtime half of :func:`api.testing.test_pipeline` (which documents the arguments)."""
    from system.run.serial import SerialRun  # the runtime's own components, loaded on use

    if algo is not None and (environment is None or policy or trainer or experiment):
        raise PipelineCheckError(
            f"algo={algo} sets an algorithm up on an environment: give the environment alone "
            "(a policy, trainer or experiment has its own)"
        )
    config = _config(
        environment, policy, trainer, experiment, envs, segment_length, batch_segments, seed,
        max_env_frames, algo or ENVIRONMENT_EXPERIMENT,
    )  # fmt: skip
    run = SerialRun(config, validate_actions=True)
    try:
        report = PipelineReport(
            experiment=config.name,
            trainers={name: p.trainer.type for name, p in config.policies.items()},
        )
        for name, worker in run.trainers.items():
            report.batch_shapes[name] = _check_first_batch(run, name, worker, max_env_frames)
        _run(run, trainer_steps, episodes, max_env_frames)
        _check_progress(run, report)
        return report
    finally:
        run.close()


def _component(value: str | ComponentConfig | None, what: str) -> ComponentConfig:
    if value is None:
        raise PipelineCheckError(f"test_pipeline needs a {what} (or an experiment)")
    return ComponentConfig(value) if isinstance(value, str) else value


def _config(
    environment,
    policy,
    trainer,
    experiment,
    envs,
    segment_length,
    batch_segments,
    seed,
    max_env_frames,
    algo,
) -> ExperimentConfig:
    """The experiment the check runs. Its stop rule is the check's own frame bound (the serial
    run stops itself; a config's checks still read the rule, as a replay ``min_size`` within it)."""
    if experiment is None and policy is None and trainer is None and environment is not None:
        env = _component(environment, "environment")  # as troupe test-pipeline ENV: ppo on it
        experiment = for_environment(env.type, env.args, algo)
    if experiment is not None:
        config = load_experiment(experiment) if isinstance(experiment, str) else experiment
        config = dataclasses.replace(config)
        config.actors = dataclasses.replace(config.actors, workers=1, envs_per_worker=envs)
        config.evaluation = dataclasses.replace(config.evaluation, workers=0)
        config.stop = StopConfig(env_frames=max_env_frames)
        return config
    return ExperimentConfig(
        name="test-pipeline",
        environment=_component(environment, "environment"),
        policies={
            "default": PolicyConfig(
                policy=_component(policy, "policy"),
                trainer=_component(trainer, "trainer"),
                batch_segments=batch_segments,
                # an off-policy trainer's first batch as soon as one chunk is in
                replay=ReplayConfig(
                    capacity_frames=10_000, batch_size=32, min_size=envs * segment_length
                ),
            )
        },
        actors=ActorConfig(workers=1, envs_per_worker=envs, segment_length=segment_length),
        evaluation=EvaluationConfig(workers=0),
        stop=StopConfig(env_frames=max_env_frames),
        seed=seed,
    )


def _check_first_batch(run, name: str, worker, max_env_frames: int) -> dict[str, Any]:
    """Fill the trainer's first batch, then check its shapes and what analyze returns."""
    from system.workers.batch_source import SegmentSource
    from system.workers.trajectory import batch_segments

    source = worker.source
    if not isinstance(source, SegmentSource):  # it learns from replay
        return _check_first_replay_batch(run, name, worker, max_env_frames)
    size = source.batch_segments  # on-policy: its batch is checked before it is cut
    while source.pending_segments < size:
        for other in _feeders(run):
            other.poll()
        source.gather(0, worker.stages)
        run._collect()
        if run.progress.env_frames > max_env_frames:
            raise PipelineCheckError(
                f"no batch of {size} segments for policy '{name}' after "
                f"{max_env_frames} env frames: do the agents of this policy ever act?"
            )
    batch = batch_segments(source.buffer)[:, :size]
    _check_batch_shapes(batch, run.config.actors.segment_length + 1, size)
    _check_analyze(worker.trainer, batch, name, segments=True)
    return batch.shape


def _feeders(run) -> list[Any]:
    """Every worker but the trainers, in poll order: what fills a trainer's first batch."""
    trainers = list(run.trainers.values())
    return [w for w in run.workers if all(w is not t for t in trainers)]


def _check_first_replay_batch(run, name: str, worker, max_env_frames: int) -> dict[str, Any]:
    """A replay trainer's first batch comes from its replay worker: check what analyze returns
    for it, then train on it (it was taken from the stream)."""
    batch = None
    while batch is None:
        for other in _feeders(run):
            other.poll()
        batch = worker.take_batch(timeout_ms=0)
        run._collect()
        if batch is None and run.progress.env_frames > max_env_frames:
            raise PipelineCheckError(
                f"no replayed batch for policy '{name}' after {max_env_frames} env frames: do "
                "the agents of this policy ever act? (is replay.min_size reachable?)"
            )
    _check_analyze(worker.trainer, batch, name)
    worker.train(batch)
    return batch.shape


def _check_batch_shapes(batch: SampleBatch, t: int, b: int) -> None:
    for field_name in ("reward", "done", "truncated", "on_reset", "policy_version"):
        shape = getattr(batch, field_name).shape
        if shape != (t, b, 1):
            raise PipelineCheckError(
                f"sample batch field '{field_name}' has shape {shape}, expected {(t, b, 1)}"
            )
    for path, leaf in batch.flatten():
        if leaf.shape[:2] != (t, b):
            raise PipelineCheckError(
                f"sample batch field '{path}' has shape {leaf.shape}; every field must start "
                f"with [T={t}, B={b}]: the policy's rollout must return one row per request"
            )


def _check_analyze(trainer, batch: SampleBatch, name: str, segments: bool = False) -> None:
    """What ``analyze`` returns, against what the trainer declares; ``segments``: a batch of
    trajectory segments, whose every field is ``[T, B, ...]``."""
    required = trainer.required_fields()
    if not required:
        return
    result = trainer.policy.analyze(batch, target=trainer.analyze_target)
    have = (
        {f.name for f in dataclasses.fields(result)}
        if dataclasses.is_dataclass(result)
        else set(vars(result))
        if hasattr(result, "__dict__")
        else set()
    )
    said = (f"policy '{name}' ({type(trainer.policy).__name__}).analyze(target="
            f"'{trainer.analyze_target}') returned")  # fmt: skip
    declared = getattr(trainer.AnalyzedResult, "__qualname__", "AnalyzedResult")
    if isinstance(result, dict):
        raise PipelineCheckError(
            f"{said} a dict; it returns the dataclass {type(trainer).__name__} declares, "
            f"{declared}({', '.join(f'{f}=...' for f in required)})"
        )
    missing = [f for f in required if f not in have or getattr(result, f, None) is None]
    if missing:
        raise PipelineCheckError(
            f"{said} {type(result).__name__} without {missing}; "
            f"{type(trainer).__name__} declares AnalyzedResult fields {required}"
        )
    tensors = {
        f: getattr(result, f) for f in required if isinstance(getattr(result, f), torch.Tensor)
    }
    if tensors and not any(t.requires_grad for t in tensors.values()):
        raise PipelineCheckError(
            f"{said} no tensor that requires grad ({sorted(tensors)}): the trainer "
            "differentiates through them; was analyze run under torch.no_grad()?"
        )
    leading = {f: tuple(t.shape[:2]) for f, t in tensors.items()}
    if segments and len(set(leading.values())) > 1:
        raise PipelineCheckError(
            f"{said} fields of different leading shapes: "
            + ", ".join(f"{f} {tuple(tensors[f].shape)}" for f in sorted(tensors))
            + "; each is [T, B, ...] as the sample batch's fields are (a [T*B] one would be "
            "broadcast against the others in the loss)"
        )


def _run(run, trainer_steps: int, episodes: int, max_env_frames: int) -> None:
    from system.errors import NonFiniteLossError

    started = time.perf_counter()
    try:
        while not _enough(run, trainer_steps, episodes):
            run.poll()
            if run.progress.env_frames > max_env_frames:
                raise PipelineCheckError(
                    f"after {max_env_frames} env frames: {len(run.progress.episodes)} of "
                    f"{episodes} episodes finished, trainer steps {_steps(run)}; does the "
                    "environment ever end an episode?"
                )
    except NonFiniteLossError as e:
        raise PipelineCheckError(str(e)) from e
    finally:
        run.progress.wall_s += time.perf_counter() - started


def _steps(run) -> dict[str, int]:
    return {name: run.progress.trainer_steps(name) for name in run.trainers}


def _enough(run, trainer_steps: int, episodes: int) -> bool:
    steps_ok = all(s >= trainer_steps for s in _steps(run).values())
    return steps_ok and len(run.progress.episodes) >= episodes


def _check_progress(run, report: PipelineReport) -> None:
    p = run.progress
    report.env_frames, report.episodes = p.env_frames, len(p.episodes)
    report.mean_episode_return = p.recent_return(len(p.episodes))
    report.wall_s = p.wall_s
    for name in run.trainers:
        history = p.trainer_stats.get(name, [])
        versions = [int(s["version"]) for s in history]
        if any(b <= a for a, b in itertools.pairwise(versions)):
            raise PipelineCheckError(f"policy '{name}' versions did not increase: {versions}")
        for stats in history:
            bad = {k: v for k, v in stats.items() if isinstance(v, float) and not math.isfinite(v)}
            if bad:
                raise PipelineCheckError(f"trainer of policy '{name}' reported non-finite {bad}")
        report.trainer_steps[name] = len(history)
        report.versions[name] = versions
        report.last_stats[name] = (
            {k: float(v) for k, v in history[-1].items() if isinstance(v, (int, float, np.number))}
            if history
            else {}
        )
    for name, worker in run.trainers.items():
        _check_trainer_state(name, worker.trainer)
    for worker in run.workers_of(Role.POLICY):
        worker.poll()  # a policy worker takes new parameters at its next poll: give it one
        # what the trainer published (every step, or every publish_every steps)
        published = run.store.latest_version(worker.policy_name)
        if published is not None and worker.policy.version < published:
            raise PipelineCheckError(
                f"policy worker of '{worker.policy_name}' still serves version "
                f"{worker.policy.version} after the trainer published {published}: its "
                "load_checkpoint() does not take the published parameters (or the version)"
            )


def _check_trainer_state(name: str, trainer) -> None:
    """What ``get_checkpoint`` returns goes to the parameter service with every persisted
    version; a state that cannot travel (an optimiser object, not its ``state_dict()``)
    passed here and failed the run at its first persisted version."""
    try:
        wire.encode("trainer_state", {"state": trainer_state.to_wire(trainer.get_checkpoint())})
    except (UserError, WireError) as e:
        raise PipelineCheckError(
            f"trainer of policy '{name}' ({type(trainer).__name__}).get_checkpoint() returned "
            f"what cannot be saved with its versions: {e}; return dicts, lists, numbers, "
            "tensors and arrays (an optimiser's state_dict(), not the optimiser)"
        ) from e
