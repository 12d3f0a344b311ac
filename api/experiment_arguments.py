"""A registered experiment's own arguments given as overrides (``troupe train ENV frames=2e5
target=-200``, ``troupe run ppo env=Acrobot-v1``): taken out of the config overrides for the
experiment's function, and checked, since a function's arithmetic makes poor error messages and
a misspelt argument is no config key either."""

from __future__ import annotations

import difflib
import inspect
from typing import Any

from api import registry
from api.config import ExperimentConfig, parse_value
from api.errors import ConfigError


def parameters(spec: registry.Spec) -> list[str]:
    """The names the experiment's function takes (none where its signature cannot be read)."""
    return signature_parameters(spec.load())


def signature_parameters(function: Any) -> list[str]:
    """The names ``function`` takes by keyword (none where its signature cannot be read)."""
    try:
        found = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return []
    by_keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in found if p.kind in by_keyword]


def split(overrides: list[str], params: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The function's arguments among ``overrides`` (a config key of the same name stays an
    override), and the overrides left. ``target=None`` is ``stop.eval_return=None``: the
    function took its None for "not given" and kept gymnasium's target, so ``troupe train
    CartPole-v1 target=None`` still stopped at 475."""
    taken: dict[str, Any] = {}
    rest = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if sep and key.strip() in params and key.strip() not in ExperimentConfig.__annotations__:
            value = _whole(parse_value(raw.strip()))
            if key.strip() == "target" and value is None:
                rest.append("stop.eval_return=None")
            else:
                taken[key.strip()] = value
        else:
            rest.append(item)
    if "env_args" in params:
        _take_env_args(overrides, taken)
    return taken, rest


ENV_ARGS = "environment.args"


def _take_env_args(overrides: list[str], taken: dict[str, Any]) -> None:
    """``environment.args...`` overrides, also given to an experiment that sets itself up from
    the environment (``env_args``): built from the environment's defaults and overridden after,
    ``troupe train GridGather-v0 environment.args.n_agents=3`` planned policies for 2 agents
    and failed in its workers, and dqn refused a Box environment for its default's actions.
    The overrides still apply after (a recipe's own argument changed by one stays changed)."""
    for item in overrides:
        key, sep, raw = (part.strip() for part in item.partition("="))
        if not sep or not (key == ENV_ARGS or key.startswith(ENV_ARGS + ".")):
            continue
        value = parse_value(raw)
        if key == ENV_ARGS:
            taken["env_args"] = dict(value) if isinstance(value, dict) else value
            continue
        env_args = taken.setdefault("env_args", {})
        if not isinstance(env_args, dict):
            return  # env_args=... of another kind: the function's own check says what is wrong
        *path, last = key.removeprefix(ENV_ARGS + ".").split(".")
        for part in path:
            env_args = env_args.setdefault(part, {})
            if not isinstance(env_args, dict):
                return
        env_args[last] = value


def errors(taken: dict[str, Any], rest: list[str], experiment: str, params: list[str]) -> list[str]:
    """What is wrong with the arguments taken, and the overrides left that misspell one."""
    found = [e for key, value in taken.items() if (e := _shorthand_error(key, value))]
    return found + [e for item in rest if (e := _misspelt_argument(item, experiment, params))]


def _misspelt_argument(item: str, experiment: str, params: list[str]) -> str | None:
    """``frams=100`` next to ``frames``: an argument of the experiment's function, not a config
    key, so the config's "unknown key; valid keys: name, environment, ..." neither named nor
    suggested it."""
    key, sep, _ = item.partition("=")
    key = key.strip()
    if not sep or "." in key or key in ExperimentConfig.__annotations__:
        return None
    arguments = [p for p in params if p not in ExperimentConfig.__annotations__]
    close = difflib.get_close_matches(key, arguments, n=1, cutoff=0.75)  # n_agent is no target
    if not close:
        return None
    return (
        f"{key}: unknown key; did you mean '{close[0]}' (an argument of experiment '{experiment}')?"
    )


STOP_SHORTHANDS = {"frames": "stop.env_frames", "target": "stop.eval_return"}
"""``troupe train ENV``'s ``frames=`` and ``target=``, for an experiment whose function does not
take them: ``troupe.train("cartpole-ppo", frames=30000)`` read ``frames`` as an unknown key
("did you mean 'name'?") after the README showed it for an environment."""


def stop_shorthands(overrides: list[str]) -> list[str]:
    """``overrides`` with ``frames=``/``target=`` written as the stop keys they stand for."""
    out, errors = [], []
    for item in overrides:
        key, sep, raw = (part.strip() for part in item.partition("="))
        if not sep or key not in STOP_SHORTHANDS:
            out.append(item)
            continue
        value = _whole(parse_value(raw))
        if error := _shorthand_error(key, value):
            errors.append(error)
        out.append(f"{STOP_SHORTHANDS[key]}={value!r}")
    if errors:
        raise ConfigError(errors)
    return out


def _whole(value: Any) -> Any:
    """``frames=1e6`` is a whole number written as budgets are: the int 1000000."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _shorthand_error(key: str, value: Any) -> str | None:
    """What is wrong with ``frames=`` or ``target=``: ``frames=abc`` reached the experiment
    function as text (its arithmetic's TypeError was the message), ``frames=0`` silently
    became the default budget."""
    if value is None or key not in ("frames", "target"):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        ok = False
    else:
        ok = key == "target" or (isinstance(value, int) and value >= 1)
    if ok:
        return None
    if key == "frames":
        return f"frames: env frames to train at most, a whole number of at least 1; got {value!r}"
    return f"target: the greedy return to reach, a number; got {value!r}"
