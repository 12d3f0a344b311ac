"""From what a user names to a checked experiment: a registered name, a file, or an environment.

``troupe run``, ``troupe show-config``, ``troupe test-pipeline``, the deploy commands and
``troupe.train`` all accept the same targets, resolved here:

* a registered experiment (``cartpole-ppo``); overrides whose key is one of the experiment
  function's own parameters (``troupe run ppo env=Acrobot-v1``) go to that function;
* a Python file, ``path/exp.py`` or ``path/exp.py:function``: the function (``experiment`` by
  default) returns an :class:`~api.config.ExperimentConfig`; the file is imported as a module (its
  ``__main__`` block does not run) and every worker imports it too, so whatever it registers at
  import time is known everywhere; its parameters are arguments, as a registered experiment's
  (:mod:`api.python_experiments`);
* a declarative file, ``.yaml``/``.yml``, ``.toml`` or ``.json``: the config as a mapping;
  ``base:`` starts it from a recipe, whose config the file's keys then change (mappings merge
  key by key, anything else is replaced): a registered experiment (``base: cartpole-dqn``),
  one with its function's arguments (``base: {experiment: ppo, env: Acrobot-v1}``, a
  Python file's too), or
  another experiment file beside it (``base: common.yaml``);
* a registered environment (any gymnasium id): the ``ppo`` experiment on it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import logging
import re
from pathlib import Path
from typing import Any

from api import experiment_arguments, registry, user_code
from api.algorithms import on_environment
from api.code import attach_user_code, relocated
from api.config import ExperimentConfig, apply_overrides, check, validate
from api.config.load import string_list
from api.errors import ConfigError, RegistryError, UserError
from api.python_experiments import called, file_function, from_python

logger = logging.getLogger(__name__)

DECLARATIVE = (".yaml", ".yml", ".toml", ".json")
ENVIRONMENT_EXPERIMENT = "ppo"
"""The registered experiment that trains on an environment named instead of an experiment."""


def load_experiment(
    target: str | ExperimentConfig, overrides: list[str] | None = None, imports: list[str] = ()
) -> ExperimentConfig:
    """The checked experiment ``target`` names, with ``overrides`` applied and this process's
    user code attached; ``imports`` are user files or modules imported first."""
    imports, overrides = string_list("imports", imports), string_list("overrides", overrides)
    user_code.import_given(imports)
    extra_imports = list(imports)
    if isinstance(target, ExperimentConfig):
        config = target
    elif _is_file(target, (".py",)):
        config, path, overrides = from_python(target, overrides)
        extra_imports.append(path)
    elif _is_file(target, DECLARATIVE):
        config = _from_declarative(Path(target))
    else:
        config, overrides = _from_registry(target, overrides)
    code, moved = relocated(config.code)
    if moved:  # a config the caller built is not changed under them
        config = dataclasses.replace(config, code=code)
    for old, new in moved.items():
        logger.warning("user code %s is no longer there: using %s, given with --import", old, new)
    if extra_imports:  # a new CodeConfig: the caller's keeps its imports
        imports = [*config.code.imports]
        imports += [i for i in extra_imports if i not in imports]
        config = dataclasses.replace(config, code=dataclasses.replace(config.code, imports=imports))
    overrides = experiment_arguments.stop_shorthands(overrides)
    if overrides:
        config = apply_overrides(config, overrides)
        given = [o for o in overrides if o.partition("=")[0].strip() == "stop.eval_return"]
        if given:  # not the experiment's: the value as it was written
            config.stop.eval_return_source = (
                f"given: stop.eval_return={given[-1].partition('=')[2].strip()}"
            )
    try:
        return check(attach_user_code(config))
    except ConfigError as e:
        raise _retyped_hint(e, overrides) from None


def _retyped_hint(error: ConfigError, overrides: list[str]) -> ConfigError:
    """``error`` with a line for each component whose ``type`` an override changed while
    the recipe's ``args`` for its old type stayed (``policies.default.policy.type=my-policy``
    keeps the actor-critic's ``hidden_sizes``): how to clear them."""
    keys = [o.partition("=")[0].strip() for o in overrides]
    retyped = [k.removesuffix(".type") for k in keys if k.endswith(".type")]
    hints = [
        f"{path}.args: what the recipe gave its previous type; {path}.type= changed the type, "
        f"not them: clear them with '{path}.args={{}}' (then add the new type's own)"
        for path in retyped
        if f"{path}.args" not in keys and any(e.startswith(f"{path}.args.") for e in error.errors)
    ]
    return ConfigError([*error.errors, *hints]) if hints else error


def for_environment(
    env: str, env_args: dict[str, Any] | None = None, algo: str = ENVIRONMENT_EXPERIMENT
) -> ExperimentConfig:
    """The checked experiment that trains on an environment named instead of an experiment
    (``algo``, one of :data:`api.algorithms.ALGORITHMS`, set up from its spaces), built with
    ``env_args``."""
    experiment, _ = on_environment(env, algo)
    kwargs = {"env": env, "env_args": dict(env_args or {})}
    return check(attach_user_code(_make_registered(experiment, kwargs)))


