"""The experiment sections that coordinate a run as a whole: a curriculum, population-based
training (PBT) and self-play against past versions. The first two are driven by the controller
through the run's global state (:mod:`api.global_state`); their checks live here to keep
``api.config`` short.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from api.config.arguments import check_arguments
from api.errors import RegistryError
from api.registry import REGISTRIES


@dataclass
class CurriculumConfig:
    """A curriculum: when a metric crosses a threshold, every actor's environments move to the
    next stage (``Environment.set_curriculum_stage``)."""

    metric: str = ""
    """The metrics.jsonl key watched, e.g. ``episode_return`` or ``episode_info/solved``; empty:
    no curriculum."""
    thresholds: list[float] = field(default_factory=list)
    """Increasing values: reaching ``thresholds[k]`` in stage ``k`` moves the run to stage
    ``k + 1`` (one stage at a time; a stage is never left for an easier one)."""
    stages: list[Any] = field(default_factory=list)
    """What ``set_curriculum_stage`` receives in each stage (one more than ``thresholds``);
    empty: the stage numbers 0, 1, ..."""
    min_episodes: int = 0
    """Training episodes that must finish in a stage before the next may start (so the metric
    is measured on the stage it is in, not on the last one)."""
    key: str = "curriculum/stage"
    """The global state key holding the current stage (``{"index", "stage"}``)."""


@dataclass
class PBTConfig:
    """Population-based training: members (policies, each with its own trainer, policy worker
    and actors) are ranked by greedy evaluation return; a member in the bottom share copies the
    weights of one in the top share through the parameter service (exploit) and continues with
    perturbed hyper-parameters (explore)."""

    members: list[str] = field(default_factory=list)
    """Policy names of the population (at least 2); empty: no PBT. The actors and evaluation
    actors are dealt out among them, each playing every agent of its environments."""
    interval_steps: int = 10
    """Trainer steps of a member between two exploit/explore decisions about it."""
    eval_episodes: int = 10
    """A member's score: the mean return of its last this many evaluation episodes (played by
    its current weights); a member with fewer is not ranked yet."""
    truncation: float = 0.25
    """Share of the population in the bottom (exploits) and the top (is copied from)."""
    hyperparameters: dict[str, list[float]] = field(default_factory=dict)
    """Trainer hyper-parameters explored, each ``[low, high]``; every member's trainer args
    give its starting value, e.g. ``{"lr": [1e-4, 1e-2], "entropy_coef": [0.0, 0.05]}``."""
    perturb_factors: list[float] = field(default_factory=lambda: [0.8, 1.25])
    """Explore multiplies each copied hyper-parameter by one of these, drawn at random."""
    resample_probability: float = 0.0
    """Chance that explore draws a hyper-parameter afresh from its range instead."""
    target_return: float | None = None
    """Stop the run once the best member's score reaches this (None: the other stop rules)."""


@dataclass
class SelfPlayConfig:
    """Self-play against the past: the ``opponent`` policy (frozen: no trainer, the same network
    as the learner) is played by its policy workers with past versions of the ``learner``. Every
    ``snapshot_every``-th version the parameter service pushes joins a pool, and every
    ``swap_every_s`` seconds each opponent worker draws the version it plays from the pool.
    Which seat each plays is the experiment's ``policy_mapping`` (e.g. ``self-play``)."""

    learner: str = ""
    """The trained policy whose past versions are played against; empty: no self-play pool."""
    opponent: str = ""
    """The frozen policy that plays them (same ``policy`` config as the learner, no trainer)."""
    snapshot_every: int = 10
    """Every this many learner versions, one joins the pool (the first one always does)."""
    pool_size: int = 20
    """The most recent snapshots kept; older ones leave the pool."""
    sampling: Literal["uniform", "latest-heavy", "prioritized"] = "latest-heavy"
    """How a worker draws its opponent version: ``uniform`` over the pool; ``latest-heavy``
    (half the time the newest snapshot, else uniform); ``prioritized`` (by how often each
    version beat or drew with the learner, from the run's ratings in the global state)."""
    swap_every_s: float = 5.0
    """Seconds between two draws of an opponent worker."""
    random_moves: float = 0.0
    """Chance that the opponent makes a uniformly random legal move instead of its snapshot's
    (training games only), so that the learner also meets the odd moves a weak player makes."""


