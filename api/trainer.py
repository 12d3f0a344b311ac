"""The trainer contract: think of a trainer as the optimiser and the policy as the network.

A trainer worker hands each :class:`~api.policy.SampleBatch` to ``Trainer.step``; the trainer asks
its policy to ``analyze`` the batch, computes a loss from what comes back, and updates the policy's
parameters. What it needs from ``analyze`` it declares as a dataclass, ``AnalyzedResult``, so a
policy author can see exactly which values to return (``test_pipeline`` checks them).
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from api.errors import UserError
from api.policy import Policy, SampleBatch
from api.registry import Spec, make_spec, trainers


@dataclass
class TrainerStepResult:
    """What one trainer step reports."""

    stats: dict[str, float] = field(default_factory=dict)
    """Scalars to log: losses, entropy, KL, gradient norm, ... Every one must be finite: the
    trainer worker ends the run on a NaN or an infinity, as a loss that diverged. Leave out a
    statistic that a batch leaves undefined (PPO's ``explained_variance`` of constant returns)
    rather than reporting it as NaN."""
    step: int = 0
    """How many steps this trainer has taken, this one included."""


class Trainer(abc.ABC):
    """Base class of every trainer."""

    AnalyzedResult: ClassVar[type | None] = None
    """The dataclass ``policy.analyze(sample, target=...)`` must return for this trainer."""

    analyze_target: ClassVar[str] = ""
    """The ``target`` this trainer passes to ``analyze``."""

    needs_replay: ClassVar[bool] = False
    """True for an off-policy trainer whose ``step`` takes replayed transitions
    (``api.replay.TransitionBatch``): the runtime puts a replay buffer worker between the actors
    and it, configured by ``PolicyConfig.replay``."""

    accepts_device_batches: ClassVar[bool] = False
    """True when ``step`` also takes a batch whose arrays are torch tensors already on its
    policy's device: the trainer worker then copies each batch there first, as a stage of its
    own (``to_device`` in the run's timings), instead of inside ``step``."""

    arg_ranges: ClassVar[dict[str, str]] = {}
    """The allowed interval of each numeric constructor argument, in interval notation
    (``{"gamma": "[0, 1]", "lr": "(0, inf)"}``; a list argument's every entry), checked with
    the config before any process starts. Write it as a literal dict in the class itself: the
    check reads it from the source, without importing the module (and torch)."""

    learning_rates: ClassVar[dict[str, str]] = {}
    """Hyper-parameters that are an optimiser's learning rate, each with the attribute that
    holds that optimiser (``{"lr": "optimizer"}``): :meth:`set_hyperparameters` sets the rate
    of its every parameter group, so population-based training explores a rate that the
    trainer gave its optimiser when it was built (DQN's ``lr``, SAC's ``actor_lr``)."""

    @property
    @abc.abstractmethod
    def policy(self) -> Policy:
        """The policy this trainer optimises."""

    @abc.abstractmethod
    def step(self, samples: SampleBatch) -> TrainerStepResult:
        """One training step on a batch of trajectory segments."""

    def get_checkpoint(self) -> dict[str, Any]:
        """The trainer's own state (optimiser, schedules) for resuming. It travels to the
        parameter service with every persisted version (no pickle), so it may hold dicts keyed
        by str or int, lists, tuples, tensors, numpy arrays and plain scalars: what an
        optimiser's ``state_dict()`` holds."""
        return {}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Restore what ``get_checkpoint`` returned."""

    def set_hyperparameters(self, values: dict[str, float]) -> None:
        """Change hyper-parameters between two steps, without a restart (population-based
        training's explore).

        The default sets the numeric attributes of those names, which suits a trainer that reads
        them on every step (PPO's ``lr`` and ``entropy_coef``), and the optimisers' rates named
        in :attr:`learning_rates`. A trainer that derives something else from one when it is
        built overrides this and updates what it derived. A whole-number attribute stays one
        (rounded)."""
        for name, value in values.items():
            if name in self.learning_rates:
                set_learning_rate(getattr(self, self.learning_rates[name]), float(value))
                continue
            current = getattr(self, name, None)
            if isinstance(current, bool) or not isinstance(current, (int, float)):
                raise UserError(
                    f"{type(self).__name__} has no numeric hyper-parameter '{name}' to set; "
                    "explore attributes it reads on every step, or override set_hyperparameters"
                )
            setattr(self, name, float(value) if isinstance(current, float) else round(value))

    @classmethod
    def required_fields(cls) -> list[str]:
        """Names of the fields the declared AnalyzedResult holds."""
        if cls.AnalyzedResult is None or not dataclasses.is_dataclass(cls.AnalyzedResult):
            return []
        return [f.name for f in dataclasses.fields(cls.AnalyzedResult)]


def set_learning_rate(optimizer: Any, lr: float) -> None:
    """Set ``lr`` on every parameter group of a torch optimiser; in place where the rate is a
    tensor (a capturable Adam, whose captured step reads that tensor)."""
    for group in optimizer.param_groups:
        if hasattr(group["lr"], "fill_"):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def register(name: str, entry_point, *, override: bool = False, **kwargs: Any) -> Spec:
    """Register a trainer under ``name``; ``kwargs`` become its default arguments."""
    return trainers.register(name, entry_point, override=override, **kwargs)


def make(name_or_spec: str | Spec, policy: Policy, **kwargs: Any) -> Trainer:
    """Build a registered trainer for ``policy``."""
    return make_spec("trainer", name_or_spec).make(policy=policy, **kwargs)
