"""Checks to run before a long experiment: does an environment keep the Environment contract?

``test_environment`` builds an environment (by registered name, Spec, or an instance you pass),
drives it through reset, random steps, episode ends and a seeded replay, and raises
:class:`~api.errors.EnvironmentCheckError` on the first broken rule, with a message that names the
agent, the field, what was expected and what came back. Use it in your own tests::

    from api import testing

    def test_my_env():
        testing.test_environment("my-env", steps=500)

(``test_environment`` is marked ``__test__ = False`` so pytest does not collect it as a test when
you import the name itself into a test module.)

Longer than 400 lines because one check per rule of the Environment contract, each with its own
precise message; they share the driving loop and the report, and read best side by side.
"""

from __future__ import annotations

import contextlib
import copy
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from api.environment import Environment, StepResult, frames_per_step, make
from api.errors import EnvironmentCheckError, UserError
from api.namedarray import is_field_name
from api.registry import Spec
from api.spaces import HybridBox

# ===================================================================== test_environment


@dataclass
class EnvironmentReport:
    """What ``test_environment`` saw; ``str(report)`` is a short human summary."""

    name: str
    """The registered name, or the class name of an instance that was passed in."""
    agent_count: int
    """Number of agents the environment declares."""
    observation_spaces: list[str]
    """Each agent's observation space, as text."""
    action_spaces: list[str]
    """Each agent's action space, as text."""
    stepped: bool = True
    """False when only ``reset`` was checked (``test_stepping=False``)."""
    steps: int = 0
    """Steps taken with random actions (the replay for the determinism check not counted)."""
    episodes: int = 0
    """Episodes that ended (every agent done or truncated) within those steps."""
    episode_returns: list[list[float]] = field(default_factory=list)
    """Per finished episode, the summed reward of each agent."""
    seed: int = 0
    """The seed given to ``seed()`` for the run and its replay."""
    determinism_steps: int = 0
    """Steps (after one reset) that a seeded replay reproduced exactly."""
    notes: list[str] = field(default_factory=list)
    """Checks that could not run, and why."""
    frames_per_step: int = 1
    """Emulator frames a step (``Environment.frames_per_step``; Atari's frame skip)."""

    def mean_returns(self) -> list[float]:
        """Mean episode return of each agent over the finished episodes (empty if none)."""
        if not self.episode_returns:
            return []
        return [float(np.mean(r)) for r in zip(*self.episode_returns)]

    def __str__(self) -> str:
        rows = [("agents", str(self.agent_count))]
        rows += _space_rows("observation space", self.observation_spaces)
        rows += _space_rows("action space", self.action_spaces)
        if self.frames_per_step != 1:  # what the run's metrics count as emulator frames
            rows.append(("frames per step", f"{self.frames_per_step} (emulator frames)"))
        if self.stepped:
            rows.append(("steps run", str(self.steps)))
            rows.append(("episodes finished", str(self.episodes)))
            means = self.mean_returns()
            if means:
                rows.append(
                    ("mean return", ", ".join(f"agent {i}: {m:.3g}" for i, m in enumerate(means)))
                )
            rows.append(
                (
                    "deterministic",
                    f"reset and {_count(self.determinism_steps, 'step')} replayed under seed "
                    f"{self.seed}",
                )
            )
        else:
            rows.append(("stepping", "not checked (test_stepping=False); reset replayed"))
        width = max(len(k) for k, _ in rows)
        lines = [f"{self.name}: passed"] + [f"  {k:<{width}}  {v}" for k, v in rows]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _space_rows(label: str, spaces: list[str]) -> list[tuple[str, str]]:
    if len(set(spaces)) == 1:
        return [(label, spaces[0])]
    return [(f"{label} {i}", s) for i, s in enumerate(spaces)]


def _space_text(space: gym.Space) -> str:
    """A compact description: Box bounds that differ per element are left out."""
    if isinstance(space, gym.spaces.Dict):
        inner = ", ".join(f"{k}: {_space_text(v)}" for k, v in space.spaces.items())
        return f"Dict({inner})"
    if isinstance(space, HybridBox):  # its bounds differ by nature: say what the entries are
        return repr(space)
    if isinstance(space, gym.spaces.Box) and not (
        np.all(space.low == space.low.flat[0]) and np.all(space.high == space.high.flat[0])
    ):
        return f"Box(shape={space.shape}, dtype={space.dtype})"
    return str(space)


