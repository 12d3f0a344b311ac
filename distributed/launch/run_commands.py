"""``troupe test-pipeline``, ``troupe run`` and ``troupe eval``: the experiment commands."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.text import Text

from distributed.launch.arguments import add_import_argument, at_least_one
from system import run_folder

EXPERIMENT_HELP = (
    "registered experiment (cartpole-ppo), experiment file (exp.py, exp.yaml, exp.toml) or "
    "environment id (Acrobot-v1: the ppo experiment on it)"
)


# --------------------------------------------------------------------- troupe test-pipeline
def add_test_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", help=EXPERIMENT_HELP)
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key.path=value",
        help="config overrides, e.g. policies.default.trainer.args.lr=0.001",
    )
    add_import_argument(parser)

    parser.add_argument(
        "--trainer-steps", type=at_least_one, default=3, help="trainer steps to run, at least"
    )
    parser.add_argument(
        "--episodes", type=at_least_one, default=1, help="episodes to finish, at least"
    )
    add_algo_argument(parser, "test-pipeline")


def run_test_pipeline(args: argparse.Namespace, console: Console) -> int:
    """Environment, policy and trainer of an experiment together in one process, briefly."""
    import torch

    from api import testing
    from api.resolve import load_experiment

    torch.set_num_threads(1)
    config = load_experiment(*experiment_of(args), args.imports)
    report = testing.test_pipeline(
        experiment=config, trainer_steps=args.trainer_steps, episodes=args.episodes
    )
    console.print(Text(str(report), style="green"), highlight=False)
    return 0


# --------------------------------------------------------------------- troupe run
def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", nargs="?", help=EXPERIMENT_HELP)
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key.path=value",
        help="config overrides, e.g. actors.workers=4 seed=3",
    )
    add_import_argument(parser)
    parser.add_argument("--run-dir", help="run folder (default: runs/<experiment>-<time>)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a stopped run")
    add_metrics_argument(parser)
    parser.add_argument(
        "--no-display", action="store_true", help="plain progress lines instead of the live panel"
    )
    add_secure_and_docker_arguments(parser)


def add_secure_and_docker_arguments(parser: argparse.ArgumentParser) -> None:
    """``--secure``, ``--launcher`` and ``--image``, which ``troupe run`` and ``troupe train``
    share (``troupe.train`` took them; ``troupe train`` refused them as unrecognised)."""
    parser.add_argument(
        "--secure",
        action="store_true",
        help="CURVE-encrypt and authenticate every socket (keys made per run)",
    )
    add_docker_arguments(parser)


def add_docker_arguments(parser: argparse.ArgumentParser) -> None:
    """``--launcher`` and ``--image``: every role in its own container (``docker_run.py``)."""
    from distributed.images.build import DEFAULT_TAG
    from distributed.images.pinning import image_reference

    parser.add_argument(
        "--launcher",
        choices=("local", "docker"),
        default="local",
        help="local: every role as a process here; docker: every role in its own container",
    )
    parser.add_argument(
        "--image",
        type=image_reference,
        default=None,
        help=f"worker image for --launcher docker (default: {DEFAULT_TAG})",
    )


def experiment_and_overrides(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """``EXPERIMENT [key=value ...]``; with ``--resume RUN_DIR``, no experiment (the run's
    own config is resumed) and the overrides alone, the first of which argparse takes for the
    experiment (``--resume DIR key=value``)."""
    overrides = list(args.overrides)
    if not args.resume:
        return args.experiment, overrides
    if args.experiment and "=" in args.experiment:
        overrides.insert(0, args.experiment)
    elif args.experiment:
        _same_experiment(args.experiment, Path(args.resume))
    return None, overrides


def _same_experiment(named: str, run_dir: Path) -> None:
    """``troupe run pong-ppo --resume runs/cartpole`` resumed the CartPole run without a word
    of the Pong it named. The run's own experiment named again is fine; another is refused."""
    from api.errors import UserError

    try:
        own = json.loads((run_dir / run_folder.CONFIG).read_text()).get("name")
    except (OSError, ValueError, AttributeError):
        return  # not a run folder: the resume itself says so
    if named != own:
        raise UserError(
            f"--resume {run_dir} continues its own experiment, '{own}', not '{named}': drop "
            f"'{named}' (or start '{named}' in a run folder of its own)"
        )


