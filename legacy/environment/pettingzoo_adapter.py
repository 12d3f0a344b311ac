"""PettingZoo environments (AEC and parallel APIs) as Troupe :class:`~api.environment.Environment`.

Agents are numbered in the order of the PettingZoo environment's ``possible_agents``; agent ``i``
of Troupe is ``possible_agents[i]``, and its spaces are that agent's spaces.

**AEC (turn-based) games** (:class:`PettingZooAECEnvironment`): only the agent to move gets a
result; every other agent gets ``None`` and receives ``None`` as its action. PettingZoo hands out
rewards to every agent after every move (in connect four the loser's -1 arrives on the winner's
move), so the adapter keeps each agent's rewards since its last result and pays them out with its
next one: nothing is lost, and each agent's episode return equals PettingZoo's own accounting.
When an agent leaves the game (terminated or truncated) it gets one final result with
``done``/``truncated`` set, carrying what it had pending; PettingZoo's "dead step" (``step(None)``
for a finished agent) is taken by the adapter, never by the caller. The episode ends when no agent
is left.

**Parallel games** (:class:`PettingZooParallelEnvironment`): every live agent acts on every step;
an agent that has left the game gets ``None``.

``done`` is PettingZoo's ``termination``; ``truncated`` is its ``truncation`` unless the agent
also terminated (a terminal state is not bootstrapped). Illegal moves are the environment's
business: PettingZoo's classic games end the game and give the offender -1 (its
``TerminateIllegalWrapper``); policies that read the ``action_mask`` key of a dict observation
never make one. ``float64`` Box observations are cast to ``float32`` (and declared so), the dtype
policies compute in. An agent's Dict or Tuple action space is acted in as one flat space, as the
gymnasium adapter does (:mod:`legacy.environment.flat_actions`).

Any PettingZoo game is an environment by its id: ``pettingzoo:<family>/<game>`` (its id in
PettingZoo's registry, or in a PettingZoo without one the module under ``pettingzoo``; e.g.
``pettingzoo:classic/rps_v2``, ``pettingzoo:butterfly/knights_archers_zombies_v11``), played
through its parallel API where the game has one and is not a classic (turn-based) game, else its
AEC one; ``#aec`` or ``#parallel`` after the id chooses. ``troupe test-env
pettingzoo:classic/rps_v2``, ``environment.type=pettingzoo:...`` (resolved by
:mod:`legacy.environment.pettingzoo_ids`). The particle games keep
their ids (``pettingzoo:mpe/simple_spread_v3``) where PettingZoo (1.27) moved them to the
``mpe2`` package: they are made from there.

PettingZoo is an optional dependency: ``pip install 'troupe-rl[multiagent]'``; MPE's games need
``pip install 'troupe-rl[mpe]'``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from api.environment import Environment, StepResult, one_number
from api.errors import UserError
from api.registry import load_entry_point
from legacy.environment.flat_actions import flat_or_none
from legacy.environment.pettingzoo_spaces import (
    obs_with_state,
    troupe_obs,
    troupe_space,
    with_state,
    zero_obs,
)

INSTALL_HINT = (
    "install it with: pip install 'troupe-rl[multiagent]' "
    "(a worker image: troupe image build --extras multiagent)"
)


def _make_pettingzoo_env(entry_point: str, env_kwargs: dict[str, Any]) -> Any:
    """Build ``entry_point(**env_kwargs)`` with errors that say what to install or fix."""
    try:
        import pettingzoo  # noqa: F401 - only to give a clear error when it is missing
    except ImportError as e:
        raise UserError(
            f"PettingZoo environments need the 'pettingzoo' package; {INSTALL_HINT}"
        ) from e
    factory = load_entry_point(entry_point, what="PettingZoo environment")
    try:
        return factory(**env_kwargs)
    except ImportError as e:
        raise UserError(
            f"PettingZoo environment '{entry_point}' needs a package that is not installed ({e}); "
            f"{INSTALL_HINT}"
        ) from e


def _state_space(env: Any, entry_point: str) -> gym.Space:
    """The game's global state space (``global_state=True``), or a UserError naming the games
    that have one."""
    try:
        space = env.state_space
    except (AttributeError, NotImplementedError):
        space = None
    if space is None or not callable(getattr(env, "state", None)):
        raise UserError(
            f"global_state: PettingZoo environment '{entry_point}' has no global state "
            "(state_space and state()); MPE's games have one"
        )
    return troupe_space(space)


class _PettingZooBase(Environment):
    """What both APIs share: agents, spaces, seeding, action conversion, closing."""

    api_name = ""
    render_kwargs: ClassVar[dict[str, Any]] = {"render_mode": "rgb_array"}
    """What makes it draw frames (``troupe eval --video``): a PettingZoo game draws only when
    made to."""

    def __init__(self, env: str, global_state: bool = False, **env_kwargs: Any):
        self.entry_point = env
        self._env = _make_pettingzoo_env(env, env_kwargs)
        self.agent_names: list[str] = list(self._env.possible_agents)
        if not self.agent_names:
            raise UserError(f"PettingZoo environment '{env}' has no possible_agents")
        self._index = {name: i for i, name in enumerate(self.agent_names)}
        self._own_spaces = [troupe_space(self._env.observation_space(a)) for a in self.agent_names]
        """Each agent's own observation space; :attr:`_obs_spaces` adds the state to it."""
        self._state_space = _state_space(self._env, env) if global_state else None
        self._state: Any = None
        """The game's global state since the last reset or step (None: not read yet)."""
        self._obs_spaces = self._own_spaces
        if self._state_space is not None:
            self._obs_spaces = [with_state(s, self._state_space) for s in self._own_spaces]
        self._flat = [flat_or_none(self._env.action_space(a)) for a in self.agent_names]
        """Each agent's Dict or Tuple action space flattened for its policy (None: as it is)."""
        self._act_spaces = [
            self._env.action_space(a) if f is None else f.space
            for a, f in zip(self.agent_names, self._flat, strict=True)
        ]
        self._next_seed: int | None = None
        self._running = False
        self._last_obs: list[Any] = [None] * len(self.agent_names)

    @property
    def pettingzoo_env(self) -> Any:
        """The wrapped PettingZoo environment, for code that needs its own API."""
        return self._env

    @property
    def agent_count(self) -> int:
        return len(self.agent_names)

    @property
    def observation_spaces(self) -> list[gym.Space]:
        return list(self._obs_spaces)

    @property
    def action_spaces(self) -> list[gym.Space]:
        return list(self._act_spaces)

    def seed(self, seed: int) -> None:
        """Seed the next ``reset`` (PettingZoo seeds through ``reset(seed=...)``)."""
        self._next_seed = int(seed)
        for i, space in enumerate(self._act_spaces):
            space.seed(int(seed) + i)

    def render(self) -> Any:
        """A frame when the env was made with ``render_mode="rgb_array"``, otherwise None."""
        if getattr(self._env, "render_mode", None) is None:
            return None
        return self._env.render()

    def close(self) -> None:
        self._env.close()

    # ----------------------------------------------------------------- helpers
    def _take_seed(self) -> int | None:
        # Like gymnasium: only the first reset after seed() restarts the random stream.
        seed, self._next_seed = self._next_seed, None
        return seed

    def _observation(self, i: int, obs: Any) -> Any:
        obs = troupe_obs(obs, self._own_spaces[i])
        if self._state_space is not None:
            if self._state is None:  # read once a step, whatever the number of agents
                self._state = troupe_obs(self._env.state(), self._state_space)
            obs = obs_with_state(obs, self._state)
        self._last_obs[i] = obs
        return obs

    def _action(self, i: int, action: Any) -> Any:
        """A policy's action (often a numpy scalar or 1-element array) as PettingZoo expects."""
        if action is None:
            raise ValueError(
                f"{self.entry_point}: agent {i} ('{self.agent_names[i]}') acts on this step but "
                "its action is None; pass an action for every agent whose last result was not None"
            )
        if self._flat[i] is not None:
            return self._flat[i].unflatten(action)
        if isinstance(self._act_spaces[i], gym.spaces.Discrete):
            return int(np.asarray(action).reshape(-1)[0])
        return np.asarray(action, dtype=self._act_spaces[i].dtype)

    def _check_running(self, actions: list[Any]) -> None:
        if not self._running:
            raise UserError(
                f"{self.entry_point}: step() called but no episode is running (it ended, or "
                "reset() was never called); call reset() to start a new episode"
            )
        if len(actions) != self.agent_count:
            raise ValueError(
                f"{self.entry_point} has {self.agent_count} agents, so step() takes "
                f"{self.agent_count} actions (None for agents that do not act); got {len(actions)}"
            )

    def _final_obs(self, i: int) -> Any:
        last = self._last_obs[i]
        return zero_obs(self._obs_spaces[i]) if last is None else last


