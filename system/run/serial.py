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
from system.eval_quota import exact_quotas
from system.parameters.inproc import InprocParameterService
from system.parameters.store import ParameterStore
from system.roles import Role
from system.run import builders
from system.run.plan import SerialOptions, WorkerPlan, plan_workers
from system.streams.inference import InprocInferenceHub
from system.streams.replay import InprocReplayHub
from system.streams.samples import InprocSampleHub
from system.workers.actor_worker import ActorWorker
from system.workers.base import Worker
from system.workers.trainer_worker import TrainerWorker

logger = logging.getLogger(__name__)

MAX_CATCH_UP_POLLS = 10_000
"""A bound on one round's catching up, should a limiter never say no (it always does: sampled
transitions are bounded by inserted frames times ``samples_per_insert`` plus its tolerance)."""


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


class InprocWiring:
    """Serial mode: peers are in-process queues, and the parameter service is the shared store.

    In one process there is no parameter-service worker: every worker gets its own
    :class:`InprocParameterService` client over one :class:`ParameterStore`."""

    waits_for_peers = False
    threads = False
    run_dir = None

    def __init__(self, store: ParameterStore, config: ExperimentConfig):
        self.store = store
        self.config = config
        self._spaces: builders.AgentSpaces | None = None
        self.inference = InprocInferenceHub()
        self.samples = InprocSampleHub()
        self.replay = InprocReplayHub()

    @property
    def spaces(self) -> builders.AgentSpaces:
        """The agents' spaces, from one environment built once for every worker here."""
        if self._spaces is None:
            self._spaces = builders.probe_spaces(self.config)
        return self._spaces

    def keep_alive(self) -> None:
        """No controller to answer in one process."""

    def parameter_client(self, subscribe: list[str]) -> InprocParameterService:
        return InprocParameterService(self.store)

    def parameter_server(self, store: ParameterStore) -> Worker:
        raise NotImplementedError("serial mode serves parameters from its in-process store")

    # In one process a stream is a queue per policy: the endpoint names have nothing to find.
    def inference_server(self, name: str, policy_name: str):
        return self.inference.server(policy_name)

    def inference_client(self, client_id: str, names: dict[str, str]):
        return self.inference.client(client_id)

    def sample_consumer(self, name: str, policy_name: str):
        return self.samples.consumer(policy_name)

    def sample_producer(self, names: dict[str, list[str]]):
        return self.samples.producer()

    def replay_server(self, name: str, policy_name: str):
        return self.replay.server(policy_name)

    def replay_client(self, name: str, policy_name: str, client_id: str):
        return self.replay.client(policy_name, client_id)

    def trainer_group(self, name: str, policy_name: str, rank: int, size: int) -> None:
        """Serial mode builds one trainer per policy whatever ``trainer_workers`` says: its
        in-process queue is the policy's whole sample stream, so there is no group to form and
        the trainer trains alone."""
        return None