def check_league(config: Any) -> list[str]:
    """Every problem with the curriculum, PBT and self-play sections of ``config`` (an
    ``api.config.ExperimentConfig``, which holds these sections: so not imported here)."""
    return (
        _check_curriculum(config.curriculum)
        + _check_pbt(config.pbt, config)
        + _check_selfplay(config.selfplay, config.policies)
    )


def _check_selfplay(sp: SelfPlayConfig, policies: Mapping[str, Any]) -> list[str]:
    if not (sp.learner or sp.opponent):
        return []
    errors = []
    learner, opponent = policies.get(sp.learner), policies.get(sp.opponent)
    for key, pc in (("learner", learner), ("opponent", opponent)):
        name = getattr(sp, key)
        if pc is None:
            errors.append(f"selfplay.{key}: '{name}' is not a policy; policies: {sorted(policies)}")
    if learner is not None and not learner.trainer.type:
        errors.append(f"policies.{sp.learner}.trainer: the self-play learner must be trained")
    if opponent is not None and opponent.trainer.type:
        errors.append(
            f"policies.{sp.opponent}.trainer: leave empty; the opponent plays the learner's "
            "past versions and is never trained itself"
        )
    if learner is not None and opponent is not None and learner.policy != opponent.policy:
        errors.append(
            f"policies.{sp.opponent}.policy: must be the learner's ({learner.policy.type} "
            f"{learner.policy.args}) so that its checkpoints load"
        )
    if sp.learner == sp.opponent:
        errors.append("selfplay.opponent: must differ from selfplay.learner")
    if sp.snapshot_every < 1 or sp.pool_size < 1:
        errors.append("selfplay.snapshot_every and selfplay.pool_size: must be at least 1")
    if not 0.0 <= sp.random_moves < 1.0:
        errors.append(f"selfplay.random_moves: must be in [0, 1), got {sp.random_moves}")
    if not sp.swap_every_s > 0:
        errors.append(f"selfplay.swap_every_s: must be more than 0, got {sp.swap_every_s}")
    return errors


def _check_curriculum(c: CurriculumConfig) -> list[str]:
    if not c.metric:
        return ["curriculum.metric: set it, or leave thresholds empty"] if c.thresholds else []
    errors = []
    if not c.thresholds:
        errors.append("curriculum.thresholds: give at least one threshold for the metric")
    if any(b <= a for a, b in zip(c.thresholds, c.thresholds[1:])):
        errors.append(f"curriculum.thresholds: must increase, got {c.thresholds}")
    if c.stages and len(c.stages) != len(c.thresholds) + 1:
        errors.append(
            f"curriculum.stages: needs {len(c.thresholds) + 1} entries (one more than "
            f"thresholds), got {len(c.stages)}"
        )
    if c.min_episodes < 0:
        errors.append("curriculum.min_episodes: must be 0 or more")
    if not c.key:
        errors.append("curriculum.key: must name a global state key")
    return errors


