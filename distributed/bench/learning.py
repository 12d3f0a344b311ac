"""``troupe bench learning``: the short reference tasks, each run to its target as a user runs it.

Each task is one ``troupe run`` (every role its own process) stopped by its own rule: a greedy
target met by one version in consecutive windows of fresh episodes. What is reported is what
the run's ``summary.json`` says of the moment it met the target (``frames_to_target``,
``wall_s_to_target``, the controller's clock) beside stored reference figures:

- the CleanRL-style peers (``../shared/peers/dqn.py``, ``sac_continuous.py``, CleanRL's defaults,
  seeds 1 and 2) run on the 2-core AMD EPYC VM of BENCHMARKS.md in the session that added this
  suite (2026-11-27); their stop rule is a mean over training episodes (the last 20, or 10 for
  SAC), not greedy windows;
- CleanRL's published returns within its budgets, where it publishes one for the task (its
  documentation, https://docs.cleanrl.dev, and its model cards on huggingface.co/cleanrl).

Wall seconds depend on the machine; frames do not. Several seeds (``--seeds``) give min /
median / max.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distributed.bench.rows import Row
from distributed.bench.runs import watch_run


@dataclass(frozen=True)
class Task:
    label: str
    experiment: str
    overrides: tuple[str, ...]
    cap_s: float
    """A run not solved by then is stopped and counted unsolved."""
    reference: str
    """What the task's figures are read against (see the module)."""


TASKS = (
    Task("CartPole-v1, PPO", "cartpole-ppo", (), 300.0,
         "CleanRL ppo.py: 490.0 +- 6.1 within 500k steps (published)"),
    Task("CartPole-v1, IMPALA", "cartpole-impala", (), 300.0,
         "no IMPALA in CleanRL; its ppo.py row is the nearest"),
    Task("CartPole-v1, DQN", "cartpole-dqn", (), 600.0,
         "CleanRL dqn.py: 488.7 +- 16.1 within 500k steps (published); the CleanRL-style "
         "dqn.py here: 219,614 / 229,356 frames, 27.4 / 28.8 s"),
    Task("Acrobot-v1, DQN (troupe train --algo dqn)", "dqn", ("env=Acrobot-v1",), 600.0,
         "CleanRL's published dqn.py model (huggingface.co/cleanrl/Acrobot-v1-dqn-seed1): "
         "-96.8 +- 21.9 after 500k steps; the CleanRL-style dqn.py here (target -100): "
         "211,454 frames, 33.9 s"),
    Task("MountainCar-v0, DQN preset (troupe train MountainCar-v0)", "auto",
         ("env=MountainCar-v0",), 600.0,
         "the CleanRL-style dqn.py here (CleanRL's defaults, target -110): not solved in 500k "
         "frames, last 20 episodes -184.1"),
    Task("MountainCarContinuous-v0, SAC preset (troupe train MountainCarContinuous-v0)", "auto",
         ("env=MountainCarContinuous-v0",), 600.0,
         "no CleanRL figure for this task; uniform random actions reached the flag in 0 of 30 "
         "episodes here"),
    Task("Pendulum-v1, SAC", "pendulum-sac", (), 600.0,
         "the CleanRL-style sac_continuous.py here: 9,400 / 9,800 frames, 58.5 / 62.0 s"),
)  # fmt: skip
QUICK_CAP_S = 20.0
"""With ``--quick`` every task is capped here: the command is proven, nothing is learnt."""


def suite(size, workdir: Path, context: dict) -> tuple[dict, list[Row]]:
    """Every task of :data:`TASKS`, ``size.seeds`` seeds each (one with ``--quick``)."""
    quick = size.by_frames
    figures: dict[str, Any] = {}
    rows = []
    for task in TASKS:
        cap = QUICK_CAP_S if quick else task.cap_s
        seeds = [_run(task, seed, cap, workdir) for seed in range(size.seeds)]
        figures[task.label] = {"cap_s": cap, "seeds": seeds, "reference": task.reference}
        rows.append(Row("learning", task.label, _summary(seeds), task.reference))
    return figures, rows


def _run(task: Task, seed: int, cap_s: float, workdir: Path) -> dict[str, Any]:
    overrides = [*task.overrides, f"seed={seed}", f"stop.wall_seconds={cap_s}"]
    name = f"learning-{task.experiment}-{len(task.overrides)}-seed{seed}"
    run = watch_run(task.experiment, overrides, workdir / name, deadline_s=cap_s + 120.0)
    summary = run.summary
    return {
        "seed": seed,
        "solved": bool(summary.get("solved")),
        "target": summary.get("target"),
        "frames_to_target": summary.get("frames_to_target"),
        "wall_s_to_target": summary.get("wall_s_to_target"),
        "command_s": run.exit_s,
        "stop_reason": summary.get("stop_reason"),
    }


def _summary(seeds: list[dict[str, Any]]) -> str:
    solved = [s for s in seeds if s["solved"]]
    text = f"{len(solved)} of {len(seeds)} solved"
    if not solved:
        return text
    frames = [s["frames_to_target"] for s in solved if s["frames_to_target"] is not None]
    wall = [s["wall_s_to_target"] for s in solved if s["wall_s_to_target"] is not None]
    if frames:
        text += f"; frames {_spread(frames, ',.0f')}"
    if wall:
        text += f"; wall {_spread(wall, '.1f')} s"
    return text


def _spread(values: list[float], fmt: str) -> str:
    """``median`` of one value, ``min / median / max`` of several."""
    if len(values) == 1:
        return format(values[0], fmt)
    return " / ".join(format(v, fmt) for v in (min(values), statistics.median(values), max(values)))
