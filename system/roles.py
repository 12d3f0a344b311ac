"""The ground floor of ``system/``: the roles a run's workers play, the states the controller
sees them in, and the names of the endpoints they register.

Everything above reads these (the workers, the streams' users, the controller, the launchers and
deployments); this module imports nothing of Troupe's, so no floor has to reach up for them.
Endpoint names are made here and only here: the plans (:mod:`system.run.plan`) say which a worker
owns and which it looks up, and the controller forgets exactly the owned ones on a restart.
"""

from __future__ import annotations

import enum


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
    KILLED = "killed"
    """Killed when a second signal ended the run's stop at once (``troupe stop --now``)."""

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
