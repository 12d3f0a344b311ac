"""The policy contract: agents decide through ``rollout``, trainers improve through ``analyze``.

A policy worker gathers the requests of many agents in many environments into one
:class:`RolloutRequest` (every field batched along the first dimension), calls ``rollout`` once and
sends each agent its row of the :class:`RolloutResult`. Actors then assemble per-agent trajectories
into :class:`SampleBatch` segments (time first: ``[T, B, ...]``) for the trainer, whose ``step``
asks the policy to ``analyze`` them.

Memory (an RNN's hidden state) is the ``policy_state``: a NamedArray whose leaves have a leading
batch dimension of 1 in ``default_policy_state`` (the state of an agent that has just spawned),
or ``None`` for a memoryless policy. The policy worker concatenates the states of many agents
along that first axis; the policy resets the rows whose ``on_reset`` is set.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import numpy as np

from api.namedarray import NamedArray, namedarray
from api.registry import Spec, make_spec, policies


@namedarray
class RolloutRequest:
    """A batch of agents asking for actions. Every field is batched along axis 0."""

    obs: Any
    """Observations: an array ``[B, ...]`` or a NamedArray of them (dict observation spaces)."""
    policy_state: NamedArray | None = None
    """Each agent's memory before this observation, or None for memoryless policies."""
    is_evaluation: np.ndarray | None = None
    """``[B, 1]`` bool: act deterministically (greedy) for these rows."""
    on_reset: np.ndarray | None = None
    """``[B, 1]`` bool: this observation starts an episode; reset the memory of these rows."""
    client_id: np.ndarray | None = None
    """``[B, 1]`` int: who asked (the actor's agent slot); echoed back in the result."""
    request_id: np.ndarray | None = None
    """``[B, 1]`` int: the request's sequence number at that client; echoed back."""


@namedarray
class RolloutResult:
    """A batch of answers, row for row the request's."""

    action: Any
    """Actions ``[B, ...]`` in the agents' action space."""
    policy_state: NamedArray | None = None
    """Each agent's memory after this observation (send it back with the next request)."""
    policy_output: NamedArray | None = None
    """Algorithm-specific values kept for training, e.g. ``log_prob`` and ``value``."""
    client_id: np.ndarray | None = None
    request_id: np.ndarray | None = None


@namedarray
class SampleBatch:
    """Trajectory segments, time first: every field is ``[T, B, ...]``.

    Step ``t`` holds the observation ``obs[t]``, the reward that led to it, whether it ends the
    episode (``done``: terminal, ``truncated``: cut short), the memory before it, and the action
    and policy outputs chosen at it. Segments overlap by one step: the last step of a segment is the
    first of the next, so its value bootstraps the return; its action is not trained on. An action
    at a step that is done or truncated is not trained on either (the episode is over there).
    """

    obs: Any
    action: Any = None
    policy_output: NamedArray | None = None
    policy_state: NamedArray | None = None
    reward: np.ndarray | None = None
    """``[T, B, 1]`` float32: the reward received on arriving at ``obs[t]``."""
    done: np.ndarray | None = None
    """``[T, B, 1]`` bool: ``obs[t]`` is terminal."""
    truncated: np.ndarray | None = None
    """``[T, B, 1]`` bool: the episode was cut short at ``obs[t]``."""
    on_reset: np.ndarray | None = None
    """``[T, B, 1]`` bool: ``obs[t]`` is the first observation of an episode."""
    policy_version: np.ndarray | None = None
    """``[T, B, 1]`` int64: the policy version that chose ``action[t]``."""
    extras: NamedArray | None = None
    """``[T, B, ...]`` each: fields the experiment's actor callbacks add (``on_segment`` with
    ``segment_fields``, :mod:`api.episode`); None when none declares any."""


class Policy(abc.ABC):
    """Base class of every policy. Subclass ``algorithm.policy.SingleModelPytorchPolicy`` for the
    common case of one torch model: it implements versions, checkpoints and device placement."""

    arg_ranges: ClassVar[dict[str, str]] = {}
    """The allowed interval of each numeric constructor argument, as for
    :attr:`api.trainer.Trainer.arg_ranges` (``{"hidden_sizes": "[1, inf)"}``)."""

    @property
    def default_policy_state(self) -> NamedArray | None:
        """An agent's memory when it spawns (leading batch dimension 1), or None."""
        return None

    @property
    @abc.abstractmethod
    def version(self) -> int:
        """How many trainer steps produced the current parameters (0 when fresh)."""

    @abc.abstractmethod
    def rollout(self, request: RolloutRequest, **kwargs: Any) -> RolloutResult:
        """Choose actions for a batch of agents (no gradients are needed here)."""

    @abc.abstractmethod
    def analyze(self, sample: SampleBatch, target: str = "ppo", **kwargs: Any) -> Any:
        """Evaluate a sample batch for training; return the trainer's declared AnalyzedResult.

        ``target`` names what the trainer wants analysed, so one policy can serve several
        trainers.
        """

    @abc.abstractmethod
    def get_checkpoint(self) -> dict[str, Any]:
        """Everything needed to rebuild the parameters: a torch-savable dict with ``version``."""

    @abc.abstractmethod
    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Load what ``get_checkpoint`` returned (the version comes along)."""

    def train_mode(self) -> None:  # noqa: B027 - optional hook
        """Switch to training (dropout, batch-norm updates)."""

    def eval_mode(self) -> None:  # noqa: B027 - optional hook
        """Switch to inference."""

    def inc_version(self) -> None:  # noqa: B027 - optional hook
        """Called by the trainer after each step that changed the parameters."""


def register(name: str, entry_point, *, override: bool = False, **kwargs: Any) -> Spec:
    """Register a policy under ``name``; ``kwargs`` become its default arguments."""
    return policies.register(name, entry_point, override=override, **kwargs)


def make(name_or_spec: str | Spec, **kwargs: Any) -> Policy:
    """Build a registered policy."""
    return make_spec("policy", name_or_spec).make(**kwargs)
