"""Checks of an experiment config beyond its own types: component arguments, ranges, key hints.

* :func:`check_arguments`: a component's ``args`` against its constructor's signature: unknown
  names (with a suggestion) and values whose type does not fit the parameter's annotation
  (``policies.default.trainer.args.lr: expected float, got str 'abc'``).
  A constructor that takes ``**kwargs`` (e.g. one that forwards them to another library) can
  still be checked: give the class a ``check_args(args) -> list[str]`` static or class method;
  it gets the registered defaults merged with the user's ``args`` and returns ``"key: problem"``
  messages.
  A component's numeric arguments are range-checked against the intervals its class declares
  in ``arg_ranges`` (``{"gamma": "[0, 1]"}``, read from source like the signature).
* :func:`check_ranges`: numeric fields that must be positive or non-negative.
* :func:`suggest_key`: for a key path that does not exist, the closest real ones across every
  section of the config and every component's arguments, knowing the names other libraries use
  (``learning_rate`` is ``lr`` here), so ``trainer.lerning_rate`` points at
  ``policies.default.trainer.args.lr``.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import inspect
import types
import typing
from typing import Any

from api.errors import RegistryError
from api.registry import REGISTRIES, Spec
from api.signatures import UNKNOWN, static_class_attribute, static_signature

ALIASES: dict[str, tuple[str, ...]] = {
    "lr": ("learning_rate", "lr_rate", "step_size", "alpha"),
    "gamma": ("discount", "discount_factor"),
    "gae_lambda": ("lambda", "lam", "gae_lam", "lmbda"),
    "entropy_coef": ("ent_coef", "entropy_weight", "entropy_beta"),
    "value_coef": ("vf_coef", "value_loss_coef", "critic_coef"),
    "clip": ("clip_range", "clip_param", "clip_eps", "clip_ratio", "epsilon"),
    "epochs": ("n_epochs", "num_epochs", "ppo_epochs", "update_epochs"),
    "minibatches": ("n_minibatches", "num_minibatches", "num_mini_batch"),
    "max_grad_norm": ("grad_clip", "clip_grad_norm", "grad_norm"),
    "hidden_sizes": ("hidden", "hidden_size", "layers", "net_arch"),
    "workers": ("num_workers", "n_workers", "num_actors"),
    "envs_per_worker": ("num_envs", "n_envs", "envs"),
    "segment_length": ("rollout_length", "n_steps", "num_steps", "unroll_length"),
    "env_frames": ("total_timesteps", "timesteps", "total_frames", "num_env_steps"),
    "eval_return": ("target", "reward_threshold", "target_return"),
    "normalize_obs": ("norm_obs", "obs_norm", "normalize_observations"),
    "normalize_returns": ("norm_reward", "normalize_reward", "normalize_rewards"),
}
"""Names other RL libraries use for our keys: a misspelt alias still finds the real key."""

RANGES: dict[str, tuple[str, float]] = {
    "seed": (">=", 0),
    "checkpoint.every": (">=", 1),
    "checkpoint.every_seconds": (">", 0),
    "checkpoint.keep_last": (">=", 0),
    "checkpoint.keep_every": (">=", 0),
    "stop.eval_return": ("any", 0),
    "stop.env_frames": (">", 0),
    "stop.trainer_steps": (">", 0),
    "stop.wall_seconds": (">", 0),
    "stop.stall_seconds": (">", 0),
    "liveness.max_poll_s": (">", 0),
    "liveness.max_trainer_poll_s": (">", 0),
    "liveness.max_build_s": (">", 0),
}
"""Bounds of numeric fields not already checked in :func:`api.config.validate`."""


# --------------------------------------------------------------------- component arguments
def check_arguments(spec: Spec, args: dict[str, Any], path: str, skip=()) -> list[str]:
    """Unknown argument names and ill-typed values of ``args`` for ``spec``'s constructor."""
    try:
        sig, hints, factory = _signature(spec)
    except (RegistryError, TypeError, ValueError) as e:
        return [f"{path}.type: {e}"]
    params = {n: p for n, p in sig.parameters.items() if n not in skip}
    errors = []
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        names = [n for n, p in params.items() if p.kind is not p.VAR_POSITIONAL]
        for key in args:
            if key not in names:
                close = close_names(str(key), names)
                hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(names)}"
                errors.append(
                    f"{path}.args.{key}: unknown key; {hint} ({spec.entry_point} takes no '{key}')"
                )
    for key, value in args.items():
        if key in params and key in hints and not matches(hints[key], value):
            errors.append(
                f"{path}.args.{key}: expected {describe(hints[key])}, got "
                f"{type(value).__name__} {value!r}"
            )
    merged = {**spec.kwargs, **args}
    errors += argument_range_errors(_declared_ranges(spec, factory), merged, path)
    if factory is not None:
        errors += _own_check(factory, merged, path)
    return errors