def run_run(args: argparse.Namespace, console: Console) -> int:
    """A local mini experiment: every role in its own process, until the stopping rule."""
    from api.errors import UserError
    from distributed.launch.last_lines import container_code, print_summary
    from distributed.launch.run import check_keys, prepare, start, wait_local
    from system.run.prometheus import refuse_taken
    from system.run.report import SUMMARY_FILE

    if args.image is not None and args.launcher != "docker":  # it was ignored without a word
        raise UserError(
            "--image is the worker image of --launcher docker; a local run's workers are "
            "processes of this machine's Python"
        )
    experiment, overrides = experiment_and_overrides(args)
    refuse_taken(args.metrics_port)  # before the run folder is made
    config, run_dir = prepare(experiment, overrides, args.run_dir, args.resume, args.imports)
    check_keys(run_dir, args.secure)  # before a line is printed: a refusal is one line
    # soft_wrap: a path stays on one line for grep and scripts; a terminal wraps it for the eye
    console.print(f"run folder: {run_dir}", highlight=False, soft_wrap=True)
    from distributed.launch.run_lines import seats_line, stop_rule

    console.print(stop_rule(config.stop, pbt_target=config.pbt.target_return), highlight=False,
                  soft_wrap=True)  # fmt: skip
    if seats := seats_line(config.agent_policies):
        console.print(seats, highlight=False, soft_wrap=True)
    started = time.time()
    display = False if args.no_display else None
    process = start(
        config, run_dir, launcher=args.launcher, image=args.image, display=display,
        secure=args.secure, metrics_port=args.metrics_port,
    )  # fmt: skip
    code = wait_local(process)
    if code < 0 and args.launcher == "docker":  # the containers do not depend on it
        console.print(
            Text(
                f"the process that ran the run's containers was killed (signal {-code}); the "
                f"run goes on in them: `troupe ps {run_dir}` shows them, `troupe stop "
                f"{run_dir}` stops the run in order and removes them",
                style="red",
            ),
            soft_wrap=True,
        )
        return 128 - code
    if args.launcher == "docker":
        code = container_code(code, run_dir, console)
    if code < 0:  # the controller was killed: its workers leave by themselves
        console.print(
            Text(
                f"the controller process was killed (signal {-code}); its workers exit by "
                f"themselves. Continue with: troupe run --resume {run_dir}",
                style="red",
            )
        )
        code = 128 - code
    summary = _fresh_summary(run_dir / SUMMARY_FILE, started)
    if summary is None:
        # A resumed run's old summary.json is not this run's: never show it as the result.
        console.print(
            Text(f"no summary.json for this run in {run_dir} (see the error above)", style="red")
        )
        return code or 1
    print_summary(summary, console)
    written = [n for n in RESULT_FILES if (run_dir / n).exists()]
    console.print(f"results in {run_dir} ({', '.join(written)})", soft_wrap=True)
    return code


# --------------------------------------------------------------------- troupe train
def add_metrics_argument(parser: argparse.ArgumentParser) -> None:
    from system.run.prometheus import metrics_port

    parser.add_argument(
        "--metrics-port",
        type=metrics_port,
        metavar="PORT",
        help="serve Prometheus metrics at http://127.0.0.1:PORT/metrics while the run goes on "
        "(0: any free port, named in endpoints.json)",
    )


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    from api.algorithms import ALGORITHMS

    parser.add_argument("environment", help="registered environment or gymnasium id")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key.path=value",
        help="experiment arguments (target=-100 frames=200000) or config overrides",
    )
    add_import_argument(parser)
    parser.add_argument(
        "--algo",
        choices=ALGORITHMS,
        default="auto",
        help="the algorithm; its policy follows the spaces (ppo, impala: any actions; dqn: "
        "discrete; sac: continuous). auto (the default): ppo, or the preset tuned for ENV "
        "where PPO's defaults are known to fail (MountainCar-v0: DQN); on an Atari id "
        "(ALE/Breakout-v5) ppo, impala and dqn are the Atari recipes (DeepMind "
        "preprocessing, the Nature CNN)",
    )
    parser.add_argument("--run-dir", help="run folder (default: runs/<env>-<algo>-<time>)")
    add_metrics_argument(parser)
    parser.add_argument(
        "--no-display", action="store_true", help="plain progress lines instead of the live panel"
    )
    add_secure_and_docker_arguments(parser)


def run_train(args: argparse.Namespace, console: Console) -> int:
    """``troupe run ALGO env=ENV``: the algorithm set up from the environment's spaces."""
    from api.algorithms import on_environment

    args.experiment, args.overrides = on_environment(args.environment, args.algo, args.overrides)
    args.resume = None  # a run of it is resumed as any other: troupe run --resume RUN_DIR
    return run_run(args, console)


