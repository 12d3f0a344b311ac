"""What ``troupe run`` says at a run's end beyond its summary's figures: what the exit code
means where it is none of a run's own, and the summary's warnings (a policy never trained,
workers restarted, workers that did not stop in order or were never ready), each one line, in
words. A cluster's controller prints the same at its end (:func:`print_summary`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from distributed.launch.signals import EXIT_ABANDONED, EXIT_FAILED, EXIT_INTERRUPTED

SUMMARY_KEYS = ("solved", "stop_reason", "wall_s", "env_frames", "emulator_frames", "fps",
                "best_eval_return")  # fmt: skip
"""What a run's end prints of its summary (``emulator_frames`` where the run counts them)."""


def print_summary(summary: dict[str, Any], console: Console) -> None:
    """A run's end: its figures, how it was solved, its warnings and its failure, as ``troupe
    run`` and a cluster's controller (``troupe controller``) print them."""
    console.print(
        {k: summary.get(k) for k in SUMMARY_KEYS if k in summary or k != "emulator_frames"}
    )
    if summary.get("confirmation"):
        console.print(f"solved: {summary['confirmation']}")
    for line in warning_lines(summary):
        console.print(Text(line, style="yellow"), soft_wrap=True)
    if summary.get("failure"):
        console.print(Text(f"run failed: {summary['failure']}", style="red"))


def warning_lines(summary: dict[str, Any]) -> list[str]:
    """The lines a summary's warnings make, in the order they are printed."""
    lines = []
    if summary.get("untrained"):
        lines.append(untrained_line(summary))
    if summary.get("restarts"):
        lines.append(restarts_line(summary["restarts"]))
    if summary.get("unstopped"):
        lines.append(unstopped_line(summary["unstopped"]))
    if summary.get("never_ready"):
        lines.append(never_ready_line(summary["never_ready"]))
    if summary.get("no_greedy_episode"):
        ended = summary.get("best_episode_return") is not None or not summary.get("env_frames")
        lines.append(NO_GREEDY_EPISODE_LINE if ended else no_episode_line(summary))
    if summary.get("few_greedy_episodes"):
        lines.append(few_greedy_episodes_line(summary["few_greedy_episodes"]))
    return lines


NO_GREEDY_EPISODE_LINE = (
    "no greedy episode ended before the run stopped, so it has no evaluation return: give it "
    "more time (a whole Atari game is minutes at evaluation; evaluation.max_fps, where set, "
    "slows it), or a time limit where its environment has none: a greedy policy may go round "
    "in circles where a sampling one gets out (environment.args.max_episode_steps=N for a "
    "gymnasium id)"
)
"""What a summary's ``no_greedy_episode`` says (system.run.finish)."""


def no_episode_line(summary: dict[str, Any]) -> str:
    """What a summary's ``no_greedy_episode`` says where no training episode ended either:
    ``troupe train CliffWalking-v1``, whose gymnasium id sets no time limit and whose cliff
    sends the agent back to the start, ran 22,688 frames without one, and was told to give
    its evaluation more time."""
    return (
        f"no episode ended in {summary['env_frames']:,} frames, neither a training nor a greedy "
        "one, so the run has no return: an environment without a time limit may never end one "
        "(give it one: environment.args.max_episode_steps=N for a gymnasium id), or give it "
        "more time"
    )


def few_greedy_episodes_line(few: dict[str, Any]) -> str:
    """What a summary's ``few_greedy_episodes`` says (system.run.finish)."""
    return (
        f"only {few.get('ended')} of the {few.get('needed')} greedy episodes an evaluation "
        "return is the mean of ended before the run stopped, so it has none: give it more "
        "time, or fewer evaluation.episodes"
    )


def container_code(code: int, run_dir: Path, console: Console) -> int:
    """A Docker run's exit code from its controller container's, said in words where it is
    none of a run's own (0, 1, 130, 131): 128+N when the container was killed by signal N, as
    a local controller killed so gives (137: ``docker kill``, or out of memory), else 1 (127:
    the image has no ``troupe`` to run). Both used to come back bare."""
    if code <= EXIT_FAILED or code in (EXIT_INTERRUPTED, EXIT_ABANDONED):
        return code
    if code > 128:
        why = ": docker kill, or out of memory" if code == 137 else ""
        said = (
            f"the controller's container was killed (signal {code - 128}{why}); every container "
            f"of the run was removed. Continue with: troupe run --resume {run_dir} --launcher "
            "docker"
        )
    else:
        why = {126: "its command could not run", 127: "its command was not found"}.get(code, "")
        said = (
            f"the controller's container ended with exit code {code}"
            + (f" ({why} in the image: rebuild it with `troupe image build`)" if why else "")
            + "; see its lines above"
        )
        code = EXIT_FAILED
    console.print(Text(said, style="red"), soft_wrap=True)
    return code


def untrained_line(summary: dict[str, Any]) -> str:
    """What a summary's ``untrained`` says: its policies whose trainer never stepped."""
    return (
        f"never trained: no trainer step for {', '.join(summary['untrained'])} in "
        f"{summary.get('env_frames') or 0:,} frames (episodes dropped or environments rebuilt "
        "send no samples: see worker_health/ in metrics.jsonl; or the run ended before its "
        "replay buffer's learning start)"
    )


def unstopped_line(unstopped: dict[str, str]) -> str:
    """What a summary's ``unstopped`` says: the workers that did not stop in order."""
    gone = "; ".join(f"{worker} ({why})" for worker, why in unstopped.items())
    return f"workers that did not stop in order (see their logs): {gone}"


def never_ready_line(workers: list[str]) -> str:
    """What a summary's ``never_ready`` says: workers the run stopped before they were built."""
    evaluation = any(w.startswith("eval/") for w in workers)
    they = "it" if len(workers) == 1 else "they"
    return (
        f"never ready: {', '.join(workers)} still starting when the run stopped, so {they} did "
        "nothing (see their logs)" + ("; no greedy evaluation was played" if evaluation else "")
    )


def restarts_line(restarts: dict[str, dict[str, Any]]) -> str:
    """``workers restarted during the run: actor/0 3 times (last: ValueError: ...)``."""
    parts = [
        f"{worker} {n} time{'s' if n != 1 else ''} (last: {info.get('last_cause', '?')})"
        for worker, info in restarts.items()
        for n in [int(info.get("restarts") or 0)]
    ]
    return "workers restarted during the run: " + "; ".join(parts)
