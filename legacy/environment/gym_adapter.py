"""Any gymnasium environment as a one-agent Troupe :class:`~api.environment.Environment`.

Gymnasium's ``step`` returns ``(obs, reward, terminated, truncated, info)``; the adapter maps
``terminated`` to ``done`` and keeps ``truncated`` separate, because the trainer bootstraps the
value past a time limit but not past a terminal state.

Gymnasium leaves stepping past the end of an episode undefined (some environments warn, some go
on silently). Troupe's contract is stricter: the adapter refuses to step a finished episode, so
an actor that forgets to reset fails loudly instead of training on garbage.

A ``Tuple`` observation space (Blackjack's ``(player sum, dealer card, usable ace)``) is seen as
a ``Dict`` keyed by position (``item0``, ``item1``, ...: :mod:`api.spaces`), which Troupe's
encoders, wire checks and NamedArrays know, and which loses nothing. A Dict or Tuple action
space of discrete and Box parts is acted in as one MultiDiscrete, Box or HybridBox, and each
action handed to the environment in its own shape (:mod:`legacy.environment.flat_actions`).
"""

from __future__ import annotations

import difflib
import inspect
import logging
import typing
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import load_env_creator

from api import registry, user_code
from api.config.arguments import describe, matches
from api.environment import Environment, StepResult, one_number
from api.errors import UserError
from api.spaces import dict_of_tuples, from_positions
from legacy.environment.flat_actions import flat_or_none

ENTRY_POINT = "legacy.environment.gym_adapter:GymnasiumEnvironment"


class GymnasiumEnvironment(Environment):
    """One gymnasium environment, seen as a Troupe environment with a single agent.

    ``gym_kwargs`` go to ``gymnasium.make`` unchanged (e.g. ``render_mode="rgb_array"``,
    ``max_episode_steps=100``).
    """

    render_kwargs: ClassVar[dict[str, Any]] = {"render_mode": "rgb_array"}
    """What makes it draw frames (``troupe eval --video``): a gymnasium env draws only when
    made to."""

    def __init__(self, gym_id: str, **gym_kwargs: Any):
        self.gym_id = gym_id
        self._env = _make_gym_env(gym_id, gym_kwargs)
        self._observation_space = dict_of_tuples(self._env.observation_space)
        self._keyed = self._observation_space is not self._env.observation_space
        """Whether observations are converted (only where a Tuple is in the space)."""
        self._flat = flat_or_none(self._env.action_space)
        """A Dict or Tuple action space flattened for the policy (:mod:`.flat_actions`)."""
        self._action_space = self._env.action_space if self._flat is None else self._flat.space
        self._next_seed: int | None = None
        self._episode_over = True  # nothing to step until the first reset

    @staticmethod
    def check_args(args: dict[str, Any]) -> list[str]:
        """Argument names that neither ``gymnasium.make`` nor the id's constructor takes.

        Called by the config check before any process starts, so that a misspelt
        ``max_episode_step`` is a config error and not a crash in every worker."""
        return check_gym_kwargs(
            args.get("gym_id", ""), {k: v for k, v in args.items() if k != "gym_id"}
        )

    @property
    def agent_count(self) -> int:
        return 1

    @property
    def observation_spaces(self) -> list[gym.Space]:
        return [self._observation_space]

    @property
    def action_spaces(self) -> list[gym.Space]:
        return [self._action_space]

    @property
    def frames_per_step(self) -> int:
        """An ALE id's ``frameskip`` (4 for ``ALE/Pong-v5``, 1 for a ``NoFrameskip`` one): the
        emulator frames a step covers. A random frame skip (a range) and any other id: 1."""
        spec = self._env.unwrapped.spec
        skip = spec.kwargs.get("frameskip") if spec is not None else None
        return skip if type(skip) is int and skip > 1 else 1

    @property
    def gym_env(self) -> gym.Env:
        """The wrapped gymnasium environment, for code that needs its own API."""
        return self._env

    def seed(self, seed: int) -> None:
        """Make the next ``reset`` start a reproducible episode; also seed action sampling."""
        self._next_seed = int(seed)
        self._env.action_space.seed(int(seed))
        if self._flat is not None:
            self._flat.space.seed(int(seed))

    def reset(self) -> list[StepResult | None]:
        # Gymnasium seeds through reset(seed=...); passing None afterwards continues the same
        # random stream, so only the first reset after seed() restarts it.
        result = self._env.reset(seed=self._next_seed)
        try:
            obs, info = result
            info = dict(info)
        except (TypeError, ValueError):
            raise self._old_api("reset()", result, 2) from None
        self._next_seed = None
        self._episode_over = False
        if self._keyed:
            obs = from_positions(obs, self._observation_space)
        return [StepResult(obs=obs, reward=0.0, done=False, truncated=False, info=info)]

    def step(self, actions: list[Any]) -> list[StepResult | None]:
        if len(actions) != 1:
            raise ValueError(
                f"{self.gym_id} has one agent, so step() takes a list of one action; "
                f"got {len(actions)} actions"
            )
        if self._episode_over:
            raise UserError(
                f"{self.gym_id}: step() called but no episode is running (it ended, or reset() "
                "was never called); call reset() to start a new episode"
            )
        action = self._fit(actions[0])
        if self._flat is not None:
            action = self._flat.unflatten(action)
        result = self._env.step(action)
        try:
            obs, reward, terminated, truncated, info = result
            info = dict(info)
        except (TypeError, ValueError):
            raise self._old_api("step()", result, 5) from None
        self._episode_over = bool(terminated or truncated)
        if self._keyed:
            obs = from_positions(obs, self._observation_space)
        return [
            StepResult(
                obs=obs,
                reward=one_number(reward),
                done=bool(terminated),
                truncated=bool(truncated),
                info=info,
            )
        ]

    def _old_api(self, call: str, result: Any, size: int) -> UserError:
        """What ``result`` of ``call``, which does not unpack as gymnasium's API has it (a
        checked tuple on every step cost 2-7% of the adapter's rate), says: an environment
        written for gym before 0.26 (``reset`` returning the observation alone, ``step`` a
        4-tuple) failed with "'numpy.float32' object is not iterable"."""
        got = f"a tuple of {len(result)}" if isinstance(result, tuple) else type(result).__name__
        return UserError(
            f"{self.gym_id}: {call} returned {got}, not gymnasium's "
            + ("(obs, info)" if size == 2 else "(obs, reward, terminated, truncated, info)")
            + " with info a dict. Gym before 0.26 had reset return obs alone and step "
            "(obs, reward, done, info): return (obs, info) from reset and (obs, reward, "
            "terminated, truncated, info) from step"
        )

    def _fit(self, action: Any) -> Any:
        """Clip continuous actions into the box: Gaussian policies sample past the bounds (and
        train on the unclipped sample), and not every environment clips for itself."""
        space = self._action_space
        if isinstance(space, gym.spaces.Box):
            return np.clip(np.asarray(action, dtype=space.dtype), space.low, space.high)
        return action

    def render(self) -> Any:
        """A frame when the env was made with ``render_mode="rgb_array"``, otherwise None."""
        if self._env.render_mode is None:
            return None
        return self._env.render()

    def close(self) -> None:
        self._env.close()


