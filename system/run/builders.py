"""Build a run's workers from their plans: one builder per role, for every mode.

A builder turns a typed :class:`~system.run.plan.WorkerPlan` and the experiment into a ready
worker. What differs between a run of many processes and serial mode (every worker in one
process) is only how workers reach each other, which a :class:`Wiring` provides: ZeroMQ sockets
found through the controller (:mod:`system.run.worker_process`) or in-process queues
(:mod:`system.run.serial`). So the worker a test builds in one process is the worker a run
starts, argument for argument.

The runtime never imports a concrete environment, policy or trainer: it asks the registry, so the
same code builds whatever the experiment names, in any process. Adding a role means a plan class
(:mod:`system.run.plan`), a builder and the worker module; nothing else. A role defined outside
Troupe registers its builder with :func:`register_builder` in the module that defines its plan.

Longer than 400 lines because every role's builder sits beside the others and beside the
component makers they share (spaces, policies, trainers, environments): read together they show
each role built the same way from the same wiring, which is what serial and process mode rely on.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import gymnasium as gym

from api import environment as env_api
from api import policy as policy_api
from api import registry
from api import trainer as trainer_api
from api.code import load_code
from api.config import ExperimentConfig
from api.env_check import declared_spaces
from api.environment import Environment
from api.errors import ConfigError
from api.experiment_arguments import signature_parameters
from api.policy import Policy
from api.policy_mapping import PolicyMapping, check_policy_mapping, make_policy_mapping
from api.trainer import Trainer
from system import roles, run_folder
from system.errors import ParameterNotFoundError, PeerTimeoutError
from system.parameters.interfaces import ParameterClientBase
from system.parameters.store import ParameterStore
from system.roles import Role
from system.run.plan import (
    ActorPlan,
    ParameterServicePlan,
    PolicyWorkerPlan,
    ReplayPlan,
    TrainerPlan,
    WorkerPlan,
)
from system.streams.inference import InferenceClient, InferenceServer
from system.streams.replay import ReplayClient
from system.streams.samples import SampleConsumer, SampleProducer
from system.workers.actor_hooks import ActorHooks
from system.workers.actor_worker import ActorWorker
from system.workers.base import Worker
from system.workers.batch_source import ReplaySource, SegmentSource
from system.workers.policy_worker import EVAL_TAG, PolicyWorker

if TYPE_CHECKING:
    from system.workers.trainer_group import TrainerGroup

logger = logging.getLogger(__name__)

FIRST_VERSION_TIMEOUT_S = 120.0


# ----------------------------------------------------------------------- components
@dataclass
class AgentSpaces:
    observation: list[gym.Space]
    action: list[gym.Space]

    @property
    def agent_count(self) -> int:
        return len(self.observation)


def env_factory(config: ExperimentConfig, evaluation: bool = False) -> Callable[[int], Environment]:
    """What makes the run's environments; ``evaluation``: as its evaluation actors make them
    (``evaluation.env_args`` over the environment's arguments)."""
    comp = config.environment
    args = {**comp.args, **config.evaluation.env_args} if evaluation else dict(comp.args)

    def make(_index: int) -> Environment:
        return env_api.make(comp.type, **args)

    return make


def probe_spaces(config: ExperimentConfig) -> AgentSpaces:
    """Build one environment to read its agents' spaces, and check the agent-policy mapping."""
    env = env_factory(config)(0)
    try:
        spaces = AgentSpaces(*declared_spaces(env, config.environment.type))
    finally:
        env_api.close_after_probe(env, config.environment.type)
    if config.agent_policies and len(config.agent_policies) != spaces.agent_count:
        raise ConfigError(
            [
                f"agent_policies: lists {len(config.agent_policies)} policies but environment "
                f"'{config.environment.type}' has {spaces.agent_count} agents"
            ]
        )
    if config.policy_mapping.type or config.evaluation.policy_mapping.type:
        _check_mapped_spaces(config, spaces)
    return spaces


def _check_mapped_spaces(config: ExperimentConfig, spaces: AgentSpaces) -> None:
    """A mapped policy may play any agent: one network must fit every agent's spaces, and the
    mapping must name policies for as many agents as the environment has."""
    errors = [
        f"policy_mapping: agent {a}'s spaces ({spaces.observation[a]}, {spaces.action[a]}) "
        f"differ from agent 0's; a policy mapping needs every agent alike (else agent_policies)"
        for a in range(1, spaces.agent_count)
        if (spaces.observation[a], spaces.action[a]) != (spaces.observation[0], spaces.action[0])
    ]
    for path, comp in (
        ("policy_mapping", config.policy_mapping),
        ("evaluation.policy_mapping", config.evaluation.policy_mapping),
    ):
        if comp.type:
            mapping = make_policy_mapping(comp.type, **comp.args)
            problems = check_policy_mapping(mapping, config.policies, spaces.agent_count)
            errors += [f"{path}: {p}" for p in problems]
    if errors:
        raise ConfigError(errors)


def make_policy(config: ExperimentConfig, name: str, spaces: AgentSpaces, seed: int) -> Policy:
    """Build policy ``name`` for the spaces of the first agent it controls. One without a
    trainer (a scripted opponent, ``random-legal``) that takes a ``seed`` is given ``seed``
    unless its arguments set one: it drew from fresh entropy, so ``troupe eval`` of a
    self-play run against it gave another score each time (-0.15, 0.1, -0.1 over 20 games)."""
    import torch  # not at module level: actor processes never need it

    agent = config.agent_of_policy(name)
    torch.manual_seed(seed)
    comp = config.policies[name].policy
    args = dict(comp.args)
    if "seed" not in args and name not in trained_policies(config) and _takes_seed(comp.type):
        args["seed"] = seed
    return policy_api.make(
        comp.type,
        observation_space=spaces.observation[agent],
        action_space=spaces.action[agent],
        **args,
    )


def _takes_seed(policy_type: str) -> bool:
    return "seed" in signature_parameters(registry.policies.spec(policy_type).load())


def make_trainer(config: ExperimentConfig, name: str, policy: Policy) -> Trainer:
    comp = config.policies[name].trainer
    return trainer_api.make(comp.type, policy=policy, **comp.args)


def trained_policies(config: ExperimentConfig) -> list[str]:
    return [name for name, pc in config.policies.items() if pc.trainer.type]


# ----------------------------------------------------------------------- the wiring seam
class Wiring(Protocol):
    """How a worker reaches its peers: sockets found through the controller, or queues.

    One method per end of each stream, never per role: a server or consumer registers the
    endpoint name it is given, a client or producer looks up the names it is given (names come
    from the plan, :mod:`system.run.plan`), so a new role builds from these as it is."""

    run_dir: Path | None
    """The run folder (checkpoints), or None when there is none (serial mode)."""
    waits_for_peers: bool
    """Whether a policy worker waits for its policy's first version before serving: true where
    a trainer elsewhere publishes it; in one process nothing could publish while we waited."""
    threads: bool
    """Whether a worker may run threads besides its loop (a trainer's loader): not serially."""
    spaces: AgentSpaces
    """The agents' spaces, resolved once for the run (:mod:`system.run.shape`)."""

    def keep_alive(self) -> None:
        """Called while a builder waits for a peer: a process answers its controller here."""

    def parameter_client(self, subscribe: list[str]) -> ParameterClientBase: ...
    def parameter_server(self, store: ParameterStore) -> Worker: ...
    def inference_server(self, name: str, policy_name: str) -> InferenceServer:
        """The server of ``policy_name``'s action requests, registered as ``name``; requests
        are laid out as the run's shape says."""

    def inference_client(self, client_id: str, names: dict[str, str]) -> InferenceClient: ...
    def sample_consumer(self, name: str, policy_name: str) -> SampleConsumer:
        """The consumer of ``policy_name``'s segments, registered as ``name``."""

    def sample_producer(self, names: dict[str, list[str]]) -> SampleProducer: ...
    def replay_server(self, name: str, policy_name: str) -> Any:
        """The server of ``policy_name``'s transition batches, registered as ``name``."""

    def replay_client(self, name: str, policy_name: str, client_id: str) -> ReplayClient:
        """A client of the replay server registered as ``name``."""

    def trainer_group(
        self, name: str, policy_name: str, rank: int, size: int
    ) -> TrainerGroup | None:
        """Rank ``rank`` of the policy's data-parallel group of ``size`` trainers, formed
        through the rendezvous registered as ``name`` (blocks until every rank has joined); None
        where the trainer trains alone."""


@dataclass
class Built:
    """A built worker and what it runs with every heartbeat, in order (none from a builder so
    far: process mode adds the peer watches and the coordination followers)."""

    worker: Worker
    heartbeat_hooks: list[Callable[[], None]] = field(default_factory=list)


# ----------------------------------------------------------------------- one builder per role
def build_parameter_service(plan: ParameterServicePlan, cfg: ExperimentConfig, wiring: Wiring):
    # durable: every version reaches the run folder before it is announced, so a restarted
    # service loses none (serial mode has no run folder, and nothing to restart).
    kept = cfg.checkpoint
    store = ParameterStore(wiring.run_dir, keep=3, durable=wiring.run_dir is not None,
                           keep_files=kept.keep_last, keep_every=kept.keep_every)  # fmt: skip
    restored = store.load_from_disk()
    if restored:
        logger.info("parameter service restored versions %s", restored)
    return Built(wiring.parameter_server(store))


def build_trainer(plan: TrainerPlan, cfg: ExperimentConfig, wiring: Wiring) -> Built:
    from system.workers.trainer_group import GroupTrainerWorker  # imports torch: trainers only
    from system.workers.trainer_hooks import TrainerHooks
    from system.workers.trainer_worker import TrainerWorker, segment_source

    policy = make_policy(cfg, plan.policy, wiring.spaces, cfg.seed)
    trainer = make_trainer(cfg, plan.policy, policy)
    peers = plan.peers(cfg)
    params = wiring.parameter_client(subscribe=peers.parameters or [])
    pc = cfg.policies[plan.policy]
    if peers.replay_batches:  # an off-policy trainer learns from its replay worker's batches
        source = ReplaySource(
            wiring.replay_client(peers.replay_batches, plan.policy, plan.worker_id),
            batches_per_message=pc.replay.batches_per_message,
        )
    else:
        endpoint = roles.samples_endpoint(plan.policy, plan.index)
        samples = wiring.sample_consumer(endpoint, plan.policy)
        source = segment_source(
            samples, plan.policy, trainer, pc.batch_segments,
            max_policy_lag=pc.max_policy_lag, warn_policy_lag=pc.warn_policy_lag,
        )  # fmt: skip
    # One of several trainers of its policy is a group member (the group forms once built).
    group_size = pc.trainer_workers
    worker = (GroupTrainerWorker if group_size > 1 else TrainerWorker)(
        plan.worker_id,
        plan.policy,
        trainer,
        source,
        params,
        checkpoint_every=cfg.checkpoint.every if wiring.run_dir else 0,
        checkpoint_every_s=cfg.checkpoint.every_seconds,
        checkpoint_dir=wiring.run_dir / run_folder.CHECKPOINTS if wiring.run_dir else None,
        publish_every=pc.publish_every,
        hooks=TrainerHooks.of(cfg.trainer_callbacks),
        max_steps=cfg.stop.trainer_steps,
    )
    latest = latest_version(params, plan.policy)
    if latest is not None:  # resuming, or restarted after a failure
        worker.restore(latest[1])
        worker.mark_published()
    if isinstance(source, SegmentSource) and group_size == 1 and wiring.threads and pc.load_ahead:
        # a group's ranks agree on each step's batch: they load in turn
        worker.load_ahead()
    if group_size > 1:  # after restoring: every rank starts from rank 0's parameters
        name = roles.trainer_group_endpoint(plan.policy)
        group = wiring.trainer_group(name, plan.policy, plan.index, group_size)
        if group is not None:
            worker.join(group)
    return Built(worker)


def build_replay(plan: ReplayPlan, cfg: ExperimentConfig, wiring: Wiring) -> Built:
    from system.replay.buffer import ReplayBuffer
    from system.workers.replay_worker import ReplayWorker, buffer_config, replay_file

    worker = ReplayWorker(
        plan.worker_id,
        plan.policy,
        ReplayBuffer(buffer_config(cfg, plan.policy)),
        wiring.sample_consumer(roles.replay_samples_endpoint(plan.policy), plan.policy),
        wiring.replay_server(roles.replay_batches_endpoint(plan.policy), plan.policy),
        batch_size=cfg.policies[plan.policy].replay.batch_size,
        batches_per_message=cfg.policies[plan.policy].replay.batches_per_message,
        checkpoint_path=replay_file(wiring.run_dir, plan.policy) if wiring.run_dir else None,
        save_every_s=cfg.policies[plan.policy].replay.save_every_s,
    )
    return Built(worker)


def build_policy_worker(plan: PolicyWorkerPlan, cfg: ExperimentConfig, wiring: Wiring) -> Built:
    policy = make_policy(cfg, plan.policy, wiring.spaces, plan.seed(cfg))
    if cfg.policies[plan.policy].checkpoint:  # a frozen policy from another run's file
        policy.load_checkpoint(read_frozen_checkpoint(cfg.policies[plan.policy].checkpoint))
    params = wiring.parameter_client(subscribe=plan.peers(cfg).parameters or [])
    name = roles.inference_endpoint(plan.policy, plan.index)
    if plan.policy == cfg.selfplay.opponent:
        from system.workers.opponent_pool import OpponentPolicyWorker

        server = wiring.inference_server(name, plan.policy)
        seed = cfg.seed * 7_919 + plan.index
        opponent = OpponentPolicyWorker(plan.worker_id, plan.policy, policy, server, params,
                                        cfg.selfplay, index=plan.index, seed=seed)  # fmt: skip
        # Its past snapshots (a restart, a resumed run), then the learner's newest: it plays a
        # version of the learner from its first answer, never its own untrained weights.
        opponent.restore_pool()
        if wiring.waits_for_peers:
            opponent.offer(*_wait_first_version(params, cfg.selfplay.learner, wiring.keep_alive))
        return Built(opponent)
    if cfg.policies[plan.policy].trainer.type and wiring.waits_for_peers:
        _, checkpoint = _wait_first_version(params, plan.policy, wiring.keep_alive)
        policy.load_checkpoint(checkpoint)
    server = wiring.inference_server(name, plan.policy)
    # a second copy of the policy, built when a version is held for evaluation
    copy = functools.partial(make_policy, cfg, plan.policy, wiring.spaces, plan.seed(cfg))
    tag = EVAL_TAG if plan.index == 0 else f"{EVAL_TAG}-{plan.index}"
    worker = PolicyWorker(plan.worker_id, plan.policy, policy, server, params, make_copy=copy,
                          eval_tag=tag)  # fmt: skip
    return Built(worker)


def read_frozen_checkpoint(path: str) -> Any:
    from system.parameters.checkpoint_file import load_checkpoint_file

    try:
        return load_checkpoint_file(path)["params"]
    except (OSError, ValueError) as e:
        raise ConfigError([f"checkpoint {path}: {e}"]) from e


def actor_mapping(plan: ActorPlan, cfg: ExperimentConfig) -> PolicyMapping | None:
    """The policy mapping this actor asks at every reset (None: fixed seats)."""
    comp = cfg.policy_mapping
    if plan.evaluation and cfg.evaluation.policy_mapping.type:
        comp = cfg.evaluation.policy_mapping
    if plan.member or not comp.type:
        return None
    return make_policy_mapping(comp.type, **comp.args)


def build_actor(plan: ActorPlan, cfg: ExperimentConfig, wiring: Wiring) -> Built:
    peers = plan.peers(cfg)
    inference = wiring.inference_client(plan.worker_id, peers.inference)
    samples = None if plan.evaluation else wiring.sample_producer(peers.samples)
    group = cfg.evaluation if plan.evaluation else cfg.actors
    worker = ActorWorker(
        plan.worker_id,
        env_factory(cfg, plan.evaluation),
        group.envs_per_worker,
        (lambda _agent: plan.member) if plan.member else cfg.policy_of_agent,
        inference,
        samples,
        segment_length=cfg.actors.segment_length,
        is_evaluation=plan.evaluation,
        seed=plan.seed(cfg),
        on_env_error=cfg.actors.on_env_error,
        on_nonfinite=cfg.actors.on_nonfinite,
        env_name=cfg.environment.type,
        validate_actions=plan.validate_actions,
        # Evaluation is not in a hurry: one request a step for all its environments is cheaper.
        groups=1 if plan.evaluation else cfg.actors.groups,
        max_fps=cfg.evaluation.max_fps if plan.evaluation else None,
        policy_mapping=actor_mapping(plan, cfg),
        mapped_policies=list(plan.policies(cfg)),
        trained_policies=[p for p in plan.policies(cfg) if cfg.policies[p].trainer.type],
        hooks=ActorHooks.of(plan.worker_id, plan.evaluation, cfg.actor_callbacks),
        make_threads=cfg.actors.make_threads,
    )
    return Built(worker)


Builder = Callable[[Any, ExperimentConfig, "Wiring"], Built]

BUILDERS: dict[str, Builder] = {
    Role.PARAMETER_SERVICE.value: build_parameter_service,
    Role.TRAINER.value: build_trainer,
    Role.POLICY.value: build_policy_worker,
    Role.ACTOR.value: build_actor,
    Role.REPLAY.value: build_replay,
}
"""Each role's builder by role name."""


def register_builder(role: str, builder: Builder) -> None:
    """Make ``builder`` build the workers of ``role``, a role defined outside Troupe (its plan
    class is a :class:`~system.run.plan.WorkerPlan` subclass with that ``role``)."""
    if role in {r.value for r in Role}:
        raise ValueError(f"role '{role}' is one of Troupe's own; give yours another name")
    BUILDERS[role] = builder


def build(plan: WorkerPlan, cfg: ExperimentConfig, wiring: Wiring) -> Built:
    """Build the worker ``plan`` describes, after loading the run's user code (the modules and
    registrations of the process that launched the run)."""
    load_code(cfg.code)
    builder = BUILDERS.get(str(plan.role))
    if builder is None:
        raise ConfigError([
            f"role '{plan.role}' has a plan but no builder: the module that defines it calls "
            "system.run.builders.register_builder"
        ])  # fmt: skip
    return builder(plan, cfg, wiring)


# ----------------------------------------------------------------------- helpers
def latest_version(params: ParameterClientBase, name: str) -> tuple[int, Any] | None:
    try:
        return params.get(name)
    except ParameterNotFoundError:
        return None


def _wait_first_version(
    params: ParameterClientBase, name: str, keep_alive: Callable[[], None]
) -> tuple[int, Any]:
    deadline = time.monotonic() + FIRST_VERSION_TIMEOUT_S
    while True:
        keep_alive()
        latest = latest_version(params, name)
        if latest is not None:
            return latest
        if time.monotonic() > deadline:
            raise PeerTimeoutError(
                f"no parameters of policy '{name}' were published in "
                f"{FIRST_VERSION_TIMEOUT_S:.0f}s; is its trainer running?"
            )
        time.sleep(0.1)