def test_environment(
    name_or_spec_or_instance: str | Spec | Environment,
    test_stepping: bool = True,
    steps: int = 200,
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
) -> EnvironmentReport:
    """Check that an environment keeps the Environment contract; return a report or raise.

    A name or Spec is built with ``api.environment.make(name, **env_kwargs)`` and closed at the
    end; an instance is used as given and left open. Every failure raises
    ``EnvironmentCheckError`` (``agent`` and ``field`` set where the problem is tied to them).
    An exception raised by the environment's own methods is re-raised as one naming the method.

    Checked, in order:

    * ``agent_count`` is a positive int, and ``observation_spaces`` / ``action_spaces`` are lists
      of that many gymnasium spaces; an observation Dict's keys are Python identifiers not
      starting with ``_`` (they name the fields of the observations sent to policy workers);
      ``frames_per_step``, if the environment has it, is a whole number of 1 or more.
    * ``seed(seed)`` then ``reset()``: a list of one ``StepResult`` or ``None`` per agent, at
      least one not None, none done or truncated.
    * Every result (after reset and after each step): ``obs`` lies in the agent's observation
      space (array type, shape and dtype checked separately; a Dict space's keys must match the
      obs dict's keys), ``reward`` is one finite number (a Python or numpy scalar, or an array of
      shape ``()`` or ``(1,)``), ``done`` and ``truncated`` are bools, ``info`` is a dict.
    * With ``test_stepping``: ``steps`` steps with random actions sampled from the action spaces;
      an agent gets ``None`` when its last result was ``None`` or when it is out of the episode
      (done or truncated). An agent out of the episode must not get a not-done result again.
      The episode ends when every agent has been done or truncated; then ``reset`` is called.
    * Stepping after the end: the first time an episode ends, ``step`` is called once more
      WITHOUT ``reset``. The environment must refuse (raise any exception) or keep returning
      done/truncated results; a fresh, not-done result fails the check.
    * Determinism: ``seed(seed)``, ``reset()`` and the actions of the first episode (up to
      ``steps`` steps) are replayed; observations, rewards, done and truncated must be identical.

    With ``test_stepping=False`` only reset (its results and its determinism) is checked: use it
    for environments whose action spaces cannot sample.
    """
    env, name, owned = _build_environment(name_or_spec_or_instance, env_kwargs)
    try:
        report = _check_environment(env, name, test_stepping, steps, seed)
    except BaseException:
        if owned:
            _close_quietly(env)
        raise
    if owned:
        _call(env, "close", where="close()")
    return report


test_environment.__test__ = False  # a "test_" function imported into a test module is not a test


def _build_environment(
    target: Any, env_kwargs: dict[str, Any] | None
) -> tuple[Environment, str, bool]:
    """The environment to check, its display name, and whether we built (and so close) it."""
    if isinstance(target, Environment):
        if env_kwargs:
            raise UserError(
                "env_kwargs apply only when test_environment builds the environment from a name "
                "or Spec; pass the arguments to your constructor instead"
            )
        return target, type(target).__name__, False
    if not isinstance(target, (str, Spec)):
        raise UserError(
            f"test_environment takes a registered name, a Spec or an api.environment.Environment "
            f"instance, got a {type(target).__name__}; a gymnasium env is checked by its id, "
            "e.g. test_environment('CartPole-v1')"
        )
    name = target if isinstance(target, str) else target.name
    try:
        return make(target, **(env_kwargs or {})), name, True
    except UserError:
        raise  # unknown names and bad arguments already say what to do
    except Exception as e:
        raise EnvironmentCheckError(
            f"building environment '{name}' raised {type(e).__name__}: {e}"
        ) from e


