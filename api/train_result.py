"""What a trainer-side callback sees of one training step (``trainer_callbacks``).

A callback registered with :func:`api.registry.register_callback` and named in the config's
``trainer_callbacks`` is built in every trainer process (from the run's user code, like any
other component) and its ``on_train_result(result)`` is called after every step, where the
policy, the trainer and the batch are: read the network's weights, change a schedule of the
trainer, look at the fields actor callbacks added to the batch (``result.batch.extras``).

:meth:`TrainResult.log` reports a number of the policy's own: ``policy/<name>/custom/<key>``
in metrics.jsonl, TensorBoard and the panel (the newest value; each rank of a data-parallel
group logs its own, and the record shows one). A hook that raises ends the run with its name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from api.errors import UserError
from api.policy import SampleBatch

TRAINER_HOOKS = ("on_train_result",)


@dataclass
class TrainResult:
    """One finished step of one trainer."""

    policy: str
    """The policy trained."""
    worker: str
    """The trainer worker (``trainer/<policy>/<rank>``)."""
    steps: int
    """Steps this worker has done, this one included."""
    version: int
    """The policy's version after the step."""
    stats: dict[str, float]
    """The step's statistics (losses, ``approx_kl``, ...), as the trainer reports them."""
    batch: SampleBatch
    """What it trained on: ``[T, B, ...]`` segments (``extras`` included), or a replay batch."""
    trainer: Any
    """The :class:`~api.trainer.Trainer` (``trainer.policy`` is the policy)."""
    logged: dict[str, float] = field(default_factory=dict)

    def log(self, name: str, value: float) -> None:
        """Report ``value`` as the policy's ``policy/<name>/custom/<name>``."""
        if not isinstance(name, str) or not name or "/" in name:
            raise UserError(f"TrainResult.log: the name must be a word without '/', got {name!r}")
        number = float(value)
        if not math.isfinite(number):
            raise UserError(f"TrainResult.log('{name}', {value!r}): the value must be finite")
        self.logged[name] = number
