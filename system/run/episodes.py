"""What the controller makes of finished episodes, and the user's callbacks.

Actors report every finished episode as a record: ``episode_return``, ``episode_length``,
``policy/<name>/episode_return`` per policy, ``versions`` (``{policy: [first, last]}``: the
versions that answered its first and last steps), and ``episode_info/<key>`` for each number in
the environment's ``info`` at the last step. :class:`EpisodeRecord` is that record checked, as
the tally and the coordination drivers read it. :class:`EpisodeWindow` keeps the last episodes
and gives their means for each metrics record (so every number among them reaches metrics.jsonl
and TensorBoard).

:class:`Callbacks` runs the experiment's ``callbacks`` (components registered with
``api.registry.register_callback``) in the controller process. A callback is any object with
some of ``on_episode_end(episode)``, ``on_train_result(policy, stats)`` and
``on_evaluation(mean_return, episodes)``; they receive plain dicts and numbers.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from api.config import ComponentConfig
from api.registry import make_callbacks
from system.errors import CallbackError, WireError

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


def is_number(value: Any) -> bool:
    """A number of a record: an int or a float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Seat(NamedTuple):
    """One agent of a multi-agent episode: who played it and what it scored."""

    policy: str
    version: int
    episode_return: float


@dataclass(frozen=True)
class EpisodeRecord:
    """One finished episode as an actor reported it (``system.workers.actor_worker``), checked
    once where the heartbeat is read, so that nothing downstream guards its keys."""

    episode_return: float
    numbers: dict[str, float] = field(default_factory=dict)
    """Every number of the record that is a measure (``episode_return``, ``episode_length``,
    ``policy/<name>/episode_return``, ``episode_info/<key>``, ``result/<a>_vs_<b>``, what
    callbacks logged): what the windows average."""
    versions: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per policy, the versions that answered the episode's first and last steps."""
    seats: tuple[Seat, ...] = ()
    """Per agent of a multi-agent episode, from which the ratings are made."""
    env: str | None = None
    """The environment that played it (``<actor>/<index>``), for per-environment quotas."""
    started_at: float | None = None
    """When it began (Unix time): an evaluation window counts only episodes begun in it."""
    sent: dict[str, Any] = field(default_factory=dict, repr=False)
    """The record as the actor sent it: what the user's callbacks receive."""

    @classmethod
    def from_wire(cls, body: Any) -> EpisodeRecord:
        """Raises :class:`WireError` naming the entry that does not fit."""
        if not (isinstance(body, dict) and is_number(body.get("episode_return"))):
            raise WireError(f"an episode record needs a numeric episode_return, got {body!r}")
        started_at, env = body.get("started_at"), body.get("env")
        if not (started_at is None or is_number(started_at)):
            raise WireError(f"an episode's started_at must be a number, got {started_at!r}")
        return cls(
            episode_return=float(body["episode_return"]),
            numbers={
                str(k): float(v) for k, v in body.items() if is_number(v) and k not in NOT_AVERAGED
            },
            versions=_versions(body.get("versions", {})),
            seats=_seats(body.get("seats", [])),
            env=None if env is None else str(env),
            started_at=None if started_at is None else float(started_at),
            sent=body,
        )

    def policy_return(self, policy: str | None) -> float | None:
        """The return of ``policy``'s agents (None: it played no part); the whole episode's
        return when no policy is named (None or "")."""
        if not policy:
            return self.episode_return
        return self.numbers.get(f"policy/{policy}/episode_return")

    @property
    def game_return(self) -> float | None:
        """A whole game's unclipped score, where the environment reports one at its end
        (``info["game_return"]``: Atari-v0, whose episodes are lives, rewards clipped)."""
        return self.numbers.get("episode_info/game_return")


def _versions(body: Any) -> dict[str, tuple[int, int]]:
    if not isinstance(body, dict):
        raise WireError(f"an episode's versions must map policies to [first, last], got {body!r}")
    versions = {}
    for policy, pair in body.items():
        pair_of_ints = isinstance(pair, (list, tuple)) and len(pair) == 2
        if not (pair_of_ints and all(type(v) is int for v in pair)):
            raise WireError(
                f"an episode's versions[{policy!r}] must be [first, last] ints, got {pair!r}"
            )
        versions[str(policy)] = (pair[0], pair[1])
    return versions


def _seats(body: Any) -> tuple[Seat, ...]:
    if not isinstance(body, list):
        raise WireError(f"an episode's seats must be a list, got {body!r}")
    for seat in body:
        if not (
            isinstance(seat, (list, tuple))
            and len(seat) == 3
            and type(seat[1]) is int
            and is_number(seat[2])
        ):
            raise WireError(f"an episode's seat must be [policy, version, return], got {seat!r}")
    return tuple(Seat(str(p), v, float(r)) for p, v, r in body)


class EpisodeWindow:
    """The last ``size`` episodes' records, averaged key by key."""

    def __init__(self, size: int = 100):
        self.episodes: deque[EpisodeRecord] = deque(maxlen=size)

    def extend(self, records: Iterable[EpisodeRecord]) -> None:
        self.episodes.extend(records)

    def means(self, prefix: str = "") -> dict[str, float]:
        """``{prefix + key: mean}`` over the episodes that have that key."""
        values: dict[str, list[float]] = {}
        for record in self.episodes:
            for key, value in record.numbers.items():
                values.setdefault(key, []).append(value)
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

    def on_episodes(self, records: list[EpisodeRecord], evaluation: bool) -> None:
        """Finished training episodes (evaluation ones reach ``on_evaluation`` by window)."""
        if evaluation:
            return
        for record in records:
            self._call("on_episode_end", dict(record.sent))

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

    def on_evaluation(self, mean_return: float | None, episodes: list[EpisodeRecord]) -> None:
        self._call("on_evaluation", mean_return, [dict(e.sent) for e in episodes])

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