def _check_environment(
    env: Environment, name: str, test_stepping: bool, steps: int, seed: int
) -> EnvironmentReport:
    agent_count = _check_agent_count(env)
    obs_spaces = _check_spaces(env, "observation_spaces", agent_count)
    act_spaces = _check_spaces(env, "action_spaces", agent_count)
    report = EnvironmentReport(
        name,
        agent_count,
        [_space_text(s) for s in obs_spaces],
        [_space_text(s) for s in act_spaces],
        stepped=test_stepping,
        seed=seed,
        frames_per_step=_check_frames_per_step(env),
    )
    if not test_stepping:
        _check_reset_determinism(env, obs_spaces, seed)
        return report
    trace = _run_episodes(env, obs_spaces, act_spaces, steps, seed, report)
    _check_determinism(env, obs_spaces, seed, trace)
    report.determinism_steps = len(trace.actions)
    if report.episodes == 0:
        report.notes.append(
            f"no episode ended within {steps} steps, so stepping after the end and reset after "
            "it were not checked; pass a larger steps= to check them"
        )
    return report


# --------------------------------------------------------------------- calling the environment
def _call(env: Environment, method: str, *args: Any, where: str) -> Any:
    """Call ``env.method(*args)``; an exception becomes a check error naming the method."""
    try:
        return getattr(env, method)(*args)
    except EnvironmentCheckError:
        raise
    except Exception as e:
        raise EnvironmentCheckError(
            f"{where}: {type(env).__name__}.{method}() raised {type(e).__name__}: {e}"
        ) from e


def _get(env: Environment, attribute: str) -> Any:
    try:
        return getattr(env, attribute)
    except Exception as e:
        raise EnvironmentCheckError(
            f"reading {type(env).__name__}.{attribute} raised {type(e).__name__}: {e}",
            field=attribute,
        ) from e


def _close_quietly(env: Environment) -> None:
    """Close after a failure without hiding the failure behind an error from close()."""
    # The original check error is what the user needs to see, not one from close().
    with contextlib.suppress(Exception):
        env.close()


def _reset(env: Environment, obs_spaces: list[gym.Space], where: str = "reset()") -> list:
    results = _call(env, "reset", where=where)
    _check_results(results, obs_spaces, where)
    _check_reset_results(results, where)
    return results


def _step(env: Environment, actions: list[Any], obs_spaces: list[gym.Space], where: str) -> list:
    results = _call(env, "step", actions, where=where)
    _check_results(results, obs_spaces, where)
    return results


def _seed(env: Environment, act_spaces: list[gym.Space], seed: int) -> None:
    """Seed the environment, and the action spaces we sample from, so a run is reproducible."""
    _call(env, "seed", seed, where=f"seed({seed})")
    for i, space in enumerate(act_spaces):
        space.seed(seed + i)


# --------------------------------------------------------------------- structure and spaces
def declared_spaces(env: Environment, name: str) -> tuple[list[gym.Space], list[gym.Space]]:
    """The observation and action spaces of ``env`` (registered as ``name``), one of each per
    agent, checked as :func:`test_environment` checks them: what a run reads before anything
    else, so a count that disagrees is named here rather than met as an index error later."""
    try:
        count = _check_agent_count(env)
        observation = _check_spaces(env, "observation_spaces", count)
        return observation, _check_spaces(env, "action_spaces", count)
    except EnvironmentCheckError as e:
        raise EnvironmentCheckError(
            f"environment '{name}': {e} (troupe test-env checks the whole contract)"
        ) from e


def _check_agent_count(env: Environment) -> int:
    count = _get(env, "agent_count")
    if isinstance(count, (bool, np.bool_)) or not isinstance(count, (int, np.integer)):
        raise EnvironmentCheckError(
            f"agent_count must be a positive int, got {type(count).__name__} {count!r}",
            field="agent_count",
        )
    if count < 1:
        raise EnvironmentCheckError(
            f"agent_count must be a positive int, got {count}", field="agent_count"
        )
    return int(count)


def _check_frames_per_step(env: Environment) -> int:
    try:
        return frames_per_step(env)
    except ValueError as e:
        raise EnvironmentCheckError(str(e), field="frames_per_step") from None


