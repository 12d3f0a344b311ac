"""Serial mode: every worker of an experiment wired together in one process.

The actor, policy and trainer workers here are the very classes a distributed run starts in
separate processes; only the streams differ (in-process queues instead of ZeroMQ sockets, an
in-process parameter service). ``api.testing.test_pipeline`` and the learning checks run through
this, so what they test is the production code path. It is also the easiest place to debug a new
environment or policy: one process, one stack trace.

    run = SerialRun(make_experiment("cartpole-ppo"))
    history = run.run(env_frames=50_000)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from api.config import ExperimentConfig, check
from system.parameters.client import InprocParameterService
from system.parameters.store import ParameterStore
from system.run import builders
from system.streams.inference import InprocInferenceHub
from system.streams.samples import InprocSampleHub
from system.workers.actor_worker import ActorWorker
from system.workers.base import Worker
from system.workers.policy_worker import PolicyWorker
from system.workers.trainer_worker import TrainerWorker

logger = logging.getLogger(__name__)


@dataclass
class SerialProgress:
    """What a serial run has done so far."""

    env_frames: int = 0
    eval_env_frames: int = 0
    episodes: list[dict[str, float]] = field(default_factory=list)
    eval_episodes: list[dict[str, float]] = field(default_factory=list)
    trainer_stats: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    wall_s: float = 0.0

    def recent_return(self, n: int = 20, key: str = "episode_return") -> float | None:
        if not self.episodes:
            return None
        return float(np.mean([e[key] for e in self.episodes[-n:] if key in e]))

    def trainer_steps(self, policy: str) -> int:
        return len(self.trainer_stats.get(policy, []))


class SerialRun:
    """Builds and polls every worker of ``config`` in this process."""

    def __init__(
        self,
        config: ExperimentConfig,
        *,
        evaluation: bool = False,
        validate_actions: bool = False,
        store: ParameterStore | None = None,
        train: bool = True,
    ):
        """``train=False`` runs evaluation actors only, on the parameters already in ``store``."""
        self.config = check(config)
        self.spaces = builders.probe_spaces(config)
        self.store = store if store is not None else ParameterStore()
        self.inference = InprocInferenceHub()
        self.samples = InprocSampleHub()
        self.trainers = self._make_trainers() if train else {}
        self.policy_workers = self._make_policy_workers()
        self.actors = self._make_actors(train, evaluation or not train, validate_actions)
        self.progress = SerialProgress()

    @property
    def workers(self) -> list[Worker]:
        return [*self.actors, *self.policy_workers, *self.trainers.values()]

    def _make_trainers(self) -> dict[str, TrainerWorker]:
        out = {}
        for name in builders.trained_policies(self.config):
            policy = builders.make_policy(self.config, name, self.spaces, self.config.seed)
            trainer = builders.make_trainer(self.config, name, policy)
            out[name] = TrainerWorker(
                f"trainer/{name}/0",
                name,
                trainer,
                self.samples.consumer(name),
                InprocParameterService(self.store),
                batch_segments=self.config.policies[name].batch_segments,
                checkpoint_every=0,
            )
        return out

    def _make_policy_workers(self) -> list[PolicyWorker]:
        workers = []
        for name in self.config.policies:
            policy = builders.make_policy(self.config, name, self.spaces, self.config.seed + 1)
            workers.append(
                PolicyWorker(
                    f"policy/{name}/0",
                    name,
                    policy,
                    self.inference.server(name),
                    InprocParameterService(self.store),
                )
            )
        return workers

    def _make_actors(self, train: bool, evaluation: bool, validate_actions: bool):
        cfg = self.config
        actors = []
        for i in range(cfg.actors.workers if train else 0):
            actors.append(
                self._actor(f"actor/{i}", cfg.actors.envs_per_worker, False, i, validate_actions)
            )
        if evaluation:
            for i in range(cfg.evaluation.workers):
                actors.append(
                    self._actor(
                        f"eval/{i}",
                        cfg.evaluation.envs_per_worker,
                        True,
                        1000 + i,
                        validate_actions,
                    )
                )
        return actors

    def _actor(self, wid: str, n_envs: int, is_eval: bool, index: int, validate: bool):
        cfg = self.config
        return ActorWorker(
            wid,
            builders.env_factory(cfg),
            n_envs,
            cfg.policy_of_agent,
            self.inference.client(wid),
            None if is_eval else self.samples.producer(),
            segment_length=cfg.actors.segment_length,
            is_evaluation=is_eval,
            seed=cfg.seed * 100_003 + index * 1_009,
            on_env_error=cfg.actors.on_env_error,
            validate_actions=validate,
            groups=1 if is_eval else cfg.actors.groups,
        )

    # ----------------------------------------------------------------- running
    def poll(self) -> int:
        """Poll every worker once; return the work done."""
        work = 0
        for worker in self.workers:
            work += worker.poll()
        self._collect()
        return work

    def _collect(self) -> None:
        p = self.progress
        for actor in self.actors:
            stats = actor.collect_stats()
            p.env_frames += stats.get("env_frames", 0)
            p.eval_env_frames += stats.get("eval_env_frames", 0)
            p.episodes.extend(stats.get("episodes", []))
            p.eval_episodes.extend(stats.get("eval_episodes", []))
        for name, trainer in self.trainers.items():
            stats = trainer.collect_stats()
            if "steps" in stats:
                p.trainer_stats.setdefault(name, []).append(stats)

    def eval_until(self, episodes: int, max_idle_polls: int = 1000) -> list[dict[str, float]]:
        """Poll until ``episodes`` evaluation episodes have finished; return them."""
        idle = 0
        while len(self.progress.eval_episodes) < episodes:
            idle = 0 if self.poll() else idle + 1
            if idle >= max_idle_polls:
                raise RuntimeError("evaluation made no progress for 1000 polls")
        return self.progress.eval_episodes[:episodes]

    def run(
        self,
        *,
        env_frames: int | None = None,
        trainer_steps: int | None = None,
        episodes: int | None = None,
        until_return: float | None = None,
        return_window: int = 20,
        max_idle_polls: int = 1000,
    ) -> SerialProgress:
        """Poll until the first limit given is reached."""
        if env_frames is None and trainer_steps is None and episodes is None:
            raise ValueError("give at least one of env_frames, trainer_steps, episodes")
        started = time.perf_counter()
        idle = 0
        while not self._done(env_frames, trainer_steps, episodes, until_return, return_window):
            idle = 0 if self.poll() else idle + 1
            if idle >= max_idle_polls:
                raise RuntimeError(
                    "serial run made no progress for 1000 polls: a worker is waiting on something "
                    "that never comes (check batch_segments against the number of actors)"
                )
        self.progress.wall_s += time.perf_counter() - started
        return self.progress

    def _done(self, env_frames, trainer_steps, episodes, until_return, window) -> bool:
        p = self.progress
        if env_frames is not None and p.env_frames >= env_frames:
            return True
        if trainer_steps is not None and all(
            p.trainer_steps(name) >= trainer_steps for name in self.trainers
        ):
            return True
        if episodes is not None and len(p.episodes) >= episodes:
            return True
        if until_return is not None and len(p.episodes) >= window:
            return (p.recent_return(window) or -np.inf) >= until_return
        return False

    def close(self) -> None:
        for worker in self.workers:
            worker.close()
