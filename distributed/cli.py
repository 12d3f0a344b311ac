"""The ``troupe`` command line.

Each subcommand is one small ``_run_*`` function plus one ``_add_*_arguments`` function, listed
once in :data:`SUBCOMMANDS`; add a subcommand by writing those two and adding a row. Logging is
configured here and nowhere else (this is an entry point); output goes through rich.

Any of Troupe's own errors (:class:`~api.errors.TroupeError`: an unknown name, a bad argument, a
broken environment, a full disk, a damaged checkpoint, a peer that does not answer) and any
failed file operation that names its file is printed in red as one message and exits with code
1, never with a traceback (``--verbose`` adds it): the message already says what to change.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from rich.logging import RichHandler
from rich.table import Table
from rich.text import Text

from api.config import parse_value
from api.errors import TroupeError, UserError
from api.registry import Spec
from distributed.bench import command as bench
from distributed.deploy import cluster_commands as cc
from distributed.deploy.commands import add_deploy_arguments, run_deploy
from distributed.images.build import add_image_arguments, run_image
from distributed.launch import eval_command
from distributed.launch import run_commands as rc
from distributed.launch.arguments import add_import_argument, at_least_one
from distributed.ops import commands as ops
from system.console import Console

GYM_ADAPTER = "legacy.environment.gym_adapter:GymnasiumEnvironment"
HANDLER = "_troupe_subcommand"
"""Where the parsed arguments keep the subcommand's function (no argument has this name)."""
PARSER = "_troupe_parser"
"""Where they keep the subcommand's parser, whose usage an unknown option is shown with."""


@dataclass(frozen=True)
class Subcommand:
    """One ``troupe`` subcommand: its name, one-line help, arguments and what it runs."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Console], int]
    """Does the work and returns the process exit code."""


# --------------------------------------------------------------------- troupe list
def _add_list_arguments(parser: argparse.ArgumentParser) -> None:
    """``troupe list [--import FILE]``: what your files register shows too."""
    add_import_argument(parser)


def _run_list(args: argparse.Namespace, console: Console) -> int:
    """Print every registered component, grouped by kind, with its description."""
    from api import registry, user_code

    for item in args.imports:
        user_code.import_code(item)
    envs = registry.environments.specs()
    gymnasiums = [s for s in envs if s.entry_point == GYM_ADAPTER and not s.requires]
    own = [s for s in envs if s not in gymnasiums]  # a gymnasium id of your code's among them
    gym_ids = [s.name for s in gymnasiums]
    console.print(_spec_table("Environments", own))
    console.print(Text(f"Gymnasium ids ({len(gym_ids)})", style="bold"))
    console.print(Text(", ".join(gym_ids)), highlight=False)
    console.print()
    console.print(Text("PettingZoo games by id: pettingzoo:<family>/<game>", style="bold"))
    console.print(Text("e.g. pettingzoo:classic/rps_v2, pettingzoo:classic/tictactoe_v3"))
    console.print()
    console.print(_spec_table("Policies", registry.policies.specs()))
    console.print(_spec_table("Trainers", registry.trainers.specs()))
    console.print(_spec_table("Policy mappings", registry.policy_mappings.specs()))
    console.print(_spec_table("Callbacks", registry.callbacks.specs()))
    console.print(_spec_table("Experiments", registry.experiments.specs()))
    return 0


def _spec_table(title: str, specs: Sequence[Spec]) -> Table:
    table = Table(title=f"{title} ({len(specs)})", title_justify="left", title_style="bold")
    table.add_column("name", style="cyan", no_wrap=True)
    table.add_column("description")
    for spec in specs:
        table.add_row(Text(spec.name), Text(spec.description))
    return table


# --------------------------------------------------------------------- troupe test-env
def _add_test_env_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="registered environment name, e.g. CartPole-v1")
    parser.add_argument(
        "kwargs",
        nargs="*",
        metavar="key=value",
        help="environment arguments; values are Python literals (3, 0.5, True) or plain strings",
    )
    parser.add_argument(
        "--no-stepping",
        action="store_true",
        help="check reset() only (for action spaces that cannot sample random actions)",
    )
    parser.add_argument("--steps", type=at_least_one, default=200, help="random steps to take")
    parser.add_argument("--seed", type=int, default=0, help="seed for the determinism check")
    add_import_argument(parser)


def _run_test_env(args: argparse.Namespace, console: Console) -> int:
    """Run ``api.testing.test_environment`` on a registered environment; print the report."""
    from api import testing, user_code

    for item in args.imports:  # the user's file registers the environment, as for `troupe run`
        user_code.import_code(item)
    report = testing.test_environment(
        args.name,
        test_stepping=not args.no_stepping,
        steps=args.steps,
        seed=args.seed,
        env_kwargs=parse_kwargs(args.kwargs),
    )
    console.print(Text(str(report), style="green"), highlight=False)
    return 0


def parse_kwargs(items: Sequence[str]) -> dict[str, Any]:
    """``["size=8", "mode=hard"]`` -> ``{"size": 8, "mode": "hard"}``."""
    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise UserError(f"argument '{item}' must look like key=value, e.g. size=8")
        kwargs[key.strip()] = parse_value(raw.strip())
    return kwargs


# --------------------------------------------------------------------- the table
SUBCOMMANDS: list[Subcommand] = [
    Subcommand("list", "list every registered component: environments, policies, trainers, "
               "policy mappings, callbacks, experiments",
               _add_list_arguments, _run_list),
    Subcommand("test-env", "check that an environment keeps the Environment contract",
               _add_test_env_arguments, _run_test_env),
    Subcommand("test-pipeline", "run an experiment's env, policy and trainer in one process",
               rc.add_test_pipeline_arguments, rc.run_test_pipeline),
    Subcommand("run", "run an experiment: every role in its own process",
               rc.add_run_arguments, rc.run_run),
    Subcommand("train", "train on any environment or gymnasium id, set up from its spaces "
               "(--algo ppo|impala|dqn|sac|mappo)",
               rc.add_train_arguments, rc.run_train),
    Subcommand("show-config", "the resolved config: every key, its type, default and doc",
               rc.add_show_config_arguments, rc.run_show_config),
    Subcommand("eval", "greedy evaluation of a run folder or checkpoint",
               eval_command.add_eval_arguments, eval_command.run_eval),
    Subcommand("controller", "run a cluster run's controller (the scheduler starts workers)",
               cc.add_controller_arguments, cc.run_controller),
    Subcommand("worker", "run one worker process (what images and schedulers start)",
               cc.add_worker_arguments, cc.run_worker),
    Subcommand("image", "build worker images: troupe image build|wheelhouse|push",
               add_image_arguments, run_image),
    Subcommand("deploy", "deploy to a cluster: troupe deploy swarm|k8s|slurm",
               add_deploy_arguments, run_deploy),
    Subcommand("bench", "measure throughput, time-to-solve, latency, push, scaling and memory",
               bench.add_bench_arguments, bench.run_bench),
    Subcommand("status", "a run's state, last metrics and workers, for every launcher",
               ops.add_status_arguments, ops.run_status),
    Subcommand("logs", "a run's log lines by worker (--follow), for every launcher",
               ops.add_logs_arguments, ops.run_logs),
    Subcommand("stop", "stop a run in order (--now: at once), for every launcher",
               ops.add_stop_arguments, ops.run_stop),
    Subcommand("ps", "a run's processes, containers, services, pods or job steps; "
               "without RUN, every run under runs/", ops.add_ps_arguments, ops.run_ps),
]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="troupe", description="Troupe: decoupled, distributed reinforcement learning."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in SUBCOMMANDS:
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(p)
        # A name no subcommand's arguments use: `troupe status RUN` has an argument called
        # `run`, which once overwrote the handler stored under that name.
        p.set_defaults(**{HANDLER: command.run, PARSER: p})
    return parser


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=Console(stderr=True), show_path=False)],
    )


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Like parse_args, but ``key=value`` overrides may also come after options
    (``troupe run cartpole-ppo --run-dir runs/x seed=3``), which argparse alone refuses."""
    args, extra = parser.parse_known_args(argv)
    overrides = [e for e in extra if "=" in e and not e.startswith("-")]
    rest = [e for e in extra if e not in overrides]
    if rest or (overrides and not isinstance(getattr(args, "overrides", None), list)):
        _unrecognized(getattr(args, PARSER, parser), rest or overrides)
    if overrides:
        args.overrides = [*args.overrides, *overrides]
    return args