def _check_spaces(env: Environment, attribute: str, agent_count: int) -> list[gym.Space]:
    spaces = _get(env, attribute)
    if not isinstance(spaces, (list, tuple)):
        raise EnvironmentCheckError(
            f"{attribute} must be a list with one gymnasium space per agent, got "
            f"{type(spaces).__name__}",
            field=attribute,
        )
    if len(spaces) != agent_count:
        raise EnvironmentCheckError(
            f"{attribute} has {len(spaces)} spaces but agent_count is {agent_count}; declare "
            "one space per agent",
            field=attribute,
        )
    for agent, space in enumerate(spaces):
        if not isinstance(space, gym.Space):
            raise EnvironmentCheckError(
                f"{attribute}[{agent}] is a {type(space).__name__}, expected a gymnasium.Space",
                agent=agent,
                field=attribute,
            )
        if attribute == "observation_spaces":
            _check_keys(space, agent)
    return list(spaces)


def _check_keys(space: gym.Space, agent: int, where: str = "obs") -> None:
    """A Dict space's keys become the fields of the observations' NamedArrays, which the wire
    refuses under any other name: a key such as ``"agent-pos"`` or ``"0"`` would leave every
    policy worker dropping the actors' requests, and the run waiting for frames."""
    if isinstance(space, gym.spaces.Dict):
        for key, sub in space.spaces.items():
            if not is_field_name(key):
                raise EnvironmentCheckError(
                    f"observation_spaces[{agent}] is a Dict with the key {key!r} (in {where}), "
                    "which cannot name a field of the observations sent to policy workers: use "
                    "a Python identifier that does not start with '_' (e.g. 'agent_pos')",
                    agent=agent,
                    field=where,
                )
            _check_keys(sub, agent, f"{where}.{key}")
    elif isinstance(space, gym.spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            _check_keys(sub, agent, f"{where}[{i}]")


# --------------------------------------------------------------------- one call's results
def _check_results(results: Any, obs_spaces: list[gym.Space], where: str) -> None:
    if not isinstance(results, (list, tuple)):
        raise EnvironmentCheckError(
            f"{where} returned a {type(results).__name__}, expected a list with one StepResult "
            "(or None) per agent",
            field="results",
        )
    if len(results) != len(obs_spaces):
        raise EnvironmentCheckError(
            f"{where} returned {len(results)} results but agent_count is {len(obs_spaces)}; "
            "return exactly one entry per agent (None for an agent that does not act)",
            field="results",
        )
    for agent, result in enumerate(results):
        if result is None:
            continue
        if not isinstance(result, StepResult):
            raise EnvironmentCheckError(
                f"{where} returned a {type(result).__name__}, expected an "
                "api.environment.StepResult or None",
                agent=agent,
            )
        _check_result(result, obs_spaces[agent], agent, where)


def _check_reset_results(results: list, where: str) -> None:
    if all(r is None for r in results):
        raise EnvironmentCheckError(
            f"{where} returned None for every agent; at least one agent must get a first "
            "observation",
            field="results",
        )
    for agent, result in enumerate(results):
        for name in ("done", "truncated"):
            if result is not None and getattr(result, name):
                raise EnvironmentCheckError(
                    f"{where} returned {name}=True: a new episode cannot start finished",
                    agent=agent,
                    field=name,
                )


def _check_result(result: StepResult, space: gym.Space, agent: int, where: str) -> None:
    _check_obs(result.obs, space, agent, where, "obs")
    _reward_value(result.reward, agent, where)
    for name in ("done", "truncated"):
        value = getattr(result, name)
        if not isinstance(value, (bool, np.bool_)):
            raise EnvironmentCheckError(
                f"{where}: {name} must be a bool (Python or numpy), got "
                f"{type(value).__name__} {value!r}",
                agent=agent,
                field=name,
            )
    if not isinstance(result.info, dict):
        raise EnvironmentCheckError(
            f"{where}: info must be a dict, got {type(result.info).__name__}",
            agent=agent,
            field="info",
        )


def reward_problem(reward: Any) -> str | None:
    """What makes ``reward`` not one number (None: it is one, finite or not). An actor asks
    this of every reward that is not a plain float: a vector reward was cut to its first
    element, and the run trained on that without a word."""
    number = isinstance(reward, numbers.Real) or (
        isinstance(reward, np.ndarray)
        and reward.shape in ((), (1,))
        and np.issubdtype(reward.dtype, np.number)
        and not np.issubdtype(reward.dtype, np.complexfloating)
    )
    if number and not isinstance(reward, (bool, np.bool_)):
        return None
    vector = isinstance(reward, (np.ndarray, list, tuple)) and np.size(reward) > 1
    hint = "; make a vector reward one number in the environment (a weighted sum)" if vector else ""
    return (
        "reward must be one number (a Python or numpy scalar, or an array of shape () or "
        f"(1,)), got {_describe(reward)}{hint}"
    )


def _reward_value(reward: Any, agent: int, where: str) -> float:
    """The reward as a float; a check error unless it is one finite number."""
    problem = reward_problem(reward)
    if problem is not None:
        raise EnvironmentCheckError(f"{where}: {problem}", agent=agent, field="reward")
    value = float(reward) if isinstance(reward, numbers.Real) else float(reward.reshape(()))
    if not math.isfinite(value):
        raise EnvironmentCheckError(
            f"{where}: reward is {value}; rewards must be finite numbers",
            agent=agent,
            field="reward",
        )
    return value


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape} and dtype {value.dtype}"
    return f"{type(value).__name__} {value!r}"