# --------------------------------------------------------------------- troupe show-config
def add_show_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", help=EXPERIMENT_HELP)
    parser.add_argument(
        "overrides", nargs="*", metavar="key.path=value",
        help="config overrides; a KEY without '=' shows only the keys under it, as --key KEY",
    )  # fmt: skip
    add_import_argument(parser)
    parser.add_argument("--json", action="store_true", help="the resolved config as JSON only")
    parser.add_argument(
        "--key",
        dest="keys",
        action="append",
        default=[],
        metavar="KEY",
        help="only the keys under KEY: a dotted path or a run of its parts (trainer, lr, "
        "stop); repeatable. With --json, those keys and their values",
    )
    add_algo_argument(parser, "show-config")


def add_algo_argument(parser: argparse.ArgumentParser, command: str) -> None:
    """``--algo`` of the commands that take an experiment: what ``troupe train ENV --algo ALGO``
    runs, so a user can check (and read) that run before starting it."""
    from api.algorithms import ALGORITHMS

    what = "the config" if command == "show-config" else "the pipeline"
    parser.add_argument(
        "--algo",
        choices=ALGORITHMS,
        help=f"with an environment id: {what} troupe train ENV --algo ALGO would run "
        "(default: troupe train ENV's)",
    )


def experiment_of(args: argparse.Namespace) -> tuple[str, list[str]]:
    """The experiment and overrides a command names: with ``--algo``, those of
    ``troupe train ENV --algo ALGO`` (run_train's translation)."""
    from api.algorithms import on_environment

    if getattr(args, "algo", None):
        return on_environment(args.experiment, args.algo, args.overrides)
    return args.experiment, list(args.overrides)


def run_show_config(args: argparse.Namespace, console: Console) -> int:
    """The resolved config: every key with its type, default, value and documentation."""
    from rich.padding import Padding
    from rich.table import Table

    from api.config.docs import MISSING, describe_config, matching
    from api.resolve import load_experiment

    # `troupe show-config cartpole-ppo lr` was refused as an override without a value
    args.keys = args.keys + [o for o in args.overrides if "=" not in o]
    args.overrides = [o for o in args.overrides if "=" in o]
    config = load_experiment(*experiment_of(args), args.imports)
    if args.json and not args.keys:
        print(json.dumps(config.to_dict(), indent=2))
        return 0
    hidden = ("code.registrations",)
    rows = [r for r in describe_config(config)
            if not (r.path.startswith(hidden) or r.path.endswith(".args"))]  # fmt: skip
    if args.keys:
        rows = matching(rows, args.keys)
    if args.json:
        print(json.dumps({row.path: row.value for row in rows}, indent=2, default=str))
        return 0
    if console.width < WIDE_TABLE:  # five columns would wrap every word: a block per key
        console.print(Text(f"experiment {config.name}", style="bold"))
        for row in rows:
            changed = row.default is not MISSING and row.value != row.default
            default = repr(row.default) if row.default is not MISSING else MISSING
            console.print(Text.assemble(
                (row.path, "cyan"), " = ", (repr(row.value), "bold yellow" if changed else ""),
                (f"  ({row.type}; default {default})", "dim"),
            ))  # fmt: skip
            if row.doc:  # indented, and wrapped at the terminal's width with its indent
                console.print(Padding(Text(row.doc), (0, 0, 0, 4)))
        return 0
    table = Table(title=f"experiment {config.name}", title_justify="left", show_lines=False)
    for column in ("key", "type", "default", "value", "doc"):
        table.add_column(column, overflow="fold")
    for row in rows:
        changed = row.default is not MISSING and row.value != row.default
        table.add_row(
            Text(row.path, style="cyan"),
            Text(row.type),
            Text(repr(row.default) if row.default is not MISSING else MISSING),
            Text(repr(row.value), style="bold yellow" if changed else ""),
            Text(row.doc),
        )
    console.print(table)
    return 0


WIDE_TABLE = 140
"""Columns below which ``show-config`` prints a block per key instead of its five-column table."""


RESULT_FILES = (run_folder.METRICS, run_folder.LEARNING_CURVE, run_folder.SUMMARY)


def _fresh_summary(path: Path, since: float) -> dict | None:
    """The summary this run wrote, or None (not written, unreadable, or an older run's)."""
    try:
        if path.stat().st_mtime < since - 1.0:  # mtime granularity: allow a second
            return None
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None
