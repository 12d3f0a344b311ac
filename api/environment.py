"""The environment contract: what an actor worker steps.

Unlike gymnasium, an Environment may hold several agents: ``reset`` and ``step`` return a list
with one :class:`StepResult` per agent, and an entry is ``None`` for an agent that does not act on
this step (it waits for its turn, or it is out of the episode). ``step`` receives one action per
agent, ``None`` for the agents whose last result was ``None``.

Conventions a checked environment follows (``api.testing.test_environment`` verifies them):

* ``obs`` lies in the agent's observation space: an array of the declared shape and dtype, or, for
  a ``gymnasium.spaces.Dict`` space, a dict of such arrays keyed like the space.
* ``reward`` is one number: a Python or numpy scalar, or an array of shape ``()`` or ``(1,)``.
* ``done`` means the episode terminated (a terminal state: no bootstrapping past it);
  ``truncated`` means it was cut short (a time limit): the return would have gone on. An episode
  ends for everyone when every agent's result is done or truncated; then call ``reset``.
* ``info`` is a dict; numeric entries of the final step's info are reported as episode stats.

Register an environment once, by name, so every process of a run can build it::

    from api.environment import register
    register("my-env", "my_package.envs:MyEnv", size=8)
    env = make("my-env", size=16)
"""

from __future__ import annotations

import abc
import logging
import numbers
from dataclasses import dataclass, field, replace
from typing import Any

import gymnasium as gym
import numpy as np

from api.errors import RegistryError
from api.registry import Spec, environments, make_spec
from api.spaces import dict_of_tuples, from_positions

logger = logging.getLogger(__name__)


@dataclass
class StepResult:
    """What one agent sees after ``reset`` or one ``step``."""

    obs: Any
    """The observation: an array, or a dict of arrays for a Dict space."""
    reward: Any = 0.0
    """The reward received for the previous action (0 after reset): one number."""
    done: bool = False
    """The episode terminated: a terminal state, no value beyond it."""
    truncated: bool = False
    """The episode was cut short (e.g. a time limit): value beyond it is bootstrapped."""
    info: dict[str, Any] = field(default_factory=dict)
    """Extra information; numeric entries at episode end are reported as episode stats."""


def one_number(reward: Any) -> Any:
    """A reward as a float where it is one number: a Python or numpy scalar, or an array of
    one element, as the contract allows (numpy 2 refuses ``float()`` of an array of shape
    ``(1,)``: an adapter's ``float(reward)`` crashed every step of such an environment, restart
    after restart). Anything else is returned as it came, for the actor's check to name what is
    wrong with it (:func:`api.env_check.reward_problem`)."""
    if type(reward) is float:  # the usual case, each step: 27 ns a call; via the ABC, 230
        return reward
    if isinstance(reward, numbers.Real):
        return float(reward)
    one = isinstance(reward, np.ndarray) and reward.shape in ((), (1,))
    if one and np.issubdtype(reward.dtype, np.number) and reward.dtype.kind != "c":
        return float(reward.reshape(()))
    return reward


class Environment(abc.ABC):
    """Base class of every environment stepped by Troupe's actor workers."""

    @property
    @abc.abstractmethod
    def agent_count(self) -> int:
        """Number of agents; ``reset`` and ``step`` return lists of this length."""

    @property
    @abc.abstractmethod
    def observation_spaces(self) -> list[gym.Space]:
        """One gymnasium space per agent."""

    @property
    @abc.abstractmethod
    def action_spaces(self) -> list[gym.Space]:
        """One gymnasium space per agent."""

    @abc.abstractmethod
    def reset(self) -> list[StepResult | None]:
        """Start a new episode; one result per agent (reward 0, not done)."""

    @abc.abstractmethod
    def step(self, actions: list[Any]) -> list[StepResult | None]:
        """Apply one action per agent (``None`` for agents that do not act)."""

    frames_per_step: int = 1
    """Frames of the simulator under the environment that one ``step`` covers: more than 1
    where an action is repeated (Atari's frame skip of 4). Steps are what ``env_frames``
    counts; where this is more than 1 a run reports ``emulator_frames`` beside them, so that
    agent steps and emulator frames are never mixed. A class attribute, a property or
    ``self.frames_per_step = n`` in ``__init__``."""

    def seed(self, seed: int) -> None:  # noqa: B027 - optional hook, default does nothing
        """Seed the environment's randomness; the next ``reset`` starts a reproducible episode."""

    def set_curriculum_stage(self, stage: Any) -> None:  # noqa: B027 - optional hook
        """Move to another curriculum stage (for environments with curricula)."""

    def render(self) -> Any:
        """Return a frame (an RGB array) or None when the environment cannot render."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the environment holds (processes, files, windows)."""


def frames_per_step(env: Any) -> int:
    """``env.frames_per_step`` checked (an environment that is no subclass of ours may lack
    it: 1); a ValueError says what is wrong with it."""
    value = getattr(env, "frames_per_step", 1)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"frames_per_step must be a whole number of 1 or more, got {value!r}")
    return int(value)