# --------------------------------------------------------------------- observations
def _check_obs(value: Any, space: gym.Space, agent: int, where: str, path: str) -> None:
    if isinstance(space, gym.spaces.Dict):
        _check_dict_obs(value, space, agent, where, path)
    elif isinstance(space, gym.spaces.Tuple):
        _check_tuple_obs(value, space, agent, where, path)
    elif isinstance(space, (gym.spaces.Box, gym.spaces.MultiBinary, gym.spaces.MultiDiscrete)):
        _check_array_obs(value, space, agent, where, path)
    elif not space.contains(value):
        raise EnvironmentCheckError(
            f"{where}: {path} = {_describe(value)} is not in observation_spaces[{agent}] = {space}",
            agent=agent,
            field=path,
        )


def _check_dict_obs(value: Any, space: gym.spaces.Dict, agent: int, where: str, path: str) -> None:
    if not isinstance(value, Mapping):
        raise EnvironmentCheckError(
            f"{where}: {path} is a {type(value).__name__}, but observation_spaces[{agent}] is a "
            f"Dict space; return a dict with keys {sorted(space.spaces)}",
            agent=agent,
            field=path,
        )
    missing = sorted(set(space.spaces) - set(value))
    extra = sorted(set(value) - set(space.spaces))
    if missing or extra:
        raise EnvironmentCheckError(
            f"{where}: {path} has keys {sorted(value)}, but the Dict space declares "
            f"{sorted(space.spaces)} (missing: {missing}, undeclared: {extra})",
            agent=agent,
            field=path,
        )
    for key, sub in space.spaces.items():
        _check_obs(value[key], sub, agent, where, f"{path}.{key}")


def _check_tuple_obs(
    value: Any, space: gym.spaces.Tuple, agent: int, where: str, path: str
) -> None:
    if not isinstance(value, (tuple, list)) or len(value) != len(space.spaces):
        raise EnvironmentCheckError(
            f"{where}: {path} must be a tuple of {len(space.spaces)} entries for a Tuple space, "
            f"got {_describe(value)}",
            agent=agent,
            field=path,
        )
    for i, (item, sub) in enumerate(zip(value, space.spaces)):
        _check_obs(item, sub, agent, where, f"{path}[{i}]")


def _check_array_obs(value: Any, space: gym.Space, agent: int, where: str, path: str) -> None:
    declared = f"observation_spaces[{agent}]"
    if not isinstance(value, np.ndarray):
        raise EnvironmentCheckError(
            f"{where}: {path} is a {type(value).__name__}, expected a numpy array of shape "
            f"{space.shape} and dtype {space.dtype}; return "
            f"np.asarray(obs, dtype=np.{space.dtype})",
            agent=agent,
            field=path,
        )
    if value.shape != space.shape:
        raise EnvironmentCheckError(
            f"{where}: {path} has shape {value.shape}, expected {space.shape} as declared by "
            f"{declared}; return arrays of the declared shape or fix the space",
            agent=agent,
            field=path,
        )
    if value.dtype != space.dtype:
        raise EnvironmentCheckError(
            f"{where}: {path} has dtype {value.dtype}, expected {space.dtype} as declared by "
            f"{declared}; cast with .astype(np.{space.dtype}) or declare the space with "
            f"dtype=np.{value.dtype}",
            agent=agent,
            field=path,
        )
    if not space.contains(value):
        raise EnvironmentCheckError(
            f"{where}: {path} lies outside {declared} = {space}: {_outside(value, space)}",
            agent=agent,
            field=path,
        )


