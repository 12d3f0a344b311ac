"""How a config is made from outside: a registered experiment by name, ``key.path=value``
overrides (``troupe run NAME key=value ...``), ``actors.workers=auto``.

Experiments are registered by name (``register_experiment``); their entry point is a function
that returns an :class:`~api.config.schema.ExperimentConfig`. Experiment files (``base:`` a
named recipe) are :mod:`api.resolve`'s.
"""

from __future__ import annotations

import ast
import difflib
import os
from typing import Any

from api.code import attach_user_code
from api.config.arguments import suggest_key
from api.config.checks import check, validate
from api.config.schema import RENAMED_KEYS, ExperimentConfig, from_mapping
from api.errors import ConfigError
from api.registry import experiments


def string_list(name: str, value: Any) -> list[str]:
    """``value`` (overrides, imports) as a list; one string is refused, not read a character
    at a time (``troupe.train("cartpole-ppo", "seed=3")`` listed 6 bad overrides: s, e, ...)."""
    if isinstance(value, str):
        raise ConfigError([f"{name}: a list of strings, not one string: write [{value!r}]"])
    return list(value or [])


def apply_overrides(config: ExperimentConfig, overrides: list[str]) -> ExperimentConfig:
    """Apply ``key.path=value`` strings; values are Python literals or plain strings.

    Raises ConfigError listing every bad override (unknown keys with the closest real key of
    any section, wrong types) and every error of the result."""
    overrides = string_list("overrides", overrides)
    data = config.to_dict()
    errors = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            errors.append(f"{item}: an override must look like key.path=value")
            continue
        key = RENAMED_KEYS.get(key.strip(), key.strip())
        err = _set_path(data, key.split("."), parse_value(raw.strip()))
        if err:
            # the key whole under a section (replay.batch_size: policies.default.replay...)
            placed = [p for p in suggest_key(config, key) if p.endswith("." + key)]
            if placed:  # before a spelling match of its first part ("did you mean selfplay")
                err, hint = err.split(";")[0], f"; did you mean {' or '.join(placed)}?"
            else:
                hint = "" if "did you mean" in err else _hint(config, key.strip())
            errors.append(f"{key}: {err}{hint}")
    if data.get("actors", {}).get("workers") == AUTO:
        data["actors"]["workers"] = auto_actor_workers(data)
    new = from_mapping(ExperimentConfig, data, "", errors)
    if errors:  # with what the rest of the config gets wrong, so one launch shows them all
        raise ConfigError(errors + [e for e in validate(new) if e not in errors])
    return new


AUTO = "auto"
"""``actors.workers=auto``: as many actor processes as the cores the other roles leave."""


def auto_actor_workers(data: dict[str, Any], cores: int | None = None) -> int:
    """Actor processes for ``actors.workers=auto``: the cores this process may use (those of
    the machine that launches the run: size a cluster run by hand), less one for each policy
    and trainer worker and one for the parameter service, controller and evaluation, at
    least one. On a 16-core machine with one policy and one trainer worker: 13 actors."""
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    others = 1
    for policy in (data.get("policies") or {}).values():
        if isinstance(policy, dict):
            others += int(policy.get("policy_workers") or 0)
            if (policy.get("trainer") or {}).get("type"):
                others += int(policy.get("trainer_workers") or 0)
    return max(1, cores - others)


def _hint(config: ExperimentConfig, key: str) -> str:
    close = suggest_key(config, key)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def _set_path(data: dict, parts: list[str], value: Any) -> str | None:
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        if not isinstance(node, dict) or part not in node:
            names = list(node) if isinstance(node, dict) else []
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            return f"no key '{'.'.join(parts[: i + 1])}'{hint}"
        node = node[part]
    if not isinstance(node, dict):
        return f"'{'.'.join(parts[:-1])}' is not a mapping"
    node[parts[-1]] = value  # unknown leaf keys are reported by from_dict, with a suggestion
    return None


def parse_value(raw: str) -> Any:
    """The value of a ``key=value`` argument, read the same way everywhere (overrides, env
    arguments): ``none``/``null`` is None, ``true``/``false`` in any case a bool, a Python
    literal its value, anything else the text itself."""
    if raw in ("none", "null", "None"):
        return None
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


def make_experiment(name: str, overrides: list[str] | None = None) -> ExperimentConfig:
    """Build a registered experiment, apply overrides, and check it as a whole."""
    config = experiments.make(name)
    if not isinstance(config, ExperimentConfig):
        raise ConfigError([f"experiment '{name}' did not return an ExperimentConfig"])
    if overrides:
        config = apply_overrides(config, overrides)
    return check(attach_user_code(config))
