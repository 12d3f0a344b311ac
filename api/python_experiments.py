"""Experiments written as a Python file's function (``troupe run my_exp.py[:FUNCTION]``):
the function found, its parameters taken from the overrides as a registered experiment's are
(:mod:`api.experiment_arguments`), and what it returns checked to be a config."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from api import experiment_arguments, user_code
from api.config import ExperimentConfig
from api.errors import ConfigError, UserError

DEFAULT_FUNCTION = "experiment"


def from_python(target: str, overrides: list[str] = ()) -> tuple[ExperimentConfig, str, list[str]]:
    """The config a Python file's function returns, and the overrides left: those named as
    the function's own parameters (``troupe run my_exp.py lr=0.01`` for ``def
    experiment(lr=1e-3)``) are its arguments, as a registered experiment's are."""
    factory, where, path = file_function(target)
    params = experiment_arguments.signature_parameters(factory)
    taken, rest = experiment_arguments.split(list(overrides), params)
    errors = experiment_arguments.errors(taken, rest, where, params)
    if errors:
        raise ConfigError(errors)
    return called(factory, where, taken), path, rest


def file_function(target: str) -> tuple[Callable[..., Any], str, str]:
    """The experiment function ``target`` names (``file.py``, ``file.py:FUNCTION``), how to
    name it in a message, and the file's absolute path."""
    path, _, function = target.partition(".py:")
    path = path + ".py" if function else target
    function = function or DEFAULT_FUNCTION
    if not Path(path).is_file():
        raise UserError(f"experiment file {path} does not exist")
    module = user_code.import_file(path)
    factory = getattr(module, function, None)
    if not callable(factory):
        raise UserError(
            f"{path} has no function '{function}': define `def {DEFAULT_FUNCTION}() -> "
            f"ExperimentConfig`, or name yours as {path}:FUNCTION"
        )
    return factory, f"{path}:{function}", str(Path(path).resolve())


def called(factory: Callable[..., Any], where: str, kwargs: dict[str, Any]) -> ExperimentConfig:
    """What the function returns for ``kwargs``; arguments its signature refuses (one it needs
    and was not given) are said in one line, a TypeError from inside it keeps its traceback."""
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as e:
        raise UserError(f"{where}() with {kwargs}: {e}") from e
    except ValueError:  # no signature to read: the call says what is wrong
        pass
    config = factory(**kwargs)
    if not isinstance(config, ExperimentConfig):
        raise UserError(
            f"{where}() returned {type(config).__name__} {config!r:.60}, not an ExperimentConfig"
        )
    return config
