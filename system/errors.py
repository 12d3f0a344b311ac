"""Errors the runtime raises: operational conditions (malformed messages, silent peers, dead
workers, lost versions) and the user errors only a running worker can find (a broken environment
at run time, a policy name that cannot be a file name).

They belong to the two families of :mod:`api.errors`: catch ``api.errors.OperationalError`` or
``api.errors.UserError`` to handle every one of them.
"""

from __future__ import annotations

import re

from api.errors import OperationalError, UserError


# ------------------------------------------------------------------------ operational
class WireError(OperationalError):
    """A message on a socket could not be decoded: malformed, truncated or foreign."""


class SharedMemoryRefused(WireError):
    """The parameter service could not take a version from the shared-memory file named (none
    offered, a file it cannot map or read): the publisher may send the version over the
    socket instead. Any other refusal of a publish is about the version itself and is said."""


class PeerTimeoutError(OperationalError):
    """A peer did not answer within the time allowed."""


class ControllerGoneError(PeerTimeoutError):
    """The controller stopped answering heartbeats: it was killed or its host was lost."""


class WorkerFailure(OperationalError):
    """A worker raised an exception; ``remote_traceback`` holds the worker's traceback text.
    ``worker`` "controller": the controller ended the run itself (a stall, a user callback that
    raised, its own write refused), and the message says why alone: "worker controller failed"
    named a worker no run has."""

    def __init__(self, worker: str, message: str, remote_traceback: str = ""):
        self.worker = worker
        self.remote_traceback = remote_traceback
        super().__init__(
            message if worker == "controller" else f"worker {worker} failed: {message}"
        )


class VersionError(OperationalError):
    """A version was published out of order (not newer than the latest) or is not an int >= 0."""


class ParameterNotFoundError(OperationalError):
    """The policy, version or tag asked for is not in the store (nor on its disk)."""


class NonFiniteLossError(OperationalError):
    """A trainer step reported a NaN or infinite statistic; the parameters are not published."""


class TrainerGroupError(OperationalError):
    """A rank of a data-parallel trainer group could not join it, or lost a peer."""


# ------------------------------------------------------------------------ user
class PolicyNameError(UserError):
    """A policy name cannot name a checkpoint folder and a topic (letters, digits, _ . -)."""


class EnvironmentFailure(UserError):
    """An environment raised; the message names the environment slot and the method."""


class CallbackError(UserError):
    """A user callback raised; the controller ends the run with this message."""


class TrainerContractError(UserError):
    """A trainer broke the trainer contract (a stat that is no number, a step that left the
    policy's version where it was): every restart would break it the same way."""


def alike(a: str | None, b: str | None) -> bool:
    """Two error messages that differ only in their numbers (``environment 5 of actor/0`` and
    ``environment 2 of actor/1``) or in which actor met them (``of eval/0``): the supervisor
    shows such an error in full once. Compared as they were, it was shown again for nearly
    every restart of each actor, and an evaluation actor's once more."""
    return a is not None and b is not None and _gist(a) == _gist(b)


def _gist(message: str) -> str:
    return re.sub(r"\d+", "#", re.sub(r"\b(?:actor|eval)/\d+", "#", message))
