"""Greedy evaluation of saved parameters: ``troupe eval RUN_DIR_OR_CHECKPOINT``.

Evaluation runs the same actor and policy workers as training (in one process, see
:mod:`system.run.serial`) with ``is_evaluation=True``: actions are the policy's deterministic choice
and nothing is trained.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from api.code import load_code
from api.config import ExperimentConfig
from api.errors import UserError
from system import run_folder
from system.eval_quota import ReturnSummary
from system.parameters.store import CHECKPOINT_SUFFIX, LATEST, ParameterStore


@dataclass
class EvaluationResult:
    """Greedy returns of ``episodes`` episodes, each environment playing its own quota
    (:mod:`system.eval_quota`): no bias for short episodes, and each episode seeded apart."""

    episodes: int
    mean_return: float
    std_return: float
    """The sample standard deviation of the returns."""
    min_return: float
    max_return: float
    versions: dict[str, int]
    per_policy: dict[str, float]
    ci95_low: float | None = 0.0
    ci95_high: float | None = 0.0
    """The 95% interval of the mean (Student's t); None for a single episode."""
    results: dict[str, float] = dataclasses.field(default_factory=dict)
    """``a_vs_b``: policy ``a``'s mean score against ``b`` (1 a win, 0.5 a draw) in the games
    they played each other (multi-agent runs)."""
    policy: str | None = None
    """Whose returns the figures above are (``evaluation.policy``, or a PBT run's member);
    None: every agent's together."""
    curriculum_stage: int | None = None
    """The curriculum stage the episodes were played in: the one the run had reached."""
    env_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    """``evaluation.env_args``: what the environments played had over training's arguments."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def locate(target: str | Path) -> tuple[Path, dict[str, int]]:
    """The run folder, and the versions to load (``{policy: version}``; a policy not named
    there: its latest) for a run folder or a checkpoint file.

    A run folder's pinned version is the one its run was solved with (``summary.json``'s
    ``solved_version``: the version the confirming evaluation windows held); a checkpoint file
    pins its own policy's."""
    path = Path(target)
    if path.is_dir():
        return path, _solved_version(path)
    if path.is_file() and path.suffix == CHECKPOINT_SUFFIX:
        run_dir = path.resolve().parents[2] if len(path.resolve().parents) > 2 else None
        if run_dir is None or not (run_dir / run_folder.CONFIG).is_file():
            raise UserError(
                f"{path} is evaluated from inside its run folder, whose config.json says how to "
                f"build its environment and policy (runs/<name>/checkpoints/<policy>/"
                f"vNNNNNNNN{CHECKPOINT_SUFFIX})"
            )
        if path.stem == "latest":  # what the policy's newest version is: it plays that
            return run_dir, {}
        if path.stem.startswith("trainer"):
            raise UserError(
                f"{path} is its trainer's state (the optimizer's too), not a version of the "
                f"policy: evaluate a v*{CHECKPOINT_SUFFIX} or latest{CHECKPOINT_SUFFIX} beside it"
            )
        try:
            return run_dir, {path.parent.name: int(path.stem.removeprefix("v"))}
        except ValueError as e:
            raise UserError(f"{path} is not a checkpoint written by a Troupe run") from e
    raise UserError(
        f"{path} is neither a run folder nor a checkpoint file (runs/<name>/checkpoints/<policy>/"
        f"vNNNNNNNN{CHECKPOINT_SUFFIX})"
    )


def _solved_version(run_dir: Path) -> dict[str, int]:
    try:
        summary = json.loads((run_dir / run_folder.SUMMARY).read_text())
    except (OSError, ValueError):
        return {}  # a run still going, or stopped before it wrote its summary
    solved = summary.get("solved_version") if isinstance(summary, dict) else None
    if not isinstance(solved, dict):
        return {}
    policy, version = solved.get("policy"), solved.get("version")
    return {policy: version} if isinstance(policy, str) and type(version) is int else {}


