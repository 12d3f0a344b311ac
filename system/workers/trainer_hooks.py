"""The experiment's trainer-side callbacks (``trainer_callbacks``), run inside a trainer worker.

Built in every trainer process from the registered callbacks the config names, and called after
each step with a :class:`~api.train_result.TrainResult`. What they log joins the trainer's stats
as ``custom/<name>``, which reach the controller on the heartbeat like every other stat and
become ``policy/<policy>/custom/<name>`` in the record (:mod:`system.run.tally`).

A hook that raises stops the trainer with the callback's name in the message; it would raise
again after every restart, so the run ends on it at once (a fatal error).
"""

from __future__ import annotations

from typing import Any

from api.config import ComponentConfig
from api.registry import make_callbacks
from api.train_result import TRAINER_HOOKS, TrainResult
from system.errors import CallbackError

CUSTOM_STAT = "custom/"
"""The trainer stats that are the callbacks' numbers."""


class TrainerHooks:
    def __init__(self, configs: list[ComponentConfig]):
        self.objects = make_callbacks(configs, TRAINER_HOOKS, "trainer_callbacks")

    @classmethod
    def of(cls, configs: list[ComponentConfig]) -> TrainerHooks | None:
        """The hooks, or None when the experiment has no trainer callbacks."""
        return cls(configs) if configs else None

    def after_step(self, result: TrainResult) -> dict[str, float]:
        """Call every ``on_train_result``; the numbers they logged, as trainer stats."""
        for name, obj in self.objects:
            method: Any = getattr(obj, "on_train_result", None)
            if not callable(method):
                continue
            try:
                method(result)
            except Exception as e:
                raise CallbackError(
                    f"trainer callback '{name}' raised in on_train_result ({result.worker}, "
                    f"step {result.steps}): {e!r}"
                ) from e
        return {f"{CUSTOM_STAT}{k}": v for k, v in result.logged.items()}
