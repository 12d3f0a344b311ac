"""``troupe controller`` and ``troupe worker``: the two entry points a cluster scheduler runs.

In a cluster the scheduler (Docker, Swarm, Kubernetes, Slurm) starts every role; the controller
then only configures, watches and stops them (see ``ExternalLauncher``). Worker ids may hold an
``{ordinal}`` placeholder, filled from ``TROUPE_ORDINAL`` (0-based), ``TROUPE_SLOT`` (1-based, as
Swarm's ``{{.Task.Slot}}`` gives) or the trailing ``-N`` of the host name (a pod of a
Kubernetes Indexed Job), so one replicated service yields ``actor/0``, ``actor/1``, ...
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import socket
from pathlib import Path

from rich.console import Console

from api.config import ExperimentConfig
from api.errors import UserError

CONTROLLER_PORT = 5555


def resolve_worker_id(template: str, environ=os.environ, hostname: str | None = None) -> str:
    if "{ordinal}" not in template:
        return template
    if environ.get("TROUPE_ORDINAL"):
        ordinal = int(environ["TROUPE_ORDINAL"])
    elif environ.get("TROUPE_SLOT"):
        ordinal = int(environ["TROUPE_SLOT"]) - 1
    else:
        match = re.search(r"-(\d+)$", hostname or socket.gethostname())
        if match is None:
            raise UserError(
                f"worker id '{template}' needs an ordinal: set TROUPE_ORDINAL or TROUPE_SLOT, or "
                "run it in a pod whose name ends in -N"
            )
        ordinal = int(match.group(1))
    return template.replace("{ordinal}", str(ordinal))


# --------------------------------------------------------------------- troupe controller
def add_controller_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="run folder holding config.json (shared with the host)")
    parser.add_argument("--bind", default=f"tcp://0.0.0.0:{CONTROLLER_PORT}")
    parser.add_argument(
        "--advertise-host", default=None, help="the name workers reach the controller by"
    )
    parser.add_argument("--no-display", action="store_true")


def run_controller(args: argparse.Namespace, console: Console) -> int:
    from distributed.launch.local import ExternalLauncher
    from system.run.controller import Controller
    from system.streams import wire

    run_dir = Path(args.run_dir)
    config_file = run_dir / "config.json"
    if not config_file.exists():
        raise UserError(f"{config_file} does not exist: write the run's config.json first")
    config = ExperimentConfig.from_dict(json.loads(config_file.read_text()))
    wire.secure_from_environment()
    controller = Controller(
        config,
        run_dir,
        ExternalLauncher(),
        bind=args.bind,
        advertise_host=args.advertise_host,
        display=False if args.no_display else None,
    )
    summary = controller.run()
    console.print({k: summary.get(k) for k in ("solved", "stop_reason", "wall_s", "env_frames")})
    return 1 if summary.get("stop_reason") == "failed" else 0


# --------------------------------------------------------------------- troupe worker
def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--id", required=True, help="worker id, e.g. actor/{ordinal} or params")
    parser.add_argument(
        "--role", required=True, choices=["actor", "policy", "trainer", "parameter_service"]
    )
    parser.add_argument("--controller", required=True, help="tcp://HOST:PORT")
    parser.add_argument("--bind-host", default="0.0.0.0")
    parser.add_argument(
        "--advertise-host",
        default=None,
        help="address peers reach this worker by (default: this host's IP)",
    )


def run_worker(args: argparse.Namespace, console: Console) -> int:
    from system.run import worker_process

    logging.getLogger().handlers.clear()  # the worker configures its own log lines
    advertise = args.advertise_host or socket.gethostbyname(socket.gethostname())
    placement = {"bind_host": args.bind_host, "advertise_host": advertise}
    worker_id = resolve_worker_id(args.id)
    return worker_process.main(worker_id, args.role, args.controller, placement)