def _unrecognized(parser: argparse.ArgumentParser, extra: list[str]) -> NoReturn:
    """Exit 2 with the subcommand's usage (argparse showed ``troupe [-h] [-v] COMMAND ...``,
    which lists none of its options) and the option nearest a misspelt one."""
    options = [s for action in parser._actions for s in action.option_strings]
    nearest = [
        f"(did you mean {close[0]}?)"
        for e in extra
        if e.startswith("--") and (close := difflib.get_close_matches(e.split("=")[0], options, 1))
    ]
    parser.error(" ".join([f"unrecognized arguments: {' '.join(extra)}", *nearest]))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``troupe`` console script; returns the exit code."""
    args = _parse(build_parser(), argv)
    _configure_logging(args.verbose)
    from api.user_code import add_working_directory

    add_working_directory()  # --import my_package.module from here, as python -m would
    try:
        return getattr(args, HANDLER)(args, Console())
    except TroupeError as e:  # each names the file, key or peer at fault, and the fix
        return _error(str(e), args.verbose)
    except BrokenPipeError:  # `troupe show-config --json | head`: the reader has had enough
        # Python would flush stdout again at exit, and fail again: point it at nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE  # what a shell reports of a writer that a pipe closed on
    except OSError as e:
        if e.filename is None:
            raise
        return _error(f"cannot use {e.filename}: {e.strerror or e}", args.verbose)


def _error(message: str, verbose: bool) -> int:
    """One line (no traceback unless ``--verbose``): a user's mistake is not a crash."""
    if verbose:
        Console(stderr=True).print_exception()
    # soft_wrap: the message stays one line for grep; the terminal wraps it for the eye.
    Console(stderr=True).print(Text(f"error: {message}", style="red"), soft_wrap=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
