"""What an actor-side callback sees of one episode and of the segments it sends
(``actor_callbacks`` in the experiment).

A callback registered with :func:`api.registry.register_callback` and named in the config's
``actor_callbacks`` is built in every actor process (from the run's user code, like any other
component) and called where the data is, before anything leaves the actor:

- ``on_episode_start(episode)``: after the environment's ``reset``;
- ``on_episode_step(episode)``: after each ``step``, *before* the step is recorded: changing
  ``episode.results[i].reward`` shapes the reward the trainer learns from (an intrinsic bonus,
  a penalty), and ``episode.results[i].info`` is that step's ``info``;
- ``on_episode_end(episode)``: when the episode is over, before its record goes to the
  controller;
- ``on_segment(segment, policy)``: a batch of finished trajectory segments of policy
  ``policy`` (a :class:`~api.policy.SampleBatch`, ``[T + 1, k, ...]``, time first), just before
  it is sent to the trainers: the place for what is computed over many steps at once (a bonus
  from a batch of observations, a rewritten reward). Change its arrays in place or return a
  SampleBatch laid out the same. Fields of its own go in ``segment.extras``: the callback
  declares them as ``segment_fields = {"name": (shape, dtype)}`` (per step and agent, e.g.
  ``{"bonus": ((1,), "float32")}``), the actor fills them with zeros before the hook, and the
  run's message layouts know them, so the trainers receive ``sample.extras.name`` ``[T, B,
  *shape]``. Only training actors send segments; replay buffers keep the standard fields.

Any episode hook may call :meth:`Episode.log`; the number appears as ``custom/<name>`` in
metrics.jsonl and TensorBoard (its mean over the last 100 episodes, with ``/min`` and ``/max``;
evaluation episodes under ``eval/``) and in the live panel; with ``policy=``, as
``policy/<policy>/custom/<name>``. ``episode.user_data`` is a dict kept for the episode: what a
callback needs between steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from api.environment import Environment, StepResult
from api.errors import ConfigError, UserError


@dataclass
class Episode:
    """One episode of one environment of one actor, as it is played."""

    id: str
    """Unique in the run: ``<actor>/<environment>/<number>`` (e.g. ``actor/0/3/12``)."""
    env: Environment
    """The environment playing it (read its state, never step it)."""
    env_index: int
    actor: str
    evaluation: bool
    """Played greedily by an evaluation actor (its steps train nothing)."""
    results: list[StepResult | None] = field(default_factory=list)
    """Each agent's result of the last reset or step (None: that agent has no result now)."""
    policies: list[str] = field(default_factory=list)
    """The policy playing each agent in this episode (a policy mapping may change it from one
    episode to the next)."""
    length: int = 0
    """Steps taken so far."""
    user_data: dict[str, Any] = field(default_factory=dict)
    """The callbacks' own scratch space for this episode."""
    logged: dict[str, float] = field(default_factory=dict)

    def log(self, name: str, value: float, policy: str | None = None) -> None:
        """Report ``value`` as this episode's ``custom/<name>``, or with ``policy`` (one of
        :attr:`policies`) as ``policy/<policy>/custom/<name>``: a number that belongs to one
        side of a game. The last call for a name in an episode is its value."""
        if not isinstance(name, str) or not name or "/" in name:
            raise UserError(f"Episode.log: the name must be a word without '/', got {name!r}")
        number = float(value)
        if not math.isfinite(number):
            raise UserError(f"Episode.log('{name}', {value!r}): the value must be finite")
        if policy is None:
            self.logged[f"custom/{name}"] = number
            return
        if policy not in self.policies:
            raise UserError(
                f"Episode.log('{name}', policy={policy!r}): no agent of this episode plays "
                f"'{policy}'; its policies are {sorted(set(self.policies))}"
            )
        self.logged[f"policy/{policy}/custom/{name}"] = number


ACTOR_HOOKS = ("on_episode_start", "on_episode_step", "on_episode_end", "on_segment")

SegmentFields = dict[str, tuple[tuple[int, ...], np.dtype]]
"""Fields a callback adds to segments: name -> (shape per step and agent, dtype)."""


def segment_fields(name: str, callback: Any) -> SegmentFields:
    """The fields the callback ``name`` declares for ``segment.extras`` (``segment_fields``),
    checked; a ConfigError says what is wrong with them."""
    declared = getattr(callback, "segment_fields", None) or {}
    where = f"actor_callbacks: '{name}'.segment_fields"
    if not isinstance(declared, Mapping):
        raise ConfigError([f"{where} must map field names to (shape, dtype), got {declared!r}"])
    fields: SegmentFields = {}
    for key, spec in declared.items():
        try:
            shape, dtype = spec
            shape, dtype = tuple(int(n) for n in shape), np.dtype(dtype)
        except (TypeError, ValueError) as e:
            raise ConfigError(
                [f"{where}['{key}'] must be (shape, dtype), e.g. ((1,), 'float32'); got "
                 f"{spec!r} ({e})"]
            ) from e  # fmt: skip
        if not (isinstance(key, str) and key.isidentifier()) or dtype.kind not in "biuf":
            raise ConfigError(
                [f"{where}['{key}']: a field is named by an identifier and holds booleans or "
                 f"numbers, got {key!r} of {dtype}"]
            )  # fmt: skip
        fields[key] = (shape, dtype)
    return fields