IMAGE_HINT = (
    "a worker image gets it with troupe image build --pip PACKAGE; MuJoCo and Box2D tasks "
    "with --extras mujoco or --extras box2d"
)


def _make_gym_env(gym_id: str, gym_kwargs: dict[str, Any]) -> gym.Env:
    """``gymnasium.make`` with errors that say which id failed and what to install."""
    _quiet_mujoco(gym_id)
    try:
        return gym.make(gym_id, **gym_kwargs)
    except (gym.error.DependencyNotInstalled, ImportError) as e:  # jax, shimmy, mujoco-py, ...
        raise UserError(
            f"gymnasium environment '{gym_id}' needs a package that is not installed: {e} "
            f"({IMAGE_HINT})"
        ) from e
    except gym.error.Error as e:
        raise UserError(f"gymnasium could not make '{gym_id}': {e}") from e


def is_mujoco(gym_id: str) -> bool:
    """Whether ``gym_id`` is one of gymnasium's MuJoCo tasks (its entry point says so)."""
    try:
        entry = gym.spec(gym_id).entry_point
    except Exception:  # not a gymnasium id (a Troupe environment, a PettingZoo name, a typo)
        return False
    return isinstance(entry, str) and entry.startswith("gymnasium.envs.mujoco")


def _quiet_mujoco(gym_id: str) -> None:
    """Send MuJoCo's warnings to this process's debug log (``troupe -v`` shows them) instead
    of the console and a ``MUJOCO_LOG.TXT`` in the working directory, MuJoCo's default. MuJoCo
    4 warned on loads of gymnasium's Hopper model (a deprecated attribute in its XML): a line
    per environment per process that reads like Troupe's own error, and a file left in the
    user's checkout. At INFO, HalfCheetah's ("'settotalmass' is deprecated") still reached the
    console of ``troupe train`` and ``test-env``: nothing a user of gymnasium's model can act
    on."""
    if not is_mujoco(gym_id):
        return
    try:
        import mujoco
    except ImportError:  # gymnasium's make says what to install
        return
    log = logging.getLogger("mujoco")
    mujoco.set_mju_user_warning(lambda message: log.debug("MuJoCo: %s", message))