def _signature(spec: Spec) -> tuple[inspect.Signature, dict[str, Any], Any]:
    """Signature, resolved annotations and (when it had to be imported) the factory.

    Read from the source when possible (:mod:`api.signatures`), so that checking a config does
    not import torch; imported otherwise."""
    if isinstance(spec.entry_point, str) and not spec.source:
        static = static_signature(spec.entry_point)
        if static is not None:
            return static.signature, static.hints, None
    factory = spec.load()
    return inspect.signature(factory), _hints(factory), factory


def _own_check(factory: Any, args: dict[str, Any], path: str) -> list[str]:
    """The component's own ``check_args`` hook, for arguments its signature cannot show."""
    check = getattr(factory, "check_args", None)
    if not callable(check):
        return []
    return [f"{path}.args.{message}" for message in check(args)]


def _declared_ranges(spec: Spec, factory: Any) -> dict[str, str]:
    """The component class's ``arg_ranges``: read from source when the signature was (no
    import), else from the imported class. A class whose source does not say it plainly is not
    range-checked rather than imported only for this; its constructor still checks at build."""
    if factory is None:
        ranges = static_class_attribute(spec.entry_point, "arg_ranges")
        return {} if ranges is UNKNOWN else ranges
    return getattr(factory, "arg_ranges", None) or {}


def argument_range_errors(ranges: dict[str, str], args: dict[str, Any], path: str) -> list[str]:
    """``args`` values outside their declared interval; a list's every entry is checked.
    A value of the wrong type is the type check's to report, None is never out of range."""
    errors = []
    for key, interval in ranges.items():
        value = args.get(key)
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if value is None or len(numbers) < len(values):
            continue
        try:
            inside = all(_within(interval, v) for v in numbers)
        except ValueError as e:  # the component's own declaration is wrong, not the user's value
            errors.append(f"{path}.type: arg_ranges['{key}']: {e}")
            continue
        if not inside:
            what = "every entry must be" if isinstance(value, (list, tuple)) else "must be"
            errors.append(f"{path}.args.{key}: {what} {_interval_words(interval)}, got {value!r}")
    return errors


def parse_interval(interval: str) -> tuple[float, bool, float, bool]:
    """``"(0, 1]"`` as ``(low, low_included, high, high_included)``; ``inf`` for no bound."""
    text = interval.strip()
    low, sep, high = text[1:-1].partition(",")
    if not sep or text[0] not in "[(" or text[-1] not in ")]":
        raise ValueError(f"not an interval: {interval!r}; write e.g. '[0, 1]' or '(0, inf)'")
    return float(low), text[0] == "[", float(high), text[-1] == "]"


def _within(interval: str, value: float) -> bool:
    low, low_in, high, high_in = parse_interval(interval)
    above = value >= low if low_in else value > low
    below = value <= high if high_in else value < high
    return above and below


def _interval_words(interval: str) -> str:
    """``at least 1``, ``more than 0``, ``in [0, 1]``: the bound a user must meet."""
    low, low_in, high, _ = parse_interval(interval)
    if high == float("inf"):
        return f"{'at least' if low_in else 'more than'} {low:g}"
    return f"in {interval.strip()}"


def parameters_of(kind: str, name: str, skip=()) -> dict[str, inspect.Parameter]:
    """The constructor parameters of a registered component (empty if it cannot be loaded)."""
    try:
        sig = _signature(REGISTRIES[kind].spec(name))[0]
    except (RegistryError, TypeError, ValueError, KeyError):
        return {}
    return {
        n: p
        for n, p in sig.parameters.items()
        if n not in skip and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    }


def takes_any_keyword(kind: str, name: str) -> bool:
    """Whether a registered component takes keyword arguments it does not name (``**kwargs``:
    a gymnasium id's environment passes them on to ``gym.make``)."""
    try:
        sig = _signature(REGISTRIES[kind].spec(name))[0]
    except (RegistryError, TypeError, ValueError, KeyError):
        return False
    return any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())


def _hints(factory: Any) -> dict[str, Any]:
    target = factory.__init__ if inspect.isclass(factory) else factory
    try:
        return typing.get_type_hints(target)
    except Exception:  # unresolvable annotations (forward refs to unimported names): no types
        return {}