def _is_file(target: str, suffixes: tuple[str, ...]) -> bool:
    path = target.partition(".py:")[0] + ".py" if ".py:" in target else target
    return Path(path).suffix.lower() in suffixes


MAX_BASE_DEPTH = 8
"""How many files a chain of ``base:`` may pass through (a longer one is taken for a circle)."""


def _from_declarative(path: Path, depth: int = 0) -> ExperimentConfig:
    if not path.is_file():
        raise UserError(f"experiment file {path} does not exist")
    data = _read_declarative(path)
    base = data.pop("base", None)
    name = data.get("name", path.stem)  # the file's, not its recipe's
    if base is not None:
        own_imports = [_beside(path, i) for i in _file_imports(data)]
        for item in own_imports:  # first: they may register what the base is set up on
            user_code.import_code(item)
        recipe = _base(base, path, depth).to_dict()
        own_stop = data.get("stop") if isinstance(data.get("stop"), dict) else {}
        data = _merged(recipe, data)
        if "eval_return" in own_stop and "eval_return_source" not in own_stop:
            data["stop"]["eval_return_source"] = _target_source(own_stop["eval_return"], path)
        if own_imports:  # the recipe's user code is loaded too, then the file's own
            kept = recipe.get("code", {}).get("imports", [])
            data["code"]["imports"] = [*kept, *(i for i in own_imports if i not in kept)]
    data["name"] = name
    code = data.setdefault("code", {})
    if isinstance(code, dict):  # relative to the file, not to where the command runs
        code["imports"] = [_beside(path, i) for i in code.get("imports", [])]
        for item in code["imports"]:
            user_code.import_code(item)
    errors: list[str] = []
    config = ExperimentConfig.from_dict(data, errors)
    if errors:  # with what the rest of the file gets wrong, so one launch shows it all
        errors = [_base_hint(e, data) for e in errors]
        raise ConfigError(errors + [e for e in validate(config) if e not in errors])
    return config


def _target_source(target: Any, path: Path) -> str:
    """Where a file's own ``stop.eval_return`` came from, in place of its recipe's words: a
    file that set ``eval_return: null`` over ``base: {experiment: ppo, env: CartPole-v1}``
    started with "no evaluation target (gymnasium's reward_threshold for CartPole-v1)"."""
    return "" if target is None else f"given: stop.eval_return in {path.name}"


def _file_imports(data: dict[str, Any]) -> list[str]:
    """A file's own ``code.imports``, where they are a list of strings (anything else is left
    to the config's check, which says what is wrong with it)."""
    code = data.get("code")
    imports = code.get("imports", []) if isinstance(code, dict) else []
    if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
        return []
    return imports


RECIPE_WORDS = ("experiment", "extends", "from", "recipe", "inherit", "inherits", "parent")
"""Top-level keys a file may use meaning ``base:`` (other tools' words for it)."""


def _base_hint(error: str, data: dict[str, Any]) -> str:
    """``experiment: unknown key; valid keys: ...`` said nothing of ``base:``, the key such a
    file meant."""
    key = error.partition(":")[0]
    if key in RECIPE_WORDS and error.startswith(f"{key}: unknown key"):
        return f"{key}: unknown key; to start from a recipe, write base: {data[key]!r}"
    return error


def _read_declarative(path: Path) -> dict[str, Any]:
    text = path.read_text()
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            data = json.loads(text)
        elif suffix == ".toml":
            data = _toml().loads(text)
        else:
            data = _yaml().load(text, Loader=_yaml_loader())
    except Exception as e:  # each parser has its own error classes; all mean the same here
        raise UserError(f"{path}: not valid {suffix[1:]}: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: expected a mapping of config keys, got {type(data).__name__}"])
    return data


def _base(base: Any, path: Path, depth: int) -> ExperimentConfig:
    """The recipe a file's ``base:`` names; what goes wrong says which file's ``base:``
    (``base: cartpol-ppo`` gave "unknown experiment or environment", naming neither)."""
    where = f"{path}: base: "
    try:
        return _recipe(base, path, depth)
    except ConfigError as e:
        raise ConfigError([x if x.startswith(str(path)) else where + x for x in e.errors]) from e
    except UserError as e:
        if str(e).startswith(str(path)):
            raise
        raise UserError(where + str(e)) from e


