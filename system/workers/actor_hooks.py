"""The experiment's actor-side callbacks (``actor_callbacks``), run inside an actor worker.

Built in every actor process from the registered callbacks the config names (the run's user code
is loaded there like everywhere), and called on each environment's episode: at its start, after
every step before the step is recorded (so a hook can shape the reward the trainer sees), and at
its end, when what the hooks logged joins the episode's record as ``custom/<name>``; and on
every batch of finished segments before it is sent (``on_segment``), with the fields the
callbacks declare added. The :class:`~api.episode.Episode` each hook gets, and the segment hook,
are documented in :mod:`api.episode`.

A hook that raises stops the actor with the callback's name and hook in the message; it would
raise again after every restart, so the run ends on it at once (a fatal error).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from api.config import ComponentConfig
from api.environment import Environment, StepResult
from api.episode import ACTOR_HOOKS, Episode, SegmentFields, segment_fields
from api.errors import ConfigError
from api.policy import SampleBatch
from api.registry import make_callbacks
from system.errors import CallbackError
from system.workers.trajectory import with_extras


def declared_fields(objects: list[tuple[str, Any]]) -> SegmentFields:
    """Every callback's ``segment_fields`` together; two declaring one name is a ConfigError."""
    fields: SegmentFields = {}
    for name, obj in objects:
        for key, spec in segment_fields(name, obj).items():
            if key in fields:
                raise ConfigError(
                    [f"actor_callbacks: segment field '{key}' is declared twice ('{name}')"]
                )
            fields[key] = spec
    return fields


class ActorHooks:
    """Every actor callback's hooks, and the episode each environment is playing."""

    def __init__(self, worker_id: str, is_evaluation: bool, configs: list[ComponentConfig]):
        self.worker_id = worker_id
        self.is_evaluation = is_evaluation
        self.objects = make_callbacks(configs, ACTOR_HOOKS, "actor_callbacks")
        self.fields = declared_fields(self.objects)
        self.segment_hooks = [
            (name, obj.on_segment)
            for name, obj in self.objects
            if callable(getattr(obj, "on_segment", None))
        ]
        self.episodes: dict[int, Episode] = {}

    @classmethod
    def of(cls, worker_id: str, is_evaluation: bool, configs: list[ComponentConfig]):
        """The hooks, or None when the experiment has no actor callbacks (nothing to call)."""
        return cls(worker_id, is_evaluation, configs) if configs else None

    def start(
        self,
        e: int,
        env: Environment,
        results: list[StepResult | None],
        n: int,
        policies: list[str],
    ) -> None:
        episode = Episode(
            id=f"{self.worker_id}/{e}/{n}",
            env=env,
            env_index=e,
            actor=self.worker_id,
            evaluation=self.is_evaluation,
            results=list(results),
            policies=list(policies),
        )
        self.episodes[e] = episode
        self._call("on_episode_start", episode)

    def step(self, e: int, results: list[StepResult | None]) -> None:
        episode = self.episodes.get(e)
        if episode is None:  # an environment rebuilt mid-episode: its next reset starts one
            return
        episode.results = list(results)
        episode.length += 1
        self._call("on_episode_step", episode)
        results[:] = episode.results  # a hook may have replaced a result, not only changed it

    def end(self, e: int) -> dict[str, float]:
        """The episode's ``custom/<name>`` (and ``policy/<p>/custom/<name>``) numbers, after
        ``on_episode_end``."""
        episode = self.episodes.pop(e, None)
        if episode is None:
            return {}
        self._call("on_episode_end", episode)
        return dict(episode.logged)

    def segment(self, policy: str, segments: SampleBatch) -> SampleBatch:
        """Finished segments of ``policy``, with the declared fields, after every
        ``on_segment``; a hook that changes the segments' layout is named."""
        segments = with_extras(segments, self.fields)
        if not self.segment_hooks:  # episode hooks only: nothing to call or check per segment
            return segments
        layout = _layout(segments)
        for name, method in self.segment_hooks:
            try:
                returned = method(segments, policy)
            except Exception as e:
                raise CallbackError(
                    f"actor callback '{name}' raised in on_segment (policy {policy}): {e!r}"
                ) from e
            if returned is not None:
                segments = returned
            if _layout(segments) != layout:
                raise CallbackError(
                    f"actor callback '{name}' changed the segments' layout in on_segment: "
                    f"{_difference(layout, _layout(segments))}; change values, not shapes or "
                    "dtypes, and declare new fields in segment_fields"
                )
        return segments

    def _call(self, hook: str, episode: Episode) -> None:
        for name, obj in self.objects:
            method: Any = getattr(obj, hook, None)
            if not callable(method):
                continue
            try:
                method(episode)
            except Exception as e:
                raise CallbackError(
                    f"actor callback '{name}' raised in {hook} (episode {episode.id}): {e!r}"
                ) from e


def _layout(segments: Any) -> dict[str, tuple]:
    """``{path: (shape, dtype)}`` of every array of a SampleBatch (anything else: its type)."""
    if not isinstance(segments, SampleBatch):
        return {"": (type(segments).__name__,)}
    return {
        path: (np.shape(leaf), getattr(leaf, "dtype", type(leaf).__name__))
        for path, leaf in segments.flatten()
    }


def _difference(before: dict[str, tuple], after: dict[str, tuple]) -> str:
    changed = [
        f"{path or 'the segment'} {before.get(path, 'absent')} -> {after.get(path, 'absent')}"
        for path in sorted(set(before) | set(after))
        if before.get(path) != after.get(path)
    ]
    return "; ".join(changed[:4])