class PettingZooAECEnvironment(_PettingZooBase):
    """A PettingZoo AEC (turn-based) environment: one agent acts per step.

    ``env`` is the ``"module:function"`` that builds it, e.g.
    ``"pettingzoo.classic.connect_four.connect_four:env"``; ``env_kwargs`` go to that function.
    """

    api_name = "aec"

    def __init__(self, env: str, **env_kwargs: Any):
        super().__init__(env, **env_kwargs)
        self._pending = np.zeros(self.agent_count, dtype=np.float64)
        self._finished = [False] * self.agent_count

    def reset(self) -> list[StepResult | None]:
        self._env.reset(seed=self._take_seed())
        self._state = None
        self._pending[:] = 0.0
        self._finished = [False] * self.agent_count
        self._last_obs = [None] * self.agent_count
        self._running = True
        return self._advance()

    def step(self, actions: list[Any]) -> list[StepResult | None]:
        self._check_running(actions)
        i = self._index[self._env.agent_selection]
        self._env.step(self._action(i, actions[i]))
        self._state = None
        self._collect_rewards()
        return self._advance()

    def _collect_rewards(self) -> None:
        """Add the last move's rewards to every agent's pending reward."""
        for name, reward in self._env.rewards.items():
            self._pending[self._index[name]] += one_number(reward)

    def _advance(self) -> list[StepResult | None]:
        """Retire finished agents (each gets a final result), then give the mover its turn."""
        env = self._env
        results: list[StepResult | None] = [None] * self.agent_count
        while env.agents:
            name = env.agent_selection
            i = self._index[name]
            done, truncated = bool(env.terminations[name]), bool(env.truncations[name])
            if not (done or truncated):
                results[i] = self._result(i, self._observation(i, env.observe(name)))
                return results
            obs = self._observation(i, env.observe(name))
            results[i] = self._result(i, obs, done, truncated and not done, env.infos.get(name))
            self._finished[i] = True
            env.step(None)  # PettingZoo's dead step: removes the finished agent
            self._state = None
        self._running = False
        for i, finished in enumerate(self._finished):
            if not finished:  # left without a dead step: close its episode all the same
                results[i] = self._result(i, self._final_obs(i), False, True)
                self._finished[i] = True
        return results

    def _result(
        self, i: int, obs: Any, done: bool = False, truncated: bool = False, info=None
    ) -> StepResult:
        reward = float(self._pending[i])
        self._pending[i] = 0.0
        return StepResult(obs, reward, done, truncated, dict(info or {}))