def _recipe(base: Any, path: Path, depth: int) -> ExperimentConfig:
    if isinstance(base, dict):
        args = dict(base)
        name = args.pop("experiment", None)
        if not isinstance(name, str):
            raise ConfigError(
                [f"{path}: base: a mapping names its recipe as 'experiment' and gives the "
                 f"recipe's arguments beside it, e.g. {{experiment: ppo, env: Acrobot-v1}}; got "
                 f"{base!r}"]
            )  # fmt: skip
        if _is_file(name, (".py",)):  # a file's function with its arguments
            factory, where, imported = file_function(_next_to(path, name))
            config = called(factory, where, args)
            config.code.imports = [*config.code.imports, imported]
            return config
        return _make_registered(name, args)
    if not isinstance(base, str) or not base:
        raise ConfigError([f"{path}: base: must name a recipe or a file, got {base!r}"])
    if _is_file(base, (".py", *DECLARATIVE)):
        if depth >= MAX_BASE_DEPTH:
            raise ConfigError(
                [f"{path}: base: more than {MAX_BASE_DEPTH} files deep: do the files name each "
                 "other in a circle?"]
            )  # fmt: skip
        beside = _next_to(path, base)
        if _is_file(base, (".py",)):
            config, imported, _ = from_python(beside)
            config.code.imports = [*config.code.imports, imported]
            return config
        return _from_declarative(Path(beside), depth + 1)
    config, _ = _from_registry(base, [])
    return config


def _next_to(path: Path, name: str) -> str:
    """A file a file names: relative to the naming file's folder."""
    return name if Path(name).is_absolute() else str(path.parent / name)


def _merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes``: mappings merged key by key, anything else replaced.

    Two ways to take away what the recipe has, since merging alone only adds: an empty mapping
    replaces the recipe's (``args: {}``: no arguments, merged it changed nothing), and ``null``
    removes a mapping the recipe has (``policies: {default: null}``: a population's file drops
    the recipe's one policy). ``null`` for any other value stays a value (``eval_return``)."""
    out = dict(base)
    for key, value in changes.items():
        here = out.get(key)
        if value is None and isinstance(here, dict):
            del out[key]
        elif isinstance(value, dict) and value and isinstance(here, dict):
            out[key] = _merged(here, value)
        else:
            out[key] = value
    return out


def _beside(path: Path, item: Any) -> Any:
    if isinstance(item, str) and item.endswith(".py") and not Path(item).is_absolute():
        return str((path.parent / item).resolve())
    return item


def _toml():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError as e:
            raise UserError("reading .toml on Python 3.10 needs tomli: pip install tomli") from e
    return tomllib


def _yaml():
    try:
        import yaml
    except ImportError as e:
        raise UserError("reading .yaml needs PyYAML: pip install pyyaml") from e
    return yaml


_EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$")
"""``1e-3``: YAML 1.1, which PyYAML reads, takes it for text (it wants ``1.0e-3``); YAML 1.2
and every other reader here (TOML, JSON, an override) take it for a number, as users mean."""


@functools.cache
def _yaml_loader() -> type:
    """PyYAML's safe loader, reading ``1e-3`` as a float."""
    yaml = _yaml()

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))
    return Loader


def _from_registry(name: str, overrides: list[str]) -> tuple[ExperimentConfig, list[str]]:
    """A registered experiment (or the environment experiment on a registered environment);
    the overrides that are the experiment function's own arguments are taken out."""
    kwargs: dict[str, Any] = {}
    if name not in registry.experiments and name not in registry.environments:
        if registry.environments.in_family(name):
            registry.environments.spec(name)  # raises its resolver's reason (a game's version)
        raise RegistryError(_unknown_target(name))
    if name not in registry.experiments:
        logger.info("'%s' is an environment: training it with experiment '%s'", name,
                    ENVIRONMENT_EXPERIMENT)  # fmt: skip
        kwargs["env"] = name
        name = ENVIRONMENT_EXPERIMENT
    params = experiment_arguments.parameters(registry.experiments.spec(name))
    taken, rest = experiment_arguments.split(overrides, params)
    kwargs.update(taken)
    errors = experiment_arguments.errors(taken, rest, name, params)
    if errors:
        raise ConfigError(errors)
    return _make_registered(name, kwargs), rest


def _unknown_target(name: str) -> str:
    """What ``troupe run NAME`` says of a name that is neither an experiment nor an
    environment: the closest of both (``Taxi-v3`` is ``Taxi-v4`` in this gymnasium)."""
    kinds = {c: "experiment" for c in registry.experiments.close_matches(name)}
    kinds.update({c: "environment" for c in registry.environments.close_matches(name)})
    close = difflib.get_close_matches(name, list(kinds), n=3, cutoff=0.6)
    hint = " or ".join(f"{kinds[c]} '{c}'" for c in close)
    return (
        f"unknown experiment or environment '{name}'."
        + (f" Did you mean {hint}?" if hint else "")
        + " Run 'troupe list' to see every registered experiment and environment, or name an "
        "experiment file (.py, .yaml, .toml, .json)."
    )


def _make_registered(name: str, kwargs: dict[str, Any]) -> ExperimentConfig:
    """The registered experiment ``name`` made with its function's arguments ``kwargs``."""
    spec = registry.experiments.spec(name)
    try:
        config = spec.make(**kwargs)
    except RegistryError:
        raise
    except (TypeError, ValueError) as e:  # its own, or what it built raised (an environment)
        where = user_code.where_raised(e)
        raise UserError(f"experiment '{name}' with {kwargs}: {type(e).__name__}: {e}{where}") from e
    if not isinstance(config, ExperimentConfig):
        raise ConfigError([f"experiment '{name}' did not return an ExperimentConfig"])
    return config
