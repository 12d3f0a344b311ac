"""The user's door to Troupe's checks: run them before a long experiment.

* :func:`test_environment` — does an environment keep the Environment contract?
* :func:`test_pipeline` — do environment, policy and trainer work together (one process, the
  runtime's own workers)?

Both raise a :class:`~api.errors.UserError` subclass whose message names the problem and the fix.
Use them from your own tests through the module (``from api import testing``), or import the
names: both are marked ``__test__ = False`` so pytest does not collect them.

``api`` imports nothing else of ours, so :func:`test_pipeline` finds the runtime that runs it the
way the registry finds built-in components: through an entry point (``troupe.runtime`` group,
name ``pipeline_check``, declared in ``pyproject.toml``). An installation without a runtime can
still check environments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from api import user_code
from api.config import ComponentConfig, ExperimentConfig
from api.env_check import EnvironmentReport, test_environment
from api.errors import RegistryError

__all__ = ["EnvironmentReport", "PipelineReport", "test_environment", "test_pipeline"]

RUNTIME_GROUP = "troupe.runtime"


@dataclass
class PipelineReport:
    """What ``test_pipeline`` ran and saw."""

    env_frames: int = 0
    episodes: int = 0
    mean_episode_return: float | None = None
    trainer_steps: dict[str, int] = field(default_factory=dict)
    versions: dict[str, list[int]] = field(default_factory=dict)
    last_stats: dict[str, dict[str, float]] = field(default_factory=dict)
    batch_shapes: dict[str, dict[str, Any]] = field(default_factory=dict)
    wall_s: float = 0.0
    experiment: str = ""
    """The experiment's name (what ``troupe test-pipeline ENV --algo ALGO`` resolved to)."""
    trainers: dict[str, str] = field(default_factory=dict)
    """Each policy's trainer type."""

    def __str__(self) -> str:
        ret = "-" if self.mean_episode_return is None else f"{self.mean_episode_return:.2f}"
        of = f" (experiment '{self.experiment}')" if self.experiment else ""
        lines = [
            f"pipeline ok{of}: {self.env_frames} env frames, {self.episodes} episodes "
            f"(mean return {ret}) in {self.wall_s:.1f}s",
        ]
        for name, steps in self.trainer_steps.items():
            versions = self.versions.get(name, [])
            trainer = f" ({self.trainers[name]})" if name in self.trainers else ""
            lines.append(
                f"  policy '{name}'{trainer}: {steps} trainer steps, versions {_span(versions)}"
            )
            stats = self.last_stats.get(name, {})
            parts = [f"{k}={v:.4g}" for k, v in stats.items() if _shown(k)]
            if parts:
                lines.append("    " + " ".join(parts))
        return "\n".join(lines)


def _span(versions: list[int]) -> str:
    """The versions a policy went through, a long run of consecutive ones as its ends: an
    off-policy trainer makes one a step, and SAC's 87 filled five lines of the report."""
    if len(versions) > 5 and versions == list(range(versions[0], versions[-1] + 1)):
        return f"{versions[0]} to {versions[-1]}"
    return str(versions)


SHOWN_STATS = ("entropy", "approx_kl", "clip_fraction", "q_mean", "alpha")
"""Besides every loss, the trainer statistics a report shows: those that say whether learning
is sane (PPO's, DQN's and SAC's alike)."""


def _shown(stat: str) -> bool:
    return stat == "loss" or stat.endswith("_loss") or stat in SHOWN_STATS


def test_pipeline(
    environment: str | ComponentConfig | None = None,
    policy: str | ComponentConfig | None = None,
    trainer: str | ComponentConfig | None = None,
    *,
    experiment: str | ExperimentConfig | None = None,
    trainer_steps: int = 3,
    episodes: int = 1,
    envs: int = 4,
    segment_length: int = 32,
    batch_segments: int = 4,
    seed: int = 0,
    max_env_frames: int = 200_000,
    algo: str | None = None,
) -> PipelineReport:
    """Run environment, policy and trainer together for a few episodes and trainer steps.

    Give either the three components (registered names, or ``ComponentConfig(type, args)`` for
    arguments), the environment alone (the ``ppo`` experiment set up from its spaces, as
    ``troupe test-pipeline ENV`` and ``troupe.train(ENV)`` do; ``algo`` another algorithm, as
    ``--algo``: ``auto``, ``ppo``, ``impala``, ``dqn``, ``sac``, ``mappo``) or an
    ``experiment`` (what ``troupe.train`` takes: a registered name, a file, an environment id,
    an ExperimentConfig), which is shrunk to one actor of ``envs`` environments. The runtime's
    own actor, policy and trainer workers run wired together in this process (serial mode), so
    what passes here is what a distributed run executes. Before the first trainer step the
    first sample batch and what ``policy.analyze`` returns are checked against the trainer's
    declared ``AnalyzedResult``; every action against the action space; after the run, that
    versions went up, the policy workers loaded them and losses stayed finite. Any problem
    raises :class:`~api.errors.PipelineCheckError`.
    """
    arguments = dict(locals())  # every parameter, by name: nothing to forget when one is added
    user_code.refuse_while_importing("test_pipeline()")
    return _runtime_check()(**arguments)


test_pipeline.__test__ = False  # a "test_" function imported into a test module is not a test


def _runtime_check() -> Any:
    found = list(entry_points(group=RUNTIME_GROUP, name="pipeline_check"))
    if not found:
        raise RegistryError(
            f"no Troupe runtime is installed (no '{RUNTIME_GROUP}' entry point named "
            "'pipeline_check'): install the project (pip install -e .) to run test_pipeline"
        )
    return found[0].load()
