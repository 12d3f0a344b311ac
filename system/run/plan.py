"""A run's worker plan: which workers exist, what each one is, and the endpoint names they use.

Everything that starts or supervises workers reads the same typed plan: the controller (to start,
configure and restart them), serial mode (to build them in one process), and the launchers and
deployments (to turn them into processes, containers, services or job steps). A plan travels to
its worker inside the ``configure`` message as a plain mapping (:meth:`WorkerPlan.to_wire`) and
is rebuilt there with :func:`plan_from_wire`, so no role reads untyped arguments.

Endpoint names are made in :mod:`system.roles`: a worker registers the names its plan's
:meth:`~WorkerPlan.endpoints` says it owns and looks up those its :meth:`~WorkerPlan.peers`
gives; the controller forgets exactly the owned names when a worker restarts.

What the runtime decides per role is said on each plan class (whether serial mode builds and
polls it, whether its process imports torch, which peers it follows, what a cluster mounts on
it), so that no runtime names a role: a new role is its plan class, its builder
(:mod:`system.run.builders`) and its worker module.

Roles are open: a :class:`WorkerPlan` subclass with a ``role`` of its own is registered by
defining it (:data:`PLAN_TYPES`) and plans its workers (:meth:`WorkerPlan.plans_for`, from the
``roles`` key). The module that defines it (and its builder,
:func:`system.run.builders.register_builder`) goes in ``code.imports``, for every process.

Longer than 400 lines because it holds one plan class per role beside the base that says what
the runtime asks of each: split by role, one question (stop order, serial polling, torch) would
be answered across eight files.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from api.config import ExperimentConfig, rate_limited_replay, uses_replay
from api.errors import ConfigError
from system.roles import (
    PARAMS_PUSH,
    PARAMS_REQUEST,
    Role,
    inference_endpoint,
    replay_batches_endpoint,
    replay_samples_endpoint,
    samples_endpoint,
    trainer_group_endpoint,
)

FolderUse = Literal["", "read", "write"]
PLAN_TYPES: dict[str, type[WorkerPlan]] = {}
"""Every role's plan class by role name: Troupe's own, and those of modules that define one."""


ROLE_NAME = re.compile(r"[a-z]([-a-z0-9]{0,22}[a-z0-9])?")
"""A role defined outside Troupe names cluster objects (a Kubernetes Job ``<run>-<role>``, a
Swarm service): lower-case letters, digits and '-', at most 24 characters."""


def _register_plan_type(cls: type[WorkerPlan]) -> None:
    role = str(cls.role)
    if not isinstance(cls.role, Role) and not ROLE_NAME.fullmatch(role):
        raise ValueError(
            f"role '{role}' of {cls.__qualname__}: a role names cluster objects; use lower-case "
            "letters, digits and '-' (at most 24 characters, a letter first)"
        )
    known = PLAN_TYPES.get(role)
    if known is not None and (known.__module__, known.__qualname__) != (
        cls.__module__, cls.__qualname__,
    ):  # fmt: skip
        raise ValueError(
            f"role '{role}' is already defined by {known.__module__}.{known.__qualname__}"
        )
    PLAN_TYPES[role] = cls


# ------------------------------------------------------------------------------ the plans
@dataclass(frozen=True)
class Peers:
    """The names a worker looks up: its builder connects to them, and in process mode a watch
    follows each to its new address when the controller restarts the peer behind it."""

    parameters: list[str] | None = None
    """Policies its parameter client subscribes to ([]: it only publishes; None: no client)."""
    replay_batches: str = ""
    """The replay worker it takes transition batches from (empty: none)."""
    inference: dict[str, str] = field(default_factory=dict)
    """Per policy, the policy worker it asks for actions."""
    samples: dict[str, list[str]] = field(default_factory=dict)
    """Per policy, the trainers (or the replay worker) it sends its segments to."""


@dataclass(frozen=True)
class SerialOptions:
    """What a serial run is asked to do (each plan's :meth:`WorkerPlan.in_serial` reads it)."""

    train: bool = True
    """Train: build the trainers and what feeds them (False: evaluate stored parameters)."""
    evaluation: bool = False
    """Build the evaluation actors."""
    validate_actions: bool = False
    """Actors check every action against the action space (``test_pipeline``)."""


@dataclass(frozen=True)
class WorkerPlan:
    """One worker of a run. Subclasses add what their role needs to be built, and say the few
    things the runtime decides per role (the class attributes below), so that serial mode and
    worker processes treat every role alike."""

    worker_id: str
    role: ClassVar[str]
    """Troupe's own roles are :class:`~system.roles.Role` members; any other name is a role
    defined outside Troupe (registered in :data:`PLAN_TYPES` when its class is defined)."""
    stop_order: ClassVar[int]
    """Workers stop in increasing order: actors 0, policy workers and trainers 1, parameters 2;
    so every sample in flight is trained on and the last checkpoint still reaches the service."""
    poll_order: ClassVar[int]
    """Serial mode polls its workers in increasing order, once each per round: actors first
    (their requests and segments go out), then what answers or consumes them, trainers last."""
    needs_torch: ClassVar[bool]
    """Whether the role runs a network: its process imports torch (and sets its threads,
    :meth:`torch_threads`) before building; actor and parameter-service processes stay small
    without it."""
    restartable: ClassVar[bool] = True
    """Whether the controller restarts this worker when it dies."""
    run_folder: ClassVar[FolderUse] = ""
    """Whom a cluster mounts the run folder on: ``write`` (with per-pod storage, a claim of its
    own), ``read`` (only where the folder is shared), or nothing."""
    holds_run_state: ClassVar[bool] = False
    """Losing it stops or sets back the run: a cluster shields it from voluntary eviction."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "role" in cls.__dict__:
            _register_plan_type(cls)

    @classmethod
    def plans_for(cls, config: ExperimentConfig) -> list[WorkerPlan]:
        """The workers of a role defined outside Troupe in ``config`` (its arguments are
        ``config.roles[role]``); :func:`plan_workers` plans Troupe's own."""
        return []

    def endpoints(self) -> list[str]:
        """The endpoint names this worker registers (and that go stale when it restarts)."""
        return []

    def peers(self, config: ExperimentConfig) -> Peers:
        """The names this worker looks up (none by default)."""
        return Peers()

    def torch_threads(self, config: ExperimentConfig) -> int:
        """Torch's threads: one (small batches gain nothing from more, and the cores are the
        actors')."""
        return 1

    def catches_up(self, config: ExperimentConfig) -> bool:
        """Serial mode polls it again within a round while its trainer still trains: true
        between a rate-limited replay buffer and its trainer, where the limiter, not the pace of
        polling, sets how many steps a frame buys (:meth:`system.run.serial.SerialRun.poll`)."""
        return False

    def in_serial(self, options: SerialOptions) -> WorkerPlan | None:
        """This worker as serial mode builds it (by default, when it trains), or None."""
        return self if options.train else None

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ParameterServicePlan(WorkerPlan):
    role: ClassVar[Role] = Role.PARAMETER_SERVICE
    stop_order: ClassVar[int] = 2
    poll_order: ClassVar[int] = 0  # never polled serially: see in_serial
    needs_torch: ClassVar[bool] = False
    restartable: ClassVar[bool] = True
    """It restarts from the newest version on disk; its peers are told its new address."""
    run_folder: ClassVar[FolderUse] = "write"
    holds_run_state: ClassVar[bool] = True

    def endpoints(self) -> list[str]:
        return [PARAMS_REQUEST, PARAMS_PUSH]

    def in_serial(self, options: SerialOptions) -> None:
        """Serial mode has no parameter-service worker: its store is in the serial process."""
        return None


@dataclass(frozen=True)
class TrainerPlan(WorkerPlan):
    role: ClassVar[Role] = Role.TRAINER
    stop_order: ClassVar[int] = 1
    poll_order: ClassVar[int] = 3
    needs_torch: ClassVar[bool] = True
    run_folder: ClassVar[FolderUse] = "read"  # an older run's trainer.pt, on resume
    holds_run_state: ClassVar[bool] = True
    policy: str = ""
    """The policy this trainer trains."""
    index: int = 0
    """Its place in the policy's data-parallel group (0 .. trainer_workers - 1): its rank."""

    def torch_threads(self, config: ExperimentConfig) -> int:
        return config.policies[self.policy].trainer_threads

    def endpoints(self) -> list[str]:
        """Its sample consumer; rank 0 also owns the group's rendezvous name, so that when it
        restarts the controller forgets the old store and joining ranks wait for the new one."""
        names = [samples_endpoint(self.policy, self.index)]
        if self.index == 0:
            names.append(trainer_group_endpoint(self.policy))
        return names

    def peers(self, config: ExperimentConfig) -> Peers:
        """The parameter service it publishes to, and its replay worker if it learns from one."""
        replay = uses_replay(config.policies[self.policy])
        return Peers(
            parameters=[], replay_batches=replay_batches_endpoint(self.policy) if replay else ""
        )

    def catches_up(self, config: ExperimentConfig) -> bool:
        return rate_limited_replay(config.policies[self.policy])

    def in_serial(self, options: SerialOptions) -> TrainerPlan | None:
        """Rank 0 only: serially, the in-process queue is the policy's whole sample stream, so
        one trainer trains alone (:func:`system.run.serial.serial_plans`)."""
        return self if options.train and self.index == 0 else None


@dataclass(frozen=True)
class ReplayPlan(WorkerPlan):
    """The replay buffer of an off-policy policy: actors' segments in, transition batches out
    to the policy's trainer, priorities back."""

    role: ClassVar[Role] = Role.REPLAY
    stop_order: ClassVar[int] = 1
    poll_order: ClassVar[int] = 2
    needs_torch: ClassVar[bool] = True
    """It builds its policy, for the layout of the segments the actors send."""
    restartable: ClassVar[bool] = True
    """A restarted replay worker starts from the buffer saved at the last stop (a resumed run) or
    empty, and refills from the actors before it serves again (``replay.min_size``); its trainer
    and actors follow it to its new address (``moved``)."""
    run_folder: ClassVar[FolderUse] = "write"  # its buffer, saved at a stop
    holds_run_state: ClassVar[bool] = True  # evicted, it comes back empty and refills
    policy: str = ""
    """The policy whose samples this buffer holds."""

    def endpoints(self) -> list[str]:
        return [replay_samples_endpoint(self.policy), replay_batches_endpoint(self.policy)]

    def catches_up(self, config: ExperimentConfig) -> bool:
        return rate_limited_replay(config.policies[self.policy])


@dataclass(frozen=True)
class PolicyWorkerPlan(WorkerPlan):
    role: ClassVar[Role] = Role.POLICY
    stop_order: ClassVar[int] = 1
    poll_order: ClassVar[int] = 1
    needs_torch: ClassVar[bool] = True
    policy: str = ""
    """The policy this worker serves."""
    index: int = 0
    """Which of the policy's policy workers (0 .. policy_workers - 1)."""

    def endpoints(self) -> list[str]:
        return [inference_endpoint(self.policy, self.index)]

    def weights_source(self, config: ExperimentConfig) -> str:
        """Whose published versions it loads: its own policy's, or the learner's for a
        self-play opponent."""
        selfplay = config.selfplay
        return selfplay.learner if self.policy == selfplay.opponent else self.policy

    def peers(self, config: ExperimentConfig) -> Peers:
        """The parameter service, subscribed to the versions it loads."""
        return Peers(parameters=[self.weights_source(config)])

    def seed(self, config: ExperimentConfig) -> int:
        """Distinct for every policy worker of a policy: each draws its actions from its own
        stream. All drew from ``seed + 1``, so two workers answering alike batches drew the
        same noise. The first keeps ``seed + 1``: a run with one replays as before."""
        return config.seed + 1 + self.index * 1_009

    def in_serial(self, options: SerialOptions) -> PolicyWorkerPlan | None:
        """The first only: serially, one in-process queue carries all of a policy's requests."""
        return self if self.index == 0 else None


@dataclass(frozen=True)
class ActorPlan(WorkerPlan):
    role: ClassVar[Role] = Role.ACTOR
    stop_order: ClassVar[int] = 0
    poll_order: ClassVar[int] = 0
    needs_torch: ClassVar[bool] = False
    index: int = 0
    """Its number within its group (training actors, or evaluation actors)."""
    evaluation: bool = False
    """Evaluation actors act greedily, send no samples and report evaluation episodes."""
    validate_actions: bool = False
    """Check every action against the action space (``test_pipeline``; costs CPU)."""
    member: str = ""
    """A PBT member's own actor: this policy plays every agent (empty: ``agent_policies``)."""

    def in_serial(self, options: SerialOptions) -> ActorPlan | None:
        """Training actors when serial mode trains, evaluation actors when it evaluates."""
        if not (options.evaluation if self.evaluation else options.train):
            return None
        return dataclasses.replace(self, validate_actions=options.validate_actions)

    def peers(self, config: ExperimentConfig) -> Peers:
        return Peers(
            inference=self.inference_endpoints(config), samples=self.sample_endpoints(config)
        )

    def policies(self, config: ExperimentConfig) -> dict[str, Any]:
        """The policies this actor asks for actions and sends samples to."""
        if self.member:
            return {self.member: config.policies[self.member]}
        return dict(config.policies)

    def seed(self, config: ExperimentConfig) -> int:
        """Distinct for every actor of a run, training and evaluation alike."""
        return config.seed * 100_003 + (self.index + (1000 if self.evaluation else 0)) * 1_009

    def inference_endpoints(self, config: ExperimentConfig) -> dict[str, str]:
        """The policy worker each policy's requests go to: actors spread over them by index."""
        return {
            name: inference_endpoint(name, self._index_in_member(config) % pc.policy_workers)
            for name, pc in self.policies(config).items()
        }

    def _index_in_member(self, config: ExperimentConfig) -> int:
        """Its number among the actors of its PBT member (its number in the group otherwise)."""
        return self.index // len(config.pbt.members) if self.member else self.index

    def sample_endpoints(self, config: ExperimentConfig) -> dict[str, list[str]]:
        """Every trainer of every trained policy, or its replay worker when the trainer learns
        from replay (none for evaluation actors)."""
        if self.evaluation:
            return {}
        return {
            name: (
                [replay_samples_endpoint(name)]
                if uses_replay(pc)
                else [samples_endpoint(name, i) for i in range(pc.trainer_workers)]
            )
            for name, pc in self.policies(config).items()
            if pc.trainer.type
        }


def plan_type(role: str) -> type[WorkerPlan]:
    """The plan class of ``role``; a clear error for a role no imported module defines."""
    cls = PLAN_TYPES.get(str(role))
    if cls is None:
        raise ConfigError([
            f"role '{role}': no worker plan defines it (roles: {', '.join(PLAN_TYPES)}); a "
            "role of your own is defined by a module in code.imports (--import FILE)"
        ])  # fmt: skip
    return cls


def plan_from_wire(role: str, fields: Any) -> WorkerPlan:
    """The typed plan of a ``configure`` message; a clear error if it does not fit the role."""
    cls = plan_type(role)
    if not isinstance(fields, dict):
        raise ConfigError([f"plan of a {role} worker: expected a mapping, got {fields!r}"])
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise ConfigError([f"plan of a {role} worker: unknown fields {unknown}"])
    return cls(**fields)


def plan_workers(config: ExperimentConfig) -> list[WorkerPlan]:
    """Every worker of ``config``, in start order: parameters, replay buffers, trainers, policy
    workers, the workers of roles defined outside Troupe (``config.roles``), actors."""
    plans: list[WorkerPlan] = [ParameterServicePlan("params")]
    for name, pc in config.policies.items():
        if pc.trainer.type and uses_replay(pc):
            plans.append(ReplayPlan(f"replay/{name}", policy=name))
        if pc.trainer.type:
            plans += [
                TrainerPlan(f"trainer/{name}/{i}", policy=name, index=i)
                for i in range(pc.trainer_workers)
            ]
        plans += [
            PolicyWorkerPlan(f"policy/{name}/{i}", policy=name, index=i)
            for i in range(pc.policy_workers)
        ]
    plans += _other_roles(config)
    members = config.pbt.members
    plans += [
        ActorPlan(f"actor/{i}", index=i, member=members[i % len(members)] if members else "")
        for i in range(config.actors.workers)
    ]
    plans += [
        ActorPlan(
            f"eval/{i}",
            index=i,
            evaluation=True,
            member=members[i % len(members)] if members else "",
        )
        for i in range(config.evaluation.workers)
    ]
    return plans


def _other_roles(config: ExperimentConfig) -> list[WorkerPlan]:
    """The workers of the roles ``config.roles`` names, each planned by its own class."""
    own = {str(role) for role in Role}
    unknown = sorted(set(config.roles) - set(PLAN_TYPES))
    if unknown or own & set(config.roles):
        raise ConfigError([
            f"roles: {', '.join(unknown or sorted(own & set(config.roles)))} is not a role "
            f"defined outside Troupe ({', '.join(sorted(set(PLAN_TYPES) - own)) or 'none is'} "
            "imported); a module in code.imports defines one"
        ])  # fmt: skip
    plans: list[WorkerPlan] = []
    for role in config.roles:
        plans += PLAN_TYPES[role].plans_for(config)
    return plans
