"""A run's worker plan: which workers exist, what each one is, and the endpoint names they use.

Everything that starts or supervises workers reads the same typed plan: the controller (to start,
configure and restart them), serial mode (to build them in one process), and the launchers and
deployments (to turn them into processes, containers, services or job steps). A plan travels to
its worker inside the ``configure`` message as a plain mapping (:meth:`WorkerPlan.to_wire`) and
is rebuilt there with :func:`plan_from_wire`, so no role reads untyped arguments.

Endpoint names (``inference/<policy>/<i>``, ...) are made here and only here: a worker registers
the names its plan :meth:`~WorkerPlan.endpoints` says it owns, peers look up names made by the
same functions, and the controller forgets exactly those names when a worker restarts.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, ClassVar

from api.config import ExperimentConfig, uses_replay
from api.errors import ConfigError


class Role(str, enum.Enum):
    """A worker's role; the value is what command lines and ``workers.json`` show."""

    PARAMETER_SERVICE = "parameter_service"
    TRAINER = "trainer"
    POLICY = "policy"
    ACTOR = "actor"
    REPLAY = "replay"

    def __str__(self) -> str:
        return self.value


class WorkerState(str, enum.Enum):
    """Where a worker is in its life, as the controller sees it."""

    STARTING = "starting"
    """Started (or expected from a scheduler); no message yet."""
    CONFIGURING = "configuring"
    """Said hello and got its configuration; building its components."""
    ALIVE = "alive"
    """Built and polling; heartbeats arrive."""
    RESTARTING = "restarting"
    """Restarted by the controller; its hello is expected."""
    STOPPED = "stopped"
    """Left after a stop request (said bye)."""
    FAILED = "failed"
    """Reported an error, or exited or went silent without one."""

    def __str__(self) -> str:
        return self.value

    @property
    def running(self) -> bool:
        """Whether a stop request should be sent to (and waited for from) this worker."""
        return self in (WorkerState.ALIVE, WorkerState.CONFIGURING)


# ------------------------------------------------------------------------- endpoint names
PARAMS_REQUEST = "params/request"
PARAMS_PUSH = "params/push"


def inference_endpoint(policy: str, index: int) -> str:
    """The name policy worker ``index`` of ``policy`` registers its inference server under."""
    return f"inference/{policy}/{index}"


def samples_endpoint(policy: str, index: int) -> str:
    """The name trainer ``index`` of ``policy`` registers its sample consumer under."""
    return f"samples/{policy}/{index}"


def trainer_group_endpoint(policy: str) -> str:
    """The name rank 0 of ``policy``'s data-parallel trainer group registers its rendezvous
    store under (``tcp://host:port``); the other ranks look it up to join the group."""
    return f"trainer_group/{policy}"


def replay_samples_endpoint(policy: str) -> str:
    """The name the replay worker of ``policy`` registers its sample consumer under."""
    return f"replay/{policy}/samples"


def replay_batches_endpoint(policy: str) -> str:
    """The name the replay worker of ``policy`` serves sampled transition batches under."""
    return f"replay/{policy}/batches"


# ------------------------------------------------------------------------------ the plans
@dataclass(frozen=True)
class WorkerPlan:
    """One worker of a run. Subclasses add what their role needs to be built."""

    worker_id: str
    role: ClassVar[Role]
    stop_order: ClassVar[int]
    """Workers stop in increasing order: actors 0, policy workers and trainers 1, parameters 2;
    so every sample in flight is trained on and the last checkpoint still reaches the service."""
    restartable: ClassVar[bool] = True
    """Whether the controller restarts this worker when it dies."""

    def endpoints(self) -> list[str]:
        """The endpoint names this worker registers (and that go stale when it restarts)."""
        return []

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ParameterServicePlan(WorkerPlan):
    role: ClassVar[Role] = Role.PARAMETER_SERVICE
    stop_order: ClassVar[int] = 2
    restartable: ClassVar[bool] = True
    """Every version is on disk before it is announced (``latest.ckpt``), so a restarted
    service starts from the newest one; its peers are told its new address (``moved``)."""

    def endpoints(self) -> list[str]:
        return [PARAMS_REQUEST, PARAMS_PUSH]


@dataclass(frozen=True)
class TrainerPlan(WorkerPlan):
    role: ClassVar[Role] = Role.TRAINER
    stop_order: ClassVar[int] = 1
    policy: str = ""
    """The policy this trainer trains."""
    index: int = 0
    """Its place in the policy's data-parallel group (0 .. trainer_workers - 1): its rank."""

    def endpoints(self) -> list[str]:
        """Its sample consumer; rank 0 also owns the group's rendezvous name, so that when it
        restarts the controller forgets the old store and joining ranks wait for the new one."""
        names = [samples_endpoint(self.policy, self.index)]
        if self.index == 0:
            names.append(trainer_group_endpoint(self.policy))
        return names


@dataclass(frozen=True)
class ReplayPlan(WorkerPlan):
    """The replay buffer of an off-policy policy: actors' segments in, transition batches out
    to the policy's trainer, priorities back."""

    role: ClassVar[Role] = Role.REPLAY
    stop_order: ClassVar[int] = 1
    restartable: ClassVar[bool] = True
    """A restarted replay worker starts from the buffer saved at the last stop (a resumed run) or
    empty, and refills from the actors before it serves again (``replay.min_size``); its trainer
    and actors follow it to its new address (``moved``)."""
    policy: str = ""
    """The policy whose samples this buffer holds."""

    def endpoints(self) -> list[str]:
        return [replay_samples_endpoint(self.policy), replay_batches_endpoint(self.policy)]


@dataclass(frozen=True)
class PolicyWorkerPlan(WorkerPlan):
    role: ClassVar[Role] = Role.POLICY
    stop_order: ClassVar[int] = 1
    policy: str = ""
    """The policy this worker serves."""
    index: int = 0
    """Which of the policy's policy workers (0 .. policy_workers - 1)."""

    def endpoints(self) -> list[str]:
        return [inference_endpoint(self.policy, self.index)]


@dataclass(frozen=True)
class ActorPlan(WorkerPlan):
    role: ClassVar[Role] = Role.ACTOR
    stop_order: ClassVar[int] = 0
    index: int = 0
    """Its number within its group (training actors, or evaluation actors)."""
    evaluation: bool = False
    """Evaluation actors act greedily, send no samples and report evaluation episodes."""
    validate_actions: bool = False
    """Check every action against the action space (``test_pipeline``; costs CPU)."""
    member: str = ""
    """A PBT member's own actor: this policy plays every agent (empty: ``agent_policies``)."""

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


PLAN_TYPES: dict[Role, type[WorkerPlan]] = {
    Role.PARAMETER_SERVICE: ParameterServicePlan,
    Role.TRAINER: TrainerPlan,
    Role.POLICY: PolicyWorkerPlan,
    Role.ACTOR: ActorPlan,
    Role.REPLAY: ReplayPlan,
}


def plan_from_wire(role: Role | str, fields: Any) -> WorkerPlan:
    """The typed plan of a ``configure`` message; a clear error if it does not fit the role."""
    cls = PLAN_TYPES[Role(role)]
    if not isinstance(fields, dict):
        raise ConfigError([f"plan of a {role} worker: expected a mapping, got {fields!r}"])
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise ConfigError([f"plan of a {role} worker: unknown fields {unknown}"])
    return cls(**fields)


def plan_workers(config: ExperimentConfig) -> list[WorkerPlan]:
    """Every worker of ``config``, in start order: parameters, replay buffers, trainers, policy
    workers, actors."""
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