def matches(hint: Any, value: Any) -> bool:
    """Whether a config value (numbers, strings, lists, dicts, None) fits an annotation.
    Types a config value cannot be (a gym.Space, a Policy) are not judged."""
    if hint is Any or hint is inspect.Parameter.empty:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(matches(a, value) for a in args)
    if origin is typing.Literal:
        return value in args
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (bool, str):
        return isinstance(value, hint)
    container = origin or hint
    if container in (list, tuple, collections.abc.Sequence, set, frozenset):
        if not isinstance(value, (list, tuple)):
            return False
        inner = [a for a in args if a is not Ellipsis]
        return not inner or all(matches(inner[0], v) for v in value)
    if container in (dict, collections.abc.Mapping):
        return isinstance(value, dict)
    return True


def describe(hint: Any) -> str:
    """``float``, ``int or None``, ``list of int``, ... for error messages."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in args)
    if hint is type(None):
        return "None"
    if origin is not None and args:
        return f"{getattr(origin, '__name__', str(origin))} of {describe(args[0])}"
    return getattr(hint, "__name__", str(hint))


# --------------------------------------------------------------------- ranges
def check_ranges(config: Any) -> list[str]:
    errors = []
    for path, (op, bound) in RANGES.items():
        value = config
        for part in path.split("."):
            value = getattr(value, part)
        if value is None or op == "any" or isinstance(value, bool):
            continue
        if not isinstance(value, (int, float)):
            continue  # the type check reports it
        if (op == ">" and not value > bound) or (op == ">=" and not value >= bound):
            what = "more than" if op == ">" else "at least"
            errors.append(f"{path}: must be {what} {bound:g}, got {value!r}")
    return errors


def evaluation_env_errors(config: Any) -> list[str]:
    """``evaluation.env_args`` over ``environment.args``, checked as the environment's own
    arguments: a misspelt key reached the evaluation actor's constructor, which ended the run."""
    env, extra = config.environment, config.evaluation.env_args
    if not extra or not isinstance(extra, dict) or not env.type:
        return []  # nothing more, or what the type and environment checks report
    try:
        spec = REGISTRIES["environment"].spec(env.type)
    except RegistryError:
        return []
    own = set(check_arguments(spec, env.args, "environment"))
    both = check_arguments(spec, {**env.args, **extra}, "environment")
    return [e.replace("environment.args.", "evaluation.env_args.", 1) for e in both if e not in own]


# --------------------------------------------------------------------- key suggestions
def close_names(name: str, names: list[str], n: int = 1) -> list[str]:
    """The names closest to ``name``, an alias of one counting as that name."""
    scored = []
    for candidate in names:
        spellings = (candidate, *ALIASES.get(candidate, ()))
        score = max(difflib.SequenceMatcher(None, name.lower(), s).ratio() for s in spellings)
        if score >= 0.75:
            scored.append((score, candidate))
    return [c for _, c in sorted(scored, key=lambda x: -x[0])[:n]]


def key_paths(config: Any) -> list[str]:
    """Every settable key of ``config`` as a dotted path, component arguments included."""
    paths: list[str] = []
    _walk(dataclasses.asdict(config), "", paths)
    components = [("environment", "environment", config.environment.type, ())]
    for pname, pc in config.policies.items():
        spaces = ("observation_space", "action_space")
        components.append(("policy", f"policies.{pname}.policy", pc.policy.type, spaces))
        if pc.trainer.type:
            trainer = ("trainer", f"policies.{pname}.trainer", pc.trainer.type, ("policy",))
            components.append(trainer)
    for kind, path, name, skip in components:
        for param in parameters_of(kind, name, skip):
            paths.append(f"{path}.args.{param}")
    return sorted(set(paths))


def _walk(node: Any, path: str, out: list[str]) -> None:
    if isinstance(node, dict) and node and not path.endswith(".args"):
        for key, value in node.items():
            _walk(value, f"{path}.{key}" if path else str(key), out)
    elif path and not path.startswith("code."):
        out.append(path)


def suggest_key(config: Any, wrong: str, n: int = 2) -> list[str]:
    """Real key paths for a wrong one: the leaf matched by spelling and aliases, then paths
    sharing more of the wrong path's other parts first."""
    parts = wrong.split(".")
    leaf = parts[-1]
    scored = []
    for path in key_paths(config):
        real = path.split(".")
        if not close_names(leaf, [real[-1]]):
            continue
        shared = sum(1 for p in parts[:-1] if p in real[:-1])
        spelling = difflib.SequenceMatcher(None, leaf, real[-1]).ratio()
        scored.append((shared, spelling, path))
    scored.sort(key=lambda x: (-x[0], -x[1], x[2]))
    return [path for _, _, path in scored[:n]]
