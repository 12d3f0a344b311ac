"""``troupe bench``: throughput, time-to-solve, latency, push, scaling and memory, in one table.

    troupe bench                      # every suite, full size (about 10-15 minutes on 2 cores)
    troupe bench throughput latency   # some suites
    troupe bench pixels               # Pong end to end against the raw emulator (atari extra)
    troupe bench pixels --actors auto --envs 8 --device cuda   # ... in a layout of your own
    troupe bench pixels --precision bfloat16   # ... with the trainer under bfloat16 autocast
    troupe bench pixels --device cuda --trainer-graphs   # ... its minibatch steps as CUDA graphs
    troupe bench pixels --experiment pong-ppo-gpu       # ... another Atari recipe, as it ships
    troupe bench --quick --json b.json  # every suite at minimum size: proves the command works

Each suite lives in :mod:`distributed.bench.suites`; whole runs are watched by
:mod:`distributed.bench.runs`, round trips are timed by :mod:`distributed.bench.micro`. The
machine is described in the output (cores, CPU model, load, versions), because figures only mean
something next to the machine that produced them; comparisons (end to end against the raw
environment rate) are made within one command run, as the machine may be shared and noisy.

A suite that fails is reported in the table and the JSON, the other suites still run, and the
command then exits with 1. Ctrl+C stops every run and process the bench started.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from api.errors import UserError

if TYPE_CHECKING:
    from distributed.bench.suites import Row

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_SUITE_FAILED, EXIT_INTERRUPTED = 0, 1, 130
SUITE_NAMES = ("throughput", "solve", "latency", "push", "scaling", "memory", "profile", "pixels")
"""The suites in their default order; :data:`distributed.bench.suites.SUITES` runs them. Named
here so that building the ``troupe`` parser does not import the suites (numpy, multiprocessing)."""
EXTRA_SUITE_NAMES = ("lag", "learning")
"""Suites run only when named: ``lag`` trains CartPole to the target a dozen times, ``learning``
runs the short reference tasks to their targets (minutes each)."""


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "suites",
        nargs="*",
        metavar="SUITE",
        help=f"suites to run, in this order (default: {', '.join(SUITE_NAMES)}; also, only when "
        f"named: {', '.join(EXTRA_SUITE_NAMES)})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="every suite at minimum size (seconds each, one seed): proves the command works",
    )
    parser.add_argument("--json", metavar="FILE", help="also write every figure to this file")
    parser.add_argument(
        "--markdown", metavar="FILE", help="also write the table (markdown) to this file"
    )
    parser.add_argument(
        "--seeds", type=int, help="seeds of the solve suite (default: 5, or 1 with --quick)"
    )
    layout = parser.add_argument_group("pixels layout (the pong-ppo run of the pixels suite)")
    layout.add_argument(
        "--experiment",
        metavar="NAME",
        help="the Atari experiment to run instead of pong-ppo (e.g. pong-ppo-gpu); the "
        "options below override its layout",
    )
    layout.add_argument(
        "--actors", metavar="N", help="actor processes: a number, or auto (from the cores)"
    )
    layout.add_argument("--envs", type=int, metavar="N", help="environments per actor")
    layout.add_argument(
        "--device", metavar="DEVICE", help="policy device, e.g. cuda (the CPU if none is there)"
    )
    layout.add_argument(
        "--precision",
        choices=("float32", "bfloat16"),
        help="the trainer's precision (bfloat16: autocast; pays where the trainer's arithmetic "
        "is the limit, on CPUs with AMX; not on an H200 for Pong, BENCHMARKS.md)",
    )
    layout.add_argument(
        "--eager",
        action="store_true",
        help="with --device cuda, act through eager torch calls instead of CUDA graphs",
    )
    layout.add_argument(
        "--trainer-graphs",
        action="store_true",
        help="replay the trainer's minibatch steps as CUDA graphs (PPO's cuda_graphs; on a GPU)",
    )
    parser.add_argument(
        "--keep-runs",
        metavar="DIR",
        help="keep the run folders in DIR (default: a temporary folder, deleted at the end)",
    )


def run_bench(args: argparse.Namespace, console: Console) -> int:
    """Run the chosen suites, print the table, write the JSON; 1 if a suite failed."""
    from rich.markdown import Markdown

    from distributed.bench import runs as bench_runs
    from distributed.bench.suites import FULL, QUICK, SUITES, Row
    from system.run.report import jsonable

    names = list(args.suites) or default_suites()
    known = SUITE_NAMES + EXTRA_SUITE_NAMES
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UserError(f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    size = QUICK if args.quick else FULL
    if args.seeds is not None:
        if args.seeds < 1:
            raise UserError(f"--seeds must be at least 1, got {args.seeds}")
        size = dataclasses.replace(size, seeds=args.seeds)
    workdir = Path(args.keep_runs or tempfile.mkdtemp(prefix="troupe-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    result: dict[str, Any] = {
        "machine": machine_info(),
        "quick": bool(args.quick),
        "size": dataclasses.asdict(size),
        "suites": {},
        "errors": {},
    }
    rows: list[Row] = []
    context: dict[str, Any] = {
        "pixels_overrides": layout_overrides(args),
        "pixels_experiment": args.experiment or "pong-ppo",
    }
    code = EXIT_OK
    try:
        for name in names:
            console.print(Text(f"bench: {name} ...", style="bold"), highlight=False)
            suite_started = time.monotonic()
            try:
                figures, suite_rows = SUITES[name](size, workdir, context)
            except Exception as e:  # one broken suite must not cost the others' figures
                logger.error("suite %s failed: %s", name, e, exc_info=True)
                error = f"{type(e).__name__}: {e}"
                result["errors"][name] = {"error": error, "traceback": traceback.format_exc()}
                rows.append(Row(name, "suite failed", " ".join(error.split())))
                code = EXIT_SUITE_FAILED
                continue
            figures["seconds"] = time.monotonic() - suite_started
            result["suites"][name] = figures
            rows += suite_rows
            console.print(f"  {name}: {figures['seconds']:.0f} s", highlight=False)
    except KeyboardInterrupt:
        console.print(Text("interrupted: stopping the bench's runs", style="red"))
        code = EXIT_INTERRUPTED
    finally:
        bench_runs.stop_all()
        if not args.keep_runs:
            shutil.rmtree(workdir, ignore_errors=True)
    result["machine"]["load_average_end"] = list(os.getloadavg())
    result["duration_s"] = time.monotonic() - started
    result["rows"] = [row.__dict__ for row in rows]
    table = markdown_table(rows, result["machine"])
    result["table_markdown"] = table
    console.print(Markdown(table))
    if args.json:
        Path(args.json).write_text(json.dumps(jsonable(result), indent=1) + "\n")
        console.print(f"figures written to {args.json}")
    if args.markdown:
        Path(args.markdown).write_text(table)
    return code


def layout_overrides(args: argparse.Namespace) -> list[str]:
    """``--actors``, ``--envs``, ``--device``, ``--precision`` and ``--trainer-graphs`` as
    overrides of the pixels suite's run. On a GPU the policy acts through CUDA graphs, as
    ``pong-ppo-gpu`` does, unless ``--eager`` (to compare)."""
    overrides = []
    if getattr(args, "actors", None) is not None:
        overrides.append(f"actors.workers={args.actors}")
    if getattr(args, "envs", None) is not None:
        if args.envs < 1:
            raise UserError(f"--envs must be at least 1, got {args.envs}")
        overrides.append(f"actors.envs_per_worker={args.envs}")
    if getattr(args, "device", None):
        overrides.append(f"policies.default.policy.args.device={args.device}")
        if args.device.startswith("cuda"):
            graphs = not getattr(args, "eager", False)
            overrides.append(f"policies.default.policy.args.cuda_graphs={graphs}")
    if getattr(args, "precision", None):
        overrides.append(f"policies.default.trainer.args.precision={args.precision}")
    if getattr(args, "trainer_graphs", False):
        overrides.append("policies.default.trainer.args.cuda_graphs=True")
    return overrides


def default_suites() -> list[str]:
    """Every suite; ``pixels`` only where the atari extra is installed (it needs ale-py)."""
    from importlib.util import find_spec

    return [n for n in SUITE_NAMES if n != "pixels" or find_spec("ale_py") is not None]


def markdown_table(rows: list[Row], machine: dict[str, Any]) -> str:
    """The rows as a markdown table, under one line naming the machine."""
    lines = [
        f"Machine: {machine['cores']} cores, {machine['cpu_model']}; Python {machine['python']}, "
        f"torch {machine['torch']}, numpy {machine['numpy']}, pyzmq {machine['pyzmq']} "
        f"(libzmq {machine['libzmq']}); load average at start "
        f"{machine['load_average_start'][0]:.1f}; {machine['date']}; "
        f"troupe-rl {machine.get('troupe', '?')}, commit {machine['commit']}.",
        "",
        "| suite | figure | measured | target | met |",
        "|---|---|---|---|---|",
    ]  # fmt: skip
    for row in rows:
        met = "" if row.met is None else ("met" if row.met else "not met")
        cells = (row.suite, row.figure, row.measured, row.target, met)
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def machine_info() -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "cores": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "pyzmq": _version("pyzmq"),
        "libzmq": _libzmq(),
        "gymnasium": _version("gymnasium"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(),  # "unknown" where Troupe was installed without its checkout
        "troupe": _version("troupe-rl"),
        "load_average_start": list(os.getloadavg()),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _libzmq() -> str:
    import zmq

    return zmq.zmq_version()


def _commit() -> str:
    """The checked-out commit, with "+changes" when the tree differs from it."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = _git(root, "rev-parse", "--short", "HEAD")
        dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True
    )
    return done.stdout.strip()
