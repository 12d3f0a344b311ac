"""Typed experiment configuration, validated as a whole before any process starts.

One package, a module per question:

- :mod:`~api.config.schema`: what an experiment is (documented dataclasses) and how one is read
  from a mapping;
- :mod:`~api.config.checks`: whether it makes a runnable experiment (every problem at once;
  plural because this package exports the function ``check``, which would hide a module of
  that name from ``import api.config.check``);
- :mod:`~api.config.load`: how one is made from outside (a registered name, overrides);
- :mod:`~api.config.arguments`: components' arguments against their signatures, key hints;
- :mod:`~api.config.league`: the curriculum, PBT and self-play sections and their checks;
- :mod:`~api.config.parallel`: the data-parallel trainer check;
- :mod:`~api.config.docs`: every key with its documentation (``troupe show-config``).

The names users import (``from api.config import ExperimentConfig, make_experiment``) are
re-exported here; the modules import each other directly, never this package.
"""

from api.config.checks import check, rate_limited_replay, uses_replay, validate
from api.config.league import CurriculumConfig, PBTConfig, SelfPlayConfig
from api.config.load import AUTO, apply_overrides, auto_actor_workers, make_experiment, parse_value
from api.config.schema import (
    RENAMED_KEYS,
    ActorConfig,
    CheckpointConfig,
    ComponentConfig,
    EvaluationConfig,
    ExperimentConfig,
    LivenessConfig,
    MetricsConfig,
    PolicyConfig,
    ReplayConfig,
    StopConfig,
)

__all__ = [
    "AUTO",
    "RENAMED_KEYS",
    "ActorConfig",
    "CheckpointConfig",
    "ComponentConfig",
    "CurriculumConfig",
    "EvaluationConfig",
    "ExperimentConfig",
    "LivenessConfig",
    "MetricsConfig",
    "PBTConfig",
    "PolicyConfig",
    "ReplayConfig",
    "SelfPlayConfig",
    "StopConfig",
    "apply_overrides",
    "auto_actor_workers",
    "check",
    "make_experiment",
    "parse_value",
    "rate_limited_replay",
    "uses_replay",
    "validate",
]
