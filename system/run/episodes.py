"""What the controller makes of finished episodes, and the user's callbacks.

Actors report every finished episode as a record: ``episode_return``, ``episode_length``,
``policy/<name>/episode_return`` per policy, ``versions`` (``{policy: [first, last]}``: the
versions that answered its first and last steps), and ``episode_info/<key>`` for each number in
the environment's ``info`` at the last step. :class:`EpisodeWindow` keeps the last episodes and
gives their means for each metrics record (so every number among them reaches metrics.jsonl and
TensorBoard).

:class:`Callbacks` runs the experiment's ``callbacks`` (components registered with
``api.registry.register_callback``) in the controller process. A callback is any object with
some of ``on_episode_end(episode)``, ``on_train_result(policy, stats)`` and
``on_evaluation(mean_return, episodes)``; they receive plain dicts and numbers.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from typing import Any

import numpy as np

from api.config import ComponentConfig
from api.registry import make_callbacks
from system.errors import CallbackError

logger = logging.getLogger(__name__)

HOOKS = ("on_episode_end", "on_train_result", "on_evaluation")
NOT_AVERAGED = frozenset({"started_at"})
"""Numbers of an episode's record that are no measure (when it began: a Unix time)."""
CUSTOM = "custom/"
"""What actor callbacks log (``Episode.log``): reported with their min and max as well, as is
what they log for one policy (``policy/<name>/custom/...``)."""


def is_custom(key: str) -> bool:
    """Whether a record key is a number a user logged: ``custom/<name>`` or
    ``policy/<policy>/custom/<name>``."""
    parts = key.split("/")
    per_policy = len(parts) >= 4 and parts[0] == "policy" and parts[2] == "custom"
    return parts[0] == "custom" or per_policy


class EpisodeWindow:
    """The last ``size`` episodes' records, averaged key by key."""

    def __init__(self, size: int = 100):
        self.episodes: deque[dict[str, float]] = deque(maxlen=size)

    def extend(self, records: Iterable[dict[str, float]]) -> None:
        self.episodes.extend(records)

    def means(self, prefix: str = "") -> dict[str, float]:
        """``{prefix + key: mean}`` over the episodes that have that key."""
        values: dict[str, list[float]] = {}
        for record in self.episodes:
            for key, value in record.items():
                if key in NOT_AVERAGED:
                    continue
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    values.setdefault(key, []).append(float(value))
        means = {f"{prefix}{k}": float(np.mean(v)) for k, v in values.items()}
        for key, v in values.items():  # the user's own numbers: their spread too
            if is_custom(key):
                means[f"{prefix}{key}/min"], means[f"{prefix}{key}/max"] = min(v), max(v)
        return means


class Callbacks:
    """The experiment's callbacks, built once in the controller."""

    def __init__(self, configs: list[ComponentConfig]):
        self.objects = make_callbacks(configs, HOOKS, "callbacks")
        self._train_steps: dict[str, float] = {}
        self.logged: dict[str, float] = {}
        """What hooks returned (a dict of numbers), the newest value of each name, as record
        keys: ``custom/<name>``, or ``policy/<policy>/custom/<name>`` from ``on_train_result``
        (the numbers of that policy's training)."""

    def on_episodes(self, records: list[dict[str, Any]], evaluation: bool) -> None:
        """Finished training episodes (evaluation ones reach ``on_evaluation`` by window)."""
        if evaluation:
            return
        for record in records:
            self._call("on_episode_end", dict(record))

    def on_train_stats(self, policy: str, stats: dict[str, float]) -> None:
        """With a trainer's newest stats whenever its step count moved.

        Stats reach the controller on the trainer's heartbeat, so this is at most once per
        trainer step, not every step: several steps between two heartbeats arrive as one call
        with the latest stats (``stats["steps"]`` says how many steps the trainer has done)."""
        steps = stats.get("steps")
        if steps is None or self._train_steps.get(policy) == steps:
            return
        self._train_steps[policy] = steps
        self._call("on_train_result", policy, dict(stats), logged_as=f"policy/{policy}/{CUSTOM}")

    def on_evaluation(self, mean_return: float | None, episodes: list[dict[str, Any]]) -> None:
        self._call("on_evaluation", mean_return, [dict(e) for e in episodes])

    def _call(self, hook: str, *args: Any, logged_as: str = CUSTOM) -> None:
        for name, obj in self.objects:
            method = getattr(obj, hook, None)
            if method is None:
                continue
            try:
                returned = method(*args)
            except Exception as e:
                raise CallbackError(f"callback '{name}' raised in {hook}: {e!r}") from e
            if isinstance(returned, dict):
                self._log(name, hook, returned, logged_as)

    def _log(self, name: str, hook: str, numbers: dict[str, Any], prefix: str) -> None:
        for key, value in numbers.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise CallbackError(
                    f"callback '{name}' returned {key}={value!r} from {hook}: what a hook "
                    "returns is logged, so it must map names to numbers"
                )
            self.logged[f"{prefix}{key}"] = float(value)
