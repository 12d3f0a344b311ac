"""The end of a run: its summary (``summary.json``) and its plots, from what the controller knew.

A failure after a stop rule held or after Ctrl+C (a final checkpoint not written) leaves the
run incomplete all the same: the summary says ``stop_reason: failed`` and keeps the rule in
``stop_rule_met``, and the command's exit code follows the summary, not the rule.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from api.config import ExperimentConfig
from system import run_folder
from system.errors import WorkerFailure
from system.parameters.store import ParameterStore
from system.roles import WorkerState
from system.run import launch_end
from system.run.report import (
    build_summary,
    read_metrics,
    summarised,
    write_learning_curve,
    write_summary,
    write_win_rates,
)
from system.run.stopping import EvaluationWindows

logger = logging.getLogger(__name__)

TARGET_REASONS = ("eval_return", "pbt_target_return")
"""Stop reasons that are a target met: such a run is ``solved`` (a PBT population whose best
member reached ``pbt.target_return`` included)."""


def finish_run(
    config: ExperimentConfig,
    run_dir: Path,
    *,
    wall_s: float,
    stop_reason: str,
    stopped_at: tuple[int, float] | None = None,
    failure: WorkerFailure | None,
    evaluation: EvaluationWindows,
    extra: dict[str, Any],
    write: Callable[[Callable[[], Any]], bool],
    best_episode_return: float | None = None,
    restarts: dict[str, dict[str, Any]] | None = None,
    unstopped: dict[str, str] | None = None,
    never_ready: list[str] | None = None,
) -> dict[str, Any]:
    """Write the summary and plots with ``write`` (the controller's guard of the run folder);
    ``stopped_at``: env frames and wall seconds when the stopping rule held; ``extra``: what
    the coordination drivers add (curriculum stage, PBT, ratings); ``best_episode_return``:
    the best the controller saw in its records, written or not (``metrics.thin``);
    ``restarts``: the workers restarted during the run, how often and why (the supervisor's
    :func:`restarts_of`); ``unstopped``: those that did not stop in order
    (:func:`unstopped_of`); ``never_ready``: those still starting when the run stopped."""
    target, pbt_target = _target_of(config)
    solved = stop_reason in TARGET_REASONS
    failed_late = failure is not None and stop_reason != "failed"
    records = read_metrics(run_dir, summarised)  # once, for the summary and the plots
    summary = build_summary(
        records,
        solved=solved,
        wall_s=wall_s,
        target=target,
        stop_reason="failed" if failed_late else stop_reason,
        solved_at=stopped_at if solved else None,
    )
    best = summary["best_episode_return"]  # of the records written, this run's and before
    if best_episode_return is not None and (best is None or best_episode_return > best):
        summary["best_episode_return"] = best_episode_return
    if failed_late:
        summary["stop_rule_met"] = stop_reason
    summary.update(_how_workers_ended(failure, restarts, unstopped, never_ready))
    if summary["best_eval_return"] is None:
        summary.update(_too_few_greedy_episodes(config, evaluation, failure, never_ready or []))
    trained = [n for n, pc in config.policies.items() if pc.trainer.type]
    untrained = [n for n in trained if not summary["policy_versions"].get(n)]
    if untrained and summary.get("env_frames"):  # frames, but not one trainer step: exit 0
        summary["untrained"] = untrained
    if config.stop.eval_return is None and pbt_target is not None:
        summary["target_source"] = (
            "pbt.target_return: met when a member's score (its greedy return since its last "
            "exploit, pbt.scores) reaches it; eval_return is the evaluation policy's"
        )
    elif config.stop.target_source:
        summary["target_source"] = config.stop.target_source
    summary.update(extra)
    if launch_end.launch_id() is not None:  # its workers that Swarm restarts find the end here
        summary[launch_end.SUMMARY_KEY] = launch_end.launch_id()
    if summary.get("stop_reason") == launch_end.INTERRUPTED and launch_end.stop_asked_by():
        summary[launch_end.STOPPED_BY_KEY] = launch_end.stop_asked_by()
    summary.update(_solve_of(run_dir, stop_reason, evaluation))
    summary["summary_written"] = write(lambda: write_summary(run_dir, summary))
    logger.info(
        "run ended: %s after %.1fs, %s env frames%s", summary["stop_reason"], wall_s,
        summary.get("env_frames"), f" ({failure})" if failure is not None else "",
    )  # fmt: skip
    if summary["summary_written"]:
        write(lambda: write_learning_curve(run_dir, config.name, target=target, records=records))
        write(lambda: write_win_rates(run_dir, config.name, first=trained, records=records))
    return summary


def _target_of(config: ExperimentConfig) -> tuple[float | None, float | None]:
    """The return the run aims at (the population's where only PBT sets one), and PBT's."""
    pbt_target = config.pbt.target_return if config.pbt.members else None
    target = config.stop.eval_return
    return (pbt_target if target is None else target), pbt_target


def _how_workers_ended(
    failure: WorkerFailure | None,
    restarts: dict[str, dict[str, Any]] | None,
    unstopped: dict[str, str] | None,
    never_ready: list[str] | None,
) -> dict[str, Any]:
    """The summary's keys for workers that failed, were restarted, did not stop in order, or
    never became ready."""
    out: dict[str, Any] = {}
    if failure is not None:
        out["failure"] = str(failure)
    if restarts:
        out["restarts"] = restarts
    named = "" if failure is None else failure.worker  # its failure says why already
    unstopped = {w: why for w, why in (unstopped or {}).items() if w not in named.split(", ")}
    if unstopped:
        out["unstopped"] = unstopped
    if never_ready and failure is None:  # a run that failed says why it ended
        # a short run ended before they were built (a simulator slow to start): they did nothing
        out["never_ready"] = list(never_ready)
    return out


def _solve_of(run_dir: Path, stop_reason: str, evaluation: EvaluationWindows) -> dict[str, Any]:
    """How the target was confirmed and by which version; or, for a run resumed after it
    solved, the version that solved it before (read before this summary replaces it)."""
    out: dict[str, Any] = {}
    earlier = earlier_solve(run_dir)
    if stop_reason == "eval_return":
        out["confirmation"] = evaluation.describe()
        out["eval_window_means"] = list(evaluation.confirmed)
        if evaluation.solved_version is not None:
            out["solved_version"] = {
                "policy": evaluation.policy,
                "version": evaluation.solved_version,
            }
    if earlier is not None and "solved_version" not in out:
        out["earlier_solved_version"] = earlier
    return out


def failed_before_start(run_dir: Path, why: str) -> None:
    """Write the summary of a run whose controller could not even load it (its config or the
    user's code does not load where the controller runs): ``stop_reason: failed``, ``failure``
    saying why, the figures of the parts that ran before kept.

    Swarm starts a controller that exits non-zero again, and one that finds the same gap fails
    the same way: three failures, and workers looking for a controller all along. With this end
    of its launch in the folder, a start again says there is nothing to resume and exits 0, and
    the workers leave (:mod:`system.run.launch_end`). Best effort: a folder it cannot write
    leaves the error on the console alone."""
    try:
        records = read_metrics(run_dir, summarised)
        walls = [r["wall_s"] for r in records if isinstance(r.get("wall_s"), (int, float))]
        wall_s = walls[-1] if walls else 0.0
        summary = build_summary(
            records, solved=False, wall_s=wall_s, target=None, stop_reason="failed"
        )
        summary["failure"] = why
        if launch_end.launch_id() is not None:
            summary[launch_end.SUMMARY_KEY] = launch_end.launch_id()
        write_summary(run_dir, summary)
    except (OSError, ValueError) as e:
        logger.warning("could not write the run's summary: %s", e)


def restarts_of(workers: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each worker restarted during the run (the supervisor's records): how many times, and
    why it last was. A run that reached its goal through a worker that kept failing (each time
    after running long enough not to count as a crash loop) read as a clean one at its end,
    exit 0, with the restarts only in warnings among its log lines."""
    return {
        worker: {"restarts": record.restarts, "last_cause": record.restart_cause or "?"}
        for worker, record in workers.items()
        if record.restarts
    }


def unstopped_of(workers: Mapping[str, Any], now: float) -> dict[str, str]:
    """Each worker that did not stop in order (no bye: it had gone, or did not answer its
    stop), with how long before ``now`` it was last heard from. A Docker run whose actor
    container was killed half a minute before its end (before the heartbeat timeout) exited 0
    with nothing said of the actor; ``workers.json`` alone said ``failed``. So did one whose
    scheduler was still to bring it back (``awaited``; its ``last_seen``: when it was found
    gone). One whose error came as the run stopped is named with its error: "no stop in order"
    read as if it had gone silent."""
    unstopped = {}
    for worker, record in workers.items():
        if not record.came_up:
            continue
        if record.state is WorkerState.FAILED and record.failed_with:
            error = _error_name(record.failed_with)
            unstopped[worker] = f"failed as the run stopped, with {error}; not restarted"
        elif record.state is WorkerState.FAILED:
            unstopped[worker] = (
                f"no stop in order; last heard from {now - record.last_seen:.0f} s before the end"
            )
        elif record.state is WorkerState.RESTARTING and record.awaited:
            unstopped[worker] = (
                "gone; its scheduler had not brought it back "
                f"{now - record.last_seen:.0f} s after it was found gone"
            )
    return unstopped


def _error_name(message: str) -> str:
    """``NonFiniteError`` of ``NonFiniteError: environment ...``; else the message's start."""
    name = message.split(":", 1)[0]
    return name if name.isidentifier() else message[:60] + ("…" if len(message) > 60 else "")


def earlier_solve(run_dir: Path) -> dict[str, Any] | None:
    """What the summary a resumed run replaces says its run was solved with (its
    ``solved_version``, or the ``earlier_solved_version`` it carried itself), with the version's
    checkpoint file where it is still kept; None if it was not solved.

    A solved run resumed to train on (``stop.eval_return=None``) lost the record: its new
    summary had no ``solved_version``, and nothing said which version had met the target."""
    try:
        before = json.loads((run_dir / run_folder.SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(before, dict):
        return None
    solved = before.get("solved_version") or before.get("earlier_solved_version")
    if not isinstance(solved, dict):
        return None
    policy, version = solved.get("policy"), solved.get("version")
    if not isinstance(policy, str) or type(version) is not int:
        return None
    earlier: dict[str, Any] = {"policy": policy, "version": version}
    path = ParameterStore(run_dir).checkpoint_path(policy, version)
    if path.is_file():
        earlier["checkpoint"] = str(path.relative_to(run_dir))
    return earlier


def _too_few_greedy_episodes(
    config: ExperimentConfig,
    evaluation: EvaluationWindows,
    failure: WorkerFailure | None,
    never_ready: list[str],
) -> dict[str, Any]:
    """Why a run whose evaluation actors were up has no evaluation return (the caller checks
    that no earlier launch left one): ``no_greedy_episode`` when not one greedy episode ended
    (a 25-second Pong run: a whole game at evaluation is minutes on 2 cores), else
    ``few_greedy_episodes``, those that ended and the ``evaluation.episodes`` a return is the
    mean of (a short connect4-selfplay run ended 137 of its 300). Both runs ended with
    ``best_eval_return: None`` and no word of why. A failed run says why it ended; evaluation
    actors never ready are ``never_ready``'s to say."""
    if failure is not None or not config.evaluation.workers:
        return {}
    if any(w.startswith("eval/") for w in never_ready):
        return {}
    if not evaluation.count:
        return {"no_greedy_episode": True}
    needed = config.evaluation.episodes
    if evaluation.count < needed:
        return {"few_greedy_episodes": {"ended": evaluation.count, "needed": needed}}
    return {}