def serial_plans(config: ExperimentConfig, options: SerialOptions) -> list[WorkerPlan]:
    """The run's plan as serial mode builds it, in start order; each plan says whether serial
    mode has it (:meth:`~system.run.plan.WorkerPlan.in_serial`): no parameter-service worker
    (the store is in this process), one policy worker and one trainer per policy (the in-process
    queues are the whole group), training actors if ``options.train``, evaluation actors if
    ``options.evaluation``.

    So ``trainer_workers=N`` is a process-mode feature: serially, such a policy trains as one
    trainer on ``batch_segments`` segments a step, not ``N x batch_segments``; test data-parallel
    training with real processes (``tests/system/test_trainer_group.py``)."""
    plans = (plan.in_serial(options) for plan in plan_workers(config))
    return [plan for plan in plans if plan is not None]


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
        self.store = store if store is not None else ParameterStore()
        self.wiring = InprocWiring(self.store, self.config)
        options = SerialOptions(train, evaluation or not train, validate_actions)
        self.plans = serial_plans(config, options)
        # Built in start order (trainers before policy workers and actors): each trainer
        # publishes its policy's first version before anything acts.
        self.built: dict[str, Worker] = {
            p.worker_id: builders.build(p, self.config, self.wiring).worker for p in self.plans
        }
        # Every worker, in the order a round polls them (and close closes them); the sort is
        # stable, so workers of one role keep their plan order.
        polled = sorted(self.plans, key=lambda p: p.poll_order)
        self.workers: list[Worker] = [self.built[p.worker_id] for p in polled]
        self.catching_up: list[Worker] = [
            self.built[p.worker_id] for p in polled if p.catches_up(self.config)
        ]
        """Polled again within a round while their trainers train (:meth:`poll`)."""
        # What the progress is counted from: frames and episodes, and training steps.
        self.actors: list[ActorWorker] = self.workers_of(Role.ACTOR)
        self.trainers: dict[str, TrainerWorker] = {
            w.policy_name: w for w in self.workers_of(Role.TRAINER)
        }
        self.progress = SerialProgress()

    def workers_of(self, role: str) -> list[Any]:
        """The built workers of ``role``, in plan order."""
        return [self.built[p.worker_id] for p in self.plans if str(p.role) == str(role)]

    # ----------------------------------------------------------------- running
    def poll(self) -> int:
        """Poll every worker once, then let trainers on a rate-limited replay buffer catch up;
        return the work done.

        A round steps every actor's environments once, so a trainer polled once a round could
        make one step per ``envs_per_worker`` frames whatever ``samples_per_insert`` allows:
        cartpole-dqn's one actor of 32 got a quarter of its updates and learned a different
        run than its processes do. So the replay workers and trainers that
        :meth:`~system.run.plan.WorkerPlan.catches_up` names are polled again, in order, until
        no trainer makes a step: as many steps as the limiter lets through, as in process mode
        when the trainer keeps up. A buffer with no ratio sets no such bound, and its trainer
        keeps one step a round."""
        work = 0
        for worker in self.workers:
            work += worker.poll()
        self._collect()
        return work + self._catch_up()

    def _collect(self) -> None:
        self._collect_actors()
        self._collect_trainers()

    def _catch_up(self) -> int:
        if not self.catching_up:
            return 0
        work = 0
        for _ in range(MAX_CATCH_UP_POLLS):
            steps_before = self._steps()
            for worker in self.catching_up:
                work += worker.poll()
            self._collect_trainers()
            if self._steps() == steps_before:
                break
        return work

    def _steps(self) -> int:
        return sum(len(stats) for stats in self.progress.trainer_stats.values())

    def _collect_actors(self) -> None:
        p = self.progress
        for actor in self.actors:
            stats = actor.collect_stats()
            p.env_frames += stats.get("env_frames", 0)
            p.eval_env_frames += stats.get("eval_env_frames", 0)
            p.episodes.extend(stats.get("episodes", []))
            p.eval_episodes.extend(stats.get("eval_episodes", []))

    def _collect_trainers(self) -> None:
        p = self.progress
        for name, trainer in self.trainers.items():
            stats = trainer.collect_stats()
            if "steps" in stats:
                p.trainer_stats.setdefault(name, []).append(stats)

    def eval_until(self, episodes: int, max_idle_polls: int = 1000) -> list[dict[str, float]]:
        """Poll until every evaluation environment has finished its quota of ``episodes``
        (:func:`system.eval_quota.exact_quotas`: decided by environment, so long episodes
        count as often as short ones); return them, environment by environment."""
        names = [f"{a.worker_id}/{e}" for a in self.actors if a.is_evaluation
                 for e in range(len(a.envs))]  # fmt: skip
        if not names:
            raise ValueError("eval_until needs evaluation actors (evaluation.workers >= 1)")
        quotas = exact_quotas(names, episodes)
        taken: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        seen = idle = 0
        while any(len(taken[n]) < quotas[n] for n in names):
            idle = 0 if self.poll() else idle + 1
            if idle >= max_idle_polls:
                raise RuntimeError("evaluation made no progress for 1000 polls")
            for episode in self.progress.eval_episodes[seen:]:
                mine = taken.get(str(episode.get("env")))
                if mine is not None and len(mine) < quotas[str(episode["env"])]:
                    mine.append(episode)
            seen = len(self.progress.eval_episodes)
        return [episode for name in names for episode in taken[name]]

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
