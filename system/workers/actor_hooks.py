"""The experiment's actor-side callbacks (``actor_callbacks``), run inside an actor worker.

Built in every actor process from the registered callbacks the config names (the run's user code
is loaded there like everywhere), and called on each environment's episode: at its start, after
every step before the step is recorded (so a hook can shape the reward the trainer sees), and at
its end, when what the hooks logged joins the episode's record as ``custom/<name>``. The
:class:`~api.episode.Episode` each hook gets is documented in :mod:`api.episode`.

A hook that raises stops the actor with the callback's name and hook in the message; it would
raise again after every restart, so the run ends on it at once (a fatal error).
"""

from __future__ import annotations

from typing import Any

from api.config import ComponentConfig
from api.environment import Environment, StepResult
from api.episode import ACTOR_HOOKS, Episode
from api.registry import make_callbacks
from system.errors import CallbackError


class ActorHooks:
    """Every actor callback's hooks, and the episode each environment is playing."""

    def __init__(self, worker_id: str, is_evaluation: bool, configs: list[ComponentConfig]):
        self.worker_id = worker_id
        self.is_evaluation = is_evaluation
        self.objects = make_callbacks(configs, ACTOR_HOOKS, "actor_callbacks")
        self.episodes: dict[int, Episode] = {}

    @classmethod
    def of(cls, worker_id: str, is_evaluation: bool, configs: list[ComponentConfig]):
        """The hooks, or None when the experiment has no actor callbacks (nothing to call)."""
        return cls(worker_id, is_evaluation, configs) if configs else None

    def start(self, e: int, env: Environment, results: list[StepResult | None], n: int) -> None:
        episode = Episode(
            id=f"{self.worker_id}/{e}/{n}",
            env=env,
            env_index=e,
            actor=self.worker_id,
            evaluation=self.is_evaluation,
            results=list(results),
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
        """The episode's ``custom/<name>`` numbers, after ``on_episode_end``."""
        episode = self.episodes.pop(e, None)
        if episode is None:
            return {}
        self._call("on_episode_end", episode)
        return {f"custom/{name}": value for name, value in episode.logged.items()}

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
