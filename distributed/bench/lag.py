"""``troupe bench lag``: IMPALA (V-trace) against plain PPO at the same, forced, policy lag.

Both learn CartPole-v1 in serial mode (every production worker in one process, so a run is
reproducible and the lag is set, not left to how busy the machine is) with cartpole-impala's
actors, network and batches; only the trainer differs (``impala``, or ``ppo`` with the same
learning rate, minibatches and clipping of the gradient norm, GAE and 4 epochs). The policy worker
acts with the version ``lag`` behind the newest one published (:class:`LaggedParameters`), as
one that a busy trainer outruns would; the trainer's own ``policy_lag_mean`` statistic measures
the lag the samples really had.

A seed is solved when the mean return of the last :data:`WINDOW` training episodes reaches
:data:`TARGET` within the frame budget; frames to solve are counted at that moment.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distributed.bench.rows import Row
from system.parameters.inproc import InprocParameterService
from system.parameters.store import LATEST, ParameterStore, check_policy_name

TARGET = 475.0
WINDOW = 50
POLICY = "default"

VARIANTS: dict[str, tuple[str, list[str]]] = {
    "impala": ("cartpole-impala", []),
    "ppo": ("cartpole-impala", ["policies.default.trainer.type=ppo"]),
    "ppo-vtrace": (
        "cartpole-impala",
        ["policies.default.trainer.type=ppo", "policies.default.trainer.args.vtrace=true"],
    ),
}
"""What is compared: an experiment and its overrides. ``ppo-vtrace`` (asynchronous PPO with
V-trace targets, as Sample Factory's APPO) is there to be asked for by name."""


class LaggedParameters(InprocParameterService):
    """A parameter client that hands out the version ``lag`` behind the newest in the store
    (the oldest one while fewer than ``lag`` have been published)."""

    def __init__(self, store: ParameterStore, lag: int):
        super().__init__(store)
        self.lag = lag
        self._first: dict[str, int] = {}

    def _lagged(self, policy: str) -> int | None:
        newest = self.store.latest_version(policy)
        if newest is None:
            return None
        first = self._first.setdefault(policy, newest)
        return max(first, newest - self.lag)

    def get(self, policy, version=LATEST, *, timeout_s=0.0):
        lagged = self._lagged(policy) if version == LATEST else None
        if lagged is None:
            return super().get(policy, version, timeout_s=timeout_s)
        number, params = super().get(policy, lagged, timeout_s=timeout_s)
        self._hand_out(policy, number)
        return number, params

    def poll_latest(self, policy: str, *, timeout_s: float = 0.0) -> tuple[int, Any] | None:
        check_policy_name(policy)
        number = self._lagged(policy)
        if number is None or not self._is_new(policy, number):
            return None
        return self.get(policy)


@dataclass
class LagRun:
    variant: str
    lag: int
    seed: int
    solved: bool
    frames: int
    """Frames to solve, or the frames played when the budget ran out."""
    policy_lag_mean: float
    policy_lag_max: float
    final_return: float
    wall_s: float


def lagged_run(variant: str, lag: int, seed: int, budget_frames: int) -> LagRun:
    """Train one seed of ``variant`` with its policy worker ``lag`` versions behind."""
    import torch

    from api.config import make_experiment
    from system.roles import Role
    from system.run.serial import SerialRun

    torch.set_num_threads(1)
    experiment, overrides = VARIANTS[variant]
    # the lag is forced here: no warning that the trainer cannot keep up
    lagged = [f"seed={seed}", "policies.default.warn_policy_lag=None", *overrides]
    config = make_experiment(experiment, lagged)
    store = ParameterStore(keep=lag + 2)  # the lagged version must still be in memory
    run = SerialRun(config, store=store)
    started = time.perf_counter()
    try:
        run.poll()  # the trainer publishes its first version
        for worker in run.workers_of(Role.POLICY):
            worker.reconnect(LaggedParameters(store, lag))
        progress = run.run(env_frames=budget_frames, until_return=TARGET, return_window=WINDOW)
    finally:
        run.close()
    final = progress.recent_return(WINDOW) or 0.0
    stats = progress.trainer_stats.get(POLICY, [])
    lags = [s["policy_lag_mean"] for s in stats if "policy_lag_mean" in s]
    peaks = [s["policy_lag_max"] for s in stats if "policy_lag_max" in s]
    return LagRun(
        variant=variant,
        lag=lag,
        seed=seed,
        solved=len(progress.episodes) >= WINDOW and final >= TARGET,
        frames=progress.env_frames,
        policy_lag_mean=float(np.mean(lags)) if lags else float("nan"),
        policy_lag_max=float(max(peaks)) if peaks else float("nan"),
        final_return=final,
        wall_s=time.perf_counter() - started,
    )


def summarise(runs: list[LagRun]) -> list[dict[str, Any]]:
    """One line per (variant, lag): solve rate, median frames to solve, mean lag."""
    lines = []
    for key in dict.fromkeys((r.variant, r.lag) for r in runs):
        group = [r for r in runs if (r.variant, r.lag) == key]
        solved = [r for r in group if r.solved]
        lines.append(
            {
                "variant": key[0],
                "forced_lag": key[1],
                "solved": len(solved),
                "of": len(group),
                "frames_to_solve": sorted(r.frames for r in solved),
                "median_frames_to_solve": statistics.median(r.frames for r in solved)
                if solved
                else None,
                "policy_lag_mean": float(np.mean([r.policy_lag_mean for r in group])),
                "policy_lag_max": max(r.policy_lag_max for r in group),
                "final_returns": [round(r.final_return, 1) for r in group],
            }
        )
    return lines


# --------------------------------------------------------------------- running and reporting
LAGS = (8,)
"""Forced lags of the suite: 8 versions is about what cartpole-ppo's 2 actors x 32 environments
reach as separate processes on a 2-core machine (BENCHMARKS.md: 4-9)."""
FULL_SEEDS, FULL_BUDGET = 3, 300_000
QUICK_SEEDS, QUICK_BUDGET = 1, 20_000


def run_all(
    variants: list[str], lags: list[int], seeds: int, budget_frames: int, workers: int
) -> list[LagRun]:
    """Every (variant, lag, seed), ``workers`` at a time, each in its own process (spawned:
    serial mode imports torch, and a fork of a process that has is not safe)."""
    jobs = [
        (v, lag, seed, budget_frames) for lag in lags for v in variants for seed in range(seeds)
    ]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        return list(pool.map(_run_job, jobs))


def _run_job(job: tuple[str, int, int, int]) -> LagRun:
    return lagged_run(*job)


def rows(lines: list[dict[str, Any]], budget_frames: int) -> list[Row]:
    out = []
    for line in lines:
        frames = line["median_frames_to_solve"]
        figure = (
            f"{line['solved']} of {line['of']} solved; median frames to solve "
            f"{'n/a' if frames is None else f'{frames:,.0f}'}; policy_lag_mean "
            f"{line['policy_lag_mean']:.1f} (max {line['policy_lag_max']:.0f})"
        )
        what = (
            f"CartPole-v1 {line['variant']}, forced lag {line['forced_lag']}: return >= "
            f"{TARGET:g} over {WINDOW} episodes within {budget_frames:,} frames"
        )
        out.append(Row("lag", what, figure))
    return out


def suite(size, workdir: Path, context: dict) -> tuple[dict, list[Row]]:
    """The ``lag`` suite of ``troupe bench``: impala and ppo at :data:`LAGS`."""
    quick = size.seeds == 1 and size.by_frames
    seeds, budget = (QUICK_SEEDS, QUICK_BUDGET) if quick else (FULL_SEEDS, FULL_BUDGET)
    workers = len(os.sched_getaffinity(0))
    runs = run_all(["impala", "ppo"], list(LAGS), seeds, budget, workers)
    lines = summarise(runs)
    figures = {"budget_frames": budget, "runs": [asdict(r) for r in runs], "summary": lines}
    return figures, rows(lines, budget)


def main(argv: list[str] | None = None) -> None:
    """``python -m distributed.bench.lag``: the same comparison with every knob exposed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=["impala", "ppo"], choices=VARIANTS)
    parser.add_argument("--lags", nargs="+", type=int, default=list(LAGS))
    parser.add_argument("--seeds", type=int, default=FULL_SEEDS)
    parser.add_argument("--budget", type=int, default=FULL_BUDGET, help="frames per run")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--json", metavar="FILE", help="also write every run's figures here")
    args = parser.parse_args(argv)
    if any(lag < 0 for lag in args.lags):
        parser.error(f"--lags must be 0 or more, got {args.lags}")
    runs = run_all(args.variants, args.lags, args.seeds, args.budget, args.workers)
    for r in runs:
        print(
            f"{r.variant:11s} lag {r.lag:2d} seed {r.seed}: solved={r.solved} frames {r.frames:,} "
            f"return {r.final_return:.1f} policy_lag_mean {r.policy_lag_mean:.1f} "
            f"max {r.policy_lag_max:.0f} ({r.wall_s:.0f} s)",
            flush=True,
        )
    lines = summarise(runs)
    print("| trainer | forced lag | solved | median frames to solve | policy_lag_mean (max) |")
    print("|---|---|---|---|---|")
    for line in lines:
        frames = line["median_frames_to_solve"]
        print(
            f"| {line['variant']} | {line['forced_lag']} | {line['solved']} of {line['of']} | "
            f"{'n/a' if frames is None else f'{frames:,.0f}'} | "
            f"{line['policy_lag_mean']:.1f} ({line['policy_lag_max']:.0f}) |"
        )
    if args.json:
        payload = {"runs": [asdict(r) for r in runs], "summary": lines, "budget": args.budget}
        Path(args.json).write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