def _outside(value: np.ndarray, space: gym.Space) -> str:
    """Which values break the space's bounds, in words."""
    if np.issubdtype(value.dtype, np.floating) and np.isnan(value).any():
        return "it contains NaN"
    if isinstance(space, gym.spaces.Box):
        return (
            f"values range from {value.min()} to {value.max()}, bounds are low={space.low.min()} "
            f"high={space.high.max()}"
        )
    if isinstance(space, gym.spaces.MultiBinary):
        return f"values other than 0 and 1: {np.unique(value[(value != 0) & (value != 1)])}"
    return f"values {np.array2string(value, threshold=8)}"


# --------------------------------------------------------------------- stepping
class _Episode:
    """Per-agent bookkeeping of one episode: returns, who acts next, who is out."""

    def __init__(self, agent_count: int):
        self.returns = [0.0] * agent_count
        self.acting = [False] * agent_count
        self.finished = [False] * agent_count

    def observe(self, results: list, where: str) -> None:
        for agent, result in enumerate(results):
            self.acting[agent] = result is not None and not (result.done or result.truncated)
            if result is None:
                continue
            if self.finished[agent] and self.acting[agent]:
                raise EnvironmentCheckError(
                    f"{where} returned a result with done=False and truncated=False for an agent "
                    "that was already done or truncated in this episode; return None (or keep "
                    "done=True) for agents that are out of the episode",
                    agent=agent,
                    field="done",
                )
            self.returns[agent] += _reward_value(result.reward, agent, where)
            if result.done or result.truncated:
                self.finished[agent] = True

    @property
    def over(self) -> bool:
        return all(self.finished)


@dataclass
class _Trace:
    """The first episode of a seeded run: the snapshots after reset and each step, the actions."""

    results: list[list[Any]] = field(default_factory=list)
    actions: list[list[Any]] = field(default_factory=list)


def _sample_actions(act_spaces: list[gym.Space], acting: list[bool]) -> list[Any]:
    actions = []
    for agent, space in enumerate(act_spaces):
        if not acting[agent]:
            actions.append(None)
            continue
        try:
            actions.append(space.sample())
        except Exception as e:
            raise EnvironmentCheckError(
                f"cannot sample a random action from action_spaces[{agent}] = {space} "
                f"({type(e).__name__}: {e}); pass test_stepping=False to check reset() only",
                agent=agent,
                field="action_spaces",
            ) from e
    return actions


def _run_episodes(
    env: Environment,
    obs_spaces: list[gym.Space],
    act_spaces: list[gym.Space],
    steps: int,
    seed: int,
    report: EnvironmentReport,
) -> _Trace:
    """Step with random actions, resetting at each episode end; record the first episode."""
    _seed(env, act_spaces, seed)
    results = _reset(env, obs_spaces)
    episode = _Episode(len(obs_spaces))
    episode.observe(results, "reset()")
    trace = _Trace(results=[_snapshot(results)])
    recording = True
    for t in range(1, steps + 1):
        actions = _sample_actions(act_spaces, episode.acting)
        where = f"step {t}"
        results = _step(env, actions, obs_spaces, where)
        episode.observe(results, where)
        report.steps = t
        if recording:
            trace.actions.append(copy.deepcopy(actions))
            trace.results.append(_snapshot(results))
        if not episode.over:
            continue
        recording = False
        report.episodes += 1
        report.episode_returns.append(episode.returns)
        if report.episodes == 1:
            _check_no_step_after_end(env, act_spaces, t)
        results = _reset(env, obs_spaces, f"reset() after the episode ended at step {t}")
        episode = _Episode(len(obs_spaces))
        episode.observe(results, "reset()")
    return trace


