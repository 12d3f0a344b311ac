"""What an actor-side callback sees of one episode (``actor_callbacks`` in the experiment).

A callback registered with :func:`api.registry.register_callback` and named in the config's
``actor_callbacks`` is built in every actor process (from the run's user code, like any other
component) and called where the data is, before anything leaves the actor:

- ``on_episode_start(episode)``: after the environment's ``reset``;
- ``on_episode_step(episode)``: after each ``step``, *before* the step is recorded: changing
  ``episode.results[i].reward`` shapes the reward the trainer learns from (an intrinsic bonus,
  a penalty), and ``episode.results[i].info`` is that step's ``info``;
- ``on_episode_end(episode)``: when the episode is over, before its record goes to the
  controller.

Any of them may call :meth:`Episode.log`; the number appears as ``custom/<name>`` in
metrics.jsonl and TensorBoard (its mean over the last 100 episodes, with ``/min`` and ``/max``;
evaluation episodes under ``eval/``) and in the live panel. ``episode.user_data`` is a dict kept
for the episode: what a callback needs between steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from api.environment import Environment, StepResult
from api.errors import UserError


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
    length: int = 0
    """Steps taken so far."""
    user_data: dict[str, Any] = field(default_factory=dict)
    """The callbacks' own scratch space for this episode."""
    logged: dict[str, float] = field(default_factory=dict)

    def log(self, name: str, value: float) -> None:
        """Report ``value`` as this episode's ``custom/<name>`` (the last call for a name in an
        episode is its value)."""
        if not isinstance(name, str) or not name or "/" in name:
            raise UserError(f"Episode.log: the name must be a word without '/', got {name!r}")
        number = float(value)
        if not math.isfinite(number):
            raise UserError(f"Episode.log('{name}', {value!r}): the value must be finite")
        self.logged[name] = number


ACTOR_HOOKS = ("on_episode_start", "on_episode_step", "on_episode_end")