def earlier_solve_words(target: str | Path) -> str | None:
    """For a run folder resumed after it was solved and not solved again: which version was,
    since its evaluation plays the latest (``summary.json``'s ``earlier_solved_version``)."""
    path = Path(target)
    try:
        summary = json.loads((path / run_folder.SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    earlier = summary.get("earlier_solved_version") if isinstance(summary, dict) else None
    if not isinstance(earlier, dict) or "solved_version" in summary:
        return None
    words = (
        f"the latest versions play: this run was resumed after version {earlier.get('version')} "
        f"of '{earlier.get('policy')}' solved it, and was not solved again"
    )
    if earlier.get("checkpoint"):
        return f"{words}; to play that one: troupe eval {path / earlier['checkpoint']}"
    return f"{words}; that version's checkpoint file is no longer kept"


def load_run(run_dir: Path) -> tuple[ExperimentConfig, ParameterStore]:
    from system.run.resume_check import check_checkpoints, saved_config

    config_file = run_dir / run_folder.CONFIG
    if not config_file.exists():
        raise UserError(f"{run_dir} is not a run folder: it has no config.json")
    config = saved_config(run_dir)
    check_checkpoints(run_dir, config, trainer_state=False)  # damaged named; none good: 1 line
    load_code(config.code)
    store = ParameterStore(run_dir)
    if not store.load_from_disk():
        where = f"checkpoints/<policy>/v*{CHECKPOINT_SUFFIX}"
        raise UserError(f"{run_dir} holds no checkpoint yet ({where})")
    return config, store


def evaluate(
    target: str | Path, episodes: int = 20, envs: int = 8, seed: int | None = None
) -> EvaluationResult:
    """Run ``episodes`` greedy episodes with the saved parameters of every policy.

    ``seed``: where the episodes' seeds come from (default: the run's own ``seed``, so an
    evaluation replays exactly). Another gives other episodes: a second opinion on a run
    whose evaluation actor, seeded as this one, played the same starts.

    A PBT run's members each play ``episodes`` (one evaluation actor each: an actor plays one
    member); the figures are those of one member (``policy``): the one a checkpoint file
    names, else the run's best (its summary's ``pbt.best_member``), else the first."""
    from system.run.serial import SerialRun

    for name, value in (("episodes", episodes), ("envs", envs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{name} must be a whole number of at least 1, got {value!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise UserError(f"seed must be a whole number of at least 0, got {seed!r}")

    run_dir, pinned = locate(target)
    config, store = load_run(run_dir)
    members = list(config.pbt.members)
    evaluation = dataclasses.replace(
        config.evaluation,
        workers=max(1, len(members)),
        envs_per_worker=max(1, min(envs, episodes)),
    )
    config = dataclasses.replace(config, evaluation=evaluation)
    if seed is not None:
        config = dataclasses.replace(config, seed=seed)
    chosen, versions = _select(store, config, pinned)
    run = SerialRun(config, store=chosen, train=False)
    stage = curriculum_stage(run_dir, config)
    for env in (env for actor in run.actors for env in actor.envs) if stage else ():
        env.set_curriculum_stage(stage["stage"])  # before the first reset, which applies it
    try:
        done = run.eval_until(episodes * max(1, len(members)))
    finally:
        run.close()
    judged_policy = _best_member(run_dir, members, pinned) if members else config.evaluation.policy
    judged = f"policy/{judged_policy}/episode_return" if judged_policy else "episode_return"
    returns = np.array([e[judged] for e in done if judged in e], dtype=np.float64)
    keys = sorted({k for e in done for k in e})
    per_policy = {k.split("/")[1]: _mean(done, k) for k in keys if k.startswith("policy/")}
    results = {k.split("/", 1)[1]: _mean(done, k) for k in keys if k.startswith("result/")}
    summary = ReturnSummary.of(list(returns))
    return EvaluationResult(
        results=results,
        episodes=len(returns),
        mean_return=summary.mean,
        std_return=summary.std,
        min_return=float(returns.min()),
        max_return=float(returns.max()),
        versions=versions,
        per_policy=per_policy,
        ci95_low=summary.ci95_low,
        ci95_high=summary.ci95_high,
        policy=judged_policy or None,
        curriculum_stage=int(stage["index"]) if stage else None,
        env_args=dict(config.evaluation.env_args),
    )


def curriculum_stage(run_dir: Path, config: ExperimentConfig) -> dict[str, Any] | None:
    """The stage a run's curriculum had reached (``{"index": i, "stage": what the environments
    are told}``, from its saved global state); None without a curriculum. Evaluation played
    stage 0: a run solved at 500 in its last stage was reported at 100."""
    if not config.curriculum.metric:
        return None
    from system.run.coordination.state import StateStore

    value, _ = StateStore.load(run_dir).get(config.curriculum.key)
    return value if isinstance(value, dict) and {"index", "stage"} <= set(value) else None


def played_policy(run_dir: Path, config: ExperimentConfig, pinned: dict[str, int]) -> str:
    """The one policy that plays a run where one is asked for (``load_policy``, ``troupe eval
    --video``): a checkpoint file's own, else the one :func:`evaluate` reports (a PBT run's
    best member, ``evaluation.policy``), else the first trained one. ``load_policy`` of a PBT
    run took its first member, whatever the summary's best: a video of ``member0`` (117 a
    game) under a report of ``member3``'s 317."""
    trained = [name for name, pc in config.policies.items() if pc.trainer.type]
    if len(pinned) == 1 and next(iter(pinned)) in config.policies:  # a file, a solved version
        return next(iter(pinned))
    if config.pbt.members:
        return _best_member(run_dir, list(config.pbt.members), pinned)
    if config.evaluation.policy in config.policies:
        return config.evaluation.policy
    return (trained or list(config.policies))[0]


def _best_member(run_dir: Path, members: list[str], pinned: dict[str, int]) -> str:
    """The PBT member whose figures an evaluation reports (see :func:`evaluate`)."""
    if len(pinned) == 1 and next(iter(pinned)) in members:  # a member's checkpoint file
        return next(iter(pinned))
    try:
        best = json.loads((run_dir / run_folder.SUMMARY).read_text())["pbt"]["best_member"]
    except (OSError, ValueError, KeyError, TypeError):
        best = None
    return best if best in members else members[0]


def _mean(episodes: list[dict[str, Any]], key: str) -> float:
    return float(np.mean([e[key] for e in episodes if key in e]))


def _select(
    store: ParameterStore, config: ExperimentConfig, pinned: dict[str, int]
) -> tuple[ParameterStore, dict[str, int]]:
    """An in-memory store holding just the version to evaluate of every trained policy: the
    pinned one, else the latest (frozen and scripted policies have none: they play as they were
    built, a self-play opponent from the learner's)."""
    chosen, versions = ParameterStore(), {}
    trained = [name for name, pc in config.policies.items() if pc.trainer.type]
    for name in trained:
        number, params = store.get(name, pinned.get(name, LATEST))
        chosen.publish(name, number, params)
        versions[name] = number
    return chosen, versions