def close_after_probe(env: Environment, name: str) -> None:
    """Close an environment made only to read its spaces. A ``close`` that raises is said (a
    warning naming the environment) and not raised: the spaces were read, and a worker closes
    its environments as best effort too. It ended ``troupe train`` with a bare traceback."""
    try:
        env.close()
    except Exception as e:
        logger.warning(
            "environment '%s': close() raised %s: %s (its spaces were read; troupe test-env "
            "checks close() too)", name, type(e).__name__, e,
        )  # fmt: skip


def register(name: str, entry_point, *, override: bool = False, **kwargs: Any) -> Spec:
    """Register an environment under ``name``; ``kwargs`` become its default arguments."""
    return environments.register(name, entry_point, override=override, **kwargs)


def make(name_or_spec: str | Spec, **kwargs: Any) -> Environment:
    """Build a registered environment (any gymnasium id works too, through the adapter). One
    whose observations hold a Tuple is seen through :class:`TuplesAsDicts`."""
    env = make_spec("environment", name_or_spec).make(**kwargs)
    if isinstance(env, gym.Env):
        name = getattr(name_or_spec, "name", name_or_spec)
        raise RegistryError(
            f"environment '{name}' built a gymnasium environment ({type(env).__name__}): "
            f"register it with gymnasium instead, gymnasium.register('{name}', "
            f"entry_point=...), and train its id; Troupe's register takes an "
            "api.environment.Environment"
        )
    if not isinstance(env, Environment):
        raise RegistryError(
            f"environment '{name_or_spec}' built a {type(env).__name__}, which is not an "
            "api.environment.Environment; subclass Environment (or register a gymnasium "
            "environment with gymnasium.register and use its id)"
        )
    if any(dict_of_tuples(s) is not s for s in env.observation_spaces):
        return TuplesAsDicts(env)
    return env


class TuplesAsDicts(Environment):
    """An environment whose observations hold Tuples, seen as Dicts keyed by position
    (``item0``, ``item1``, ...: :mod:`api.spaces`), as a gymnasium one's are. The built-in
    policies read Dicts; an environment of one's own with a Tuple observation was refused,
    told to wrap it in a gymnasium wrapper that cannot take it."""

    def __init__(self, env: Environment):
        self.env = env
        self._spaces = [dict_of_tuples(s) for s in env.observation_spaces]

    def __getattr__(self, name: str) -> Any:  # the environment's own attributes, for hooks
        env = self.__dict__.get("env")
        if env is None:  # not built yet (a copy being made): no attribute to pass on
            raise AttributeError(name)
        return getattr(env, name)

    @property
    def agent_count(self) -> int:
        return self.env.agent_count

    @property
    def observation_spaces(self) -> list[gym.Space]:
        return list(self._spaces)

    @property
    def action_spaces(self) -> list[gym.Space]:
        return self.env.action_spaces

    def reset(self) -> list[StepResult | None]:
        return self._as_dicts(self.env.reset())

    def step(self, actions: list[Any]) -> list[StepResult | None]:
        return self._as_dicts(self.env.step(actions))

    def _as_dicts(self, results: Any) -> Any:
        if not isinstance(results, list):  # the actor's contract check says what is wrong
            return results
        return [
            r if not isinstance(r, StepResult) else replace(r, obs=from_positions(r.obs, space))
            for r, space in zip(results, self._spaces, strict=False)
        ]

    @property
    def frames_per_step(self) -> int:
        return self.env.frames_per_step

    def seed(self, seed: int) -> None:
        self.env.seed(seed)

    def set_curriculum_stage(self, stage: Any) -> None:
        self.env.set_curriculum_stage(stage)

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()


def target_out_of_horizon(
    env: str, args: dict[str, Any], target: float | None, where: str = "environment.args"
) -> str | None:
    """Why ``target`` may not fit episodes of ``args['max_episode_steps']`` (None: no reason
    known; ``where``: the key that set it). Gymnasium's ``reward_threshold`` is set for its id's
    own episode length:
    ``troupe run cartpole-ppo environment.args.max_episode_steps=100`` kept CartPole's 475,
    out of reach, and ran to its frame budget; on MountainCar a shorter episode meets -110
    without reaching the flag."""
    steps = args.get("max_episode_steps")
    if target is None or not isinstance(steps, int) or isinstance(steps, bool):
        return None
    try:
        spec = gym.spec(env)
    except gym.error.Error:  # not a gymnasium id
        return None
    if spec.reward_threshold is None or spec.max_episode_steps in (None, steps):
        return None
    if float(target) != float(spec.reward_threshold):
        return None
    return (
        f"stop.eval_return={target:g} is gymnasium's reward_threshold for {env}, set for "
        f"episodes of {spec.max_episode_steps} steps; with {where}.max_episode_steps="
        f"{steps} it may be out of reach, or too easy: give a target of its own "
        "(stop.eval_return=...), or None to run to the budget"
    )