def _check_no_step_after_end(env: Environment, act_spaces: list[gym.Space], t: int) -> None:
    """Step once more without reset: the env must raise, or answer done/truncated only."""
    actions = _sample_actions(act_spaces, [True] * len(act_spaces))
    try:
        results = env.step(actions)
    except Exception:
        return  # refusing to step a finished episode is the correct answer
    for agent, result in enumerate(results if isinstance(results, (list, tuple)) else []):
        if isinstance(result, StepResult) and not (result.done or result.truncated):
            raise EnvironmentCheckError(
                f"step() called after the episode ended at step {t}, without reset(), returned a "
                "fresh result (done=False, truncated=False); the environment must refuse to step "
                "after the episode ended (raise an exception) and require reset(), or keep "
                "returning done/truncated results",
                agent=agent,
                field="done",
            )


# --------------------------------------------------------------------- determinism
def _snapshot(results: list) -> list[Any]:
    """Copies of what the determinism check compares, safe from later in-place changes."""
    return [
        None
        if r is None
        else (copy.deepcopy(r.obs), _plain_reward(r.reward), bool(r.done), bool(r.truncated))
        for r in results
    ]


def _plain_reward(reward: Any) -> float:
    return float(np.asarray(reward).reshape(()))


def _check_reset_determinism(env: Environment, obs_spaces: list[gym.Space], seed: int) -> None:
    _seed(env, [], seed)
    first = _snapshot(_reset(env, obs_spaces))
    _seed(env, [], seed)
    second = _snapshot(_reset(env, obs_spaces, "reset() (seeded replay)"))
    _compare(first, second, "reset()", seed)


def _check_determinism(
    env: Environment, obs_spaces: list[gym.Space], seed: int, trace: _Trace
) -> None:
    """Replay the recorded first episode under the same seed; every snapshot must match."""
    _seed(env, [], seed)
    replay = _snapshot(_reset(env, obs_spaces, "reset() (seeded replay)"))
    _compare(trace.results[0], replay, "reset()", seed)
    for t, actions in enumerate(trace.actions, start=1):
        results = _step(env, copy.deepcopy(actions), obs_spaces, f"step {t} (seeded replay)")
        _compare(trace.results[t], _snapshot(results), f"step {t}", seed)


def _compare(first: list, second: list, where: str, seed: int) -> None:
    for agent, (a, b) in enumerate(zip(first, second)):
        if (a is None) != (b is None):
            _not_deterministic(where, seed, agent, "result", _none_or(a), _none_or(b))
        if a is None:
            continue
        path = _first_difference(a[0], b[0], "obs")
        if path is not None:
            _not_deterministic(where, seed, agent, path, _leaf(a[0], path), _leaf(b[0], path))
        for index, name in ((1, "reward"), (2, "done"), (3, "truncated")):
            if a[index] != b[index]:
                _not_deterministic(where, seed, agent, name, a[index], b[index])


def _none_or(value: Any) -> str:
    return "None" if value is None else "a StepResult"


def _first_difference(a: Any, b: Any, path: str) -> str | None:
    """The dotted path of the first obs leaf that differs, or None when equal."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if set(a) != set(b):
            return path
        for key in a:
            found = _first_difference(a[key], b[key], f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            found = _first_difference(x, y, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    try:
        same = np.array_equal(np.asarray(a), np.asarray(b))
    except Exception:  # values numpy cannot compare count as different
        same = False
    return None if same else path


def _leaf(obs: Any, path: str) -> str:
    value = obs
    for part in path.split(".")[1:]:
        value = value[part] if isinstance(value, Mapping) else value
    if isinstance(value, np.ndarray):
        return np.array2string(value, threshold=8, precision=4)
    return repr(value)


def _not_deterministic(where: str, seed: int, agent: int, name: str, a: Any, b: Any) -> None:
    raise EnvironmentCheckError(
        f"not deterministic: {where} gave a different {name} in a replay with the same seed "
        f"({seed}) and actions (first run: {a}, replay: {b}); seed() must seed every random "
        "generator the environment uses, so the same seed and actions replay the same episode",
        agent=agent,
        field=name,
    )