def _check_pbt(p: PBTConfig, config: Any) -> list[str]:
    policies = config.policies
    if not p.members:  # what only a population uses would be ignored, and one was still shown
        unused = ["pbt.hyperparameters"] if p.hyperparameters else []
        unused += ["pbt.target_return"] if p.target_return is not None else []
        return [f"{k}: set without pbt.members (no population), so it would do nothing; name "
                "the members, or leave it unset (one policy's target: stop.eval_return)"
                for k in unused]  # fmt: skip
    n, errors = len(p.members), []
    untaken = _untaken(p, policies)  # said once, below, not as a missing start per member
    if n < 2 or len(set(p.members)) != n:
        errors.append(f"pbt.members: needs 2 or more distinct policies, got {p.members}")
    for m in p.members:
        pc = policies.get(m)
        if pc is None:
            known = sorted(policies)
            errors.append(f"pbt.members: '{m}' is not a policy; policies: {known}")
            continue
        if not pc.trainer.type:
            errors.append(f"policies.{m}.trainer: a PBT member must be trained")
        if pc.trainer_workers != 1:
            errors.append(f"policies.{m}.trainer_workers: a PBT member trains with exactly 1")
        for name, bounds in p.hyperparameters.items():
            start = pc.trainer.args.get(name)
            if name in untaken:
                continue
            if not isinstance(start, (int, float)) or isinstance(start, bool):
                errors.append(
                    f"policies.{m}.trainer.args.{name}: PBT explores '{name}'; give the "
                    "member's starting value here"
                )
            elif len(bounds) == 2 and not bounds[0] <= start <= bounds[1]:
                errors.append(
                    f"policies.{m}.trainer.args.{name}: {start} is outside pbt.hyperparameters."
                    f"{name} {bounds}"
                )
    if config.agent_policies:
        errors.append("agent_policies: leave empty with pbt (each member plays its own actors)")
    for group in ("actors", "evaluation"):
        workers = getattr(config, group).workers
        if workers < n or workers % n:
            errors.append(
                f"{group}.workers: {workers} cannot be dealt out evenly to {n} PBT members; "
                f"use a multiple of {n}"
            )
    whole = whole_hyperparameters(config)
    for name, bounds in p.hyperparameters.items():
        if name in untaken:
            errors.append(f"pbt.hyperparameters.{name}: {untaken[name]}")
        if len(bounds) != 2 or not bounds[0] < bounds[1]:
            errors.append(f"pbt.hyperparameters.{name}: must be [low, high], got {bounds}")
        elif name in whole and math.floor(bounds[1]) - math.ceil(bounds[0]) < 1:
            errors.append(
                f"pbt.hyperparameters.{name}: the trainer takes it as a whole number, and "
                f"{bounds} holds fewer than two to explore"
            )
    if not p.hyperparameters:
        errors.append("pbt.hyperparameters: name at least one trainer hyper-parameter to explore")
    if not p.perturb_factors or any(f <= 0 for f in p.perturb_factors):
        errors.append(f"pbt.perturb_factors: must be positive numbers, got {p.perturb_factors}")
    if not 0 < p.truncation <= 0.5:
        errors.append(f"pbt.truncation: must be in (0, 0.5], got {p.truncation}")
    if not 0 <= p.resample_probability <= 1:
        errors.append("pbt.resample_probability: must be in [0, 1]")
    if p.interval_steps < 1 or p.eval_episodes < 1:
        errors.append("pbt.interval_steps and pbt.eval_episodes: must be at least 1")
    if config.stop.eval_return is not None:
        errors.append(
            "stop.eval_return: averages every member's evaluation; with pbt use "
            "pbt.target_return (the best member's score)"
        )
    return errors


def whole_hyperparameters(config: Any) -> frozenset[str]:
    """PBT's hyper-parameters that a member's trainer takes as whole numbers (annotated
    ``int``: PPO's ``epochs`` and ``minibatches``): explored in whole numbers only."""
    p, whole = config.pbt, set()
    types = {config.policies[m].trainer.type for m in p.members if m in config.policies}
    for trainer in sorted(types - {""}):
        try:
            spec = REGISTRIES["trainer"].spec(trainer)
        except RegistryError:
            continue
        for name in p.hyperparameters:
            if any(": expected " in e for e in check_arguments(spec, {name: 0.5}, "x")):
                whole.add(name)
    return frozenset(whole)


def _untaken(p: PBTConfig, policies: Mapping[str, Any]) -> dict[str, str]:
    """The hyper-parameters no member's trainer takes as an argument (``lrr`` for ``lr``),
    each with why: PBT can only explore what the trainer takes."""
    trained = [policies[m].trainer for m in p.members if m in policies]
    given = {name for trainer in trained for name in trainer.args}
    out = {}
    for trainer in sorted({t.type for t in trained} - {""}):
        try:
            spec = REGISTRIES["trainer"].spec(trainer)
        except RegistryError:
            continue  # the trainer's own check says so
        for name in p.hyperparameters:
            unknown = [e for e in check_arguments(spec, {name: 1.0}, "x") if ": unknown key;" in e]
            if name not in given and unknown:
                out.setdefault(name, unknown[0].partition(": ")[2])
    return out