class PettingZooParallelEnvironment(_PettingZooBase):
    """A PettingZoo parallel environment: every live agent acts on every step.

    ``env`` is the ``"module:function"`` that builds it, e.g.
    ``"pettingzoo.butterfly.knights_archers_zombies.knights_archers_zombies:parallel_env"``.
    """

    api_name = "parallel"

    def reset(self) -> list[StepResult | None]:
        observations, infos = self._env.reset(seed=self._take_seed())
        self._state = None
        self._last_obs = [None] * self.agent_count
        self._running = True
        results: list[StepResult | None] = [None] * self.agent_count
        for name, obs in observations.items():
            i = self._index[name]
            results[i] = StepResult(self._observation(i, obs), 0.0, info=dict(infos.get(name, {})))
        return results

    def step(self, actions: list[Any]) -> list[StepResult | None]:
        self._check_running(actions)
        live = list(self._env.agents)
        act = {name: self._action(self._index[name], actions[self._index[name]]) for name in live}
        observations, rewards, terminations, truncations, infos = self._env.step(act)
        self._state = None
        results: list[StepResult | None] = [None] * self.agent_count
        arrived = [name for name in self._env.agents if name not in live]
        for name in live + arrived:  # an agent that joined mid-episode gets its first result
            i = self._index[name]
            done = bool(terminations.get(name, False))
            truncated = bool(truncations.get(name, False)) and not done
            obs = observations.get(name)
            obs = self._final_obs(i) if obs is None else self._observation(i, obs)
            if not self._env.agents and not (done or truncated):
                truncated = True  # every agent is gone: the episode is over for this one too
            results[i] = StepResult(
                obs, one_number(rewards.get(name, 0.0)), done, truncated, dict(infos.get(name, {}))
            )
        self._running = bool(self._env.agents)
        return results