MAKE_ARGUMENTS: dict[str, Any] = {"max_episode_steps": int | None, "disable_env_checker": bool}
"""What ``gymnasium.make`` itself takes besides the id, with its type; the rest goes to the
constructor."""


def check_gym_kwargs(gym_id: str, gym_kwargs: dict[str, Any]) -> list[str]:
    """``"key: problem"`` for every argument the environment would reject, without making it."""
    if not gym_kwargs:
        return []
    try:
        spec = gym.spec(gym_id)
        creator = spec.entry_point
        if isinstance(creator, str):
            creator = load_env_creator(creator)
        params = inspect.signature(creator).parameters
    except (gym.error.Error, ImportError, AttributeError, TypeError, ValueError):
        return []  # the id itself is reported when an environment is made; not our question here
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return []
    names = [*MAKE_ARGUMENTS, *params]
    hints = {**_hints(creator), **MAKE_ARGUMENTS}
    errors = []
    for key, value in gym_kwargs.items():
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
            hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(names)}"
            errors.append(f"{key}: unknown key for '{gym_id}'; {hint}")
        elif key in hints and not matches(hints[key], value):  # `max_episode_steps=ten` failed
            errors.append(  # in every worker, after the run had started
                f"{key}: expected {describe(hints[key])}, got {type(value).__name__} {value!r}"
            )
        elif key == "max_episode_steps" and value is not None and value < 1:
            errors.append(f"{key}: must be at least 1, got {value}")
    return errors


def _hints(creator: Any) -> dict[str, Any]:
    """The constructor's resolved annotations (none where they cannot be resolved)."""
    try:
        return typing.get_type_hints(creator.__init__ if inspect.isclass(creator) else creator)
    except Exception:  # an annotation naming what this Python lacks: judge nothing of it
        return {}


def register_gymnasium_ids() -> None:
    """Register every gymnasium id (and ALE's Atari ids when ``ale_py`` is installed).

    Ids that are already registered (e.g. a user's own environment of the same name) are kept:
    an explicit registration wins over the blanket adapter one. They count as a plugin's, never
    as the user's, whenever this is called (see :func:`api.registry.registering_as_plugin`).
    """
    add_ale_ids_to_gymnasium()
    with registry.registering_as_plugin():
        for gym_id in sorted(gym.registry):
            if registry.environments.registered(gym_id):
                continue
            _register(gym_id)


def _register(gym_id: str) -> registry.Spec:
    """The adapter's spec for ``gym_id``; where a script or a package of the user's
    registered it with gymnasium, that code is imported first in a process that builds it (a
    run's workers get the spec with the run's config)."""
    requires = _registered_by(gym_id)
    return registry.register_environment(
        gym_id, ENTRY_POINT, gym_id=gym_id, requires=requires,
        description="gymnasium (your code)" if requires else "gymnasium",
    )  # fmt: skip


def _registered_by(gym_id: str) -> tuple[str, ...]:
    """The file or package whose import registers ``gym_id`` with gymnasium, where a fresh
    process does not know it (gymnasium's and ALE's ids it knows); ``user_code.INTERACTIVE``
    for a notebook's, which a run refuses before it starts."""
    entry = gym.spec(gym_id).entry_point
    module = getattr(entry, "__module__", None) if callable(entry) else str(entry).split(":")[0]
    if not module or module.partition(".")[0] in _KNOWN_EVERYWHERE:
        return ()
    return (user_code.origin_of(module),)


_KNOWN_EVERYWHERE = ("gymnasium", "ale_py")
"""Packages whose gymnasium ids every process registers (gymnasium itself; ALE's, added by
:func:`add_ale_ids_to_gymnasium`)."""


def late_gymnasium_id(name: str) -> registry.Spec | None:
    """The adapter's spec for a gymnasium id registered with gymnasium after
    :func:`register_gymnasium_ids` ran (``gym.register`` in a user's file, imported once the
    registry was first asked), else None."""
    if not isinstance(name, str) or name not in gym.registry:
        return None
    with registry.registering_as_plugin():
        return _register(name)


def add_ale_ids_to_gymnasium() -> None:
    """ALE registers its Atari ids only when told to; do so if the package is present."""
    try:
        import ale_py
    except ImportError:
        return
    quiet_ale(ale_py)
    gym.register_envs(ale_py)


def quiet_ale(ale_py) -> None:
    """ALE's warnings and errors only: its banner ("A.L.E: Arcade Learning Environment ...",
    "[Powered by Stella]") went to the console from every process that made a game, an actor's,
    the policy worker's and the trainer's probe of the spaces alike, through the live panel."""
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Warning)
