"""``troupe controller`` and ``troupe worker``: the two entry points a cluster scheduler runs.

In a cluster the scheduler (Docker, Swarm, Kubernetes, Slurm) starts every role; the controller
then only configures, watches and stops them (see ``ExternalLauncher``). Worker ids may hold an
``{ordinal}`` placeholder, filled from ``TROUPE_ORDINAL`` (0-based), ``TROUPE_SLOT`` (1-based, as
Swarm's ``{{.Task.Slot}}`` gives) or the trailing ``-N`` of the host name (a pod of a
Kubernetes Indexed Job), so one replicated service yields ``actor/0``, ``actor/1``, ...
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import socket
from pathlib import Path

from rich.console import Console

from api.errors import UserError
from distributed.launch.signals import EXIT_ABANDONED, EXIT_DONE, exit_code_of, run_interrupts
from system import run_folder
from system.run.prometheus import DEFAULT_PORT as DEFAULT_METRICS_PORT
from system.run.prometheus import metrics_port

logger = logging.getLogger(__name__)

CONTROLLER_PORT = 5555
METRICS_PORT = DEFAULT_METRICS_PORT
"""Where a cluster's controller serves Prometheus metrics (its manifests and services say so)."""
CONTROLLER_WAIT_S = 600.0
"""How long a Kubernetes or Slurm worker waits for a controller that has not answered yet: its
image may be pulled, and a controller started again waits up to ``folder_lock.SCHEDULER_WAIT_S``
(3 minutes) for the run folder's lock. The controller waits as long for its workers
(``ExternalLauncher.start_grace_s``)."""


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
    parser.add_argument(
        "--metrics-port",
        type=metrics_port,
        metavar="PORT",
        help="serve Prometheus metrics on this port (/metrics; default: TROUPE_METRICS_PORT, "
        "else none)",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        metavar="S",
        help="a running worker silent this long is lost (default: 30)",
    )
    parser.add_argument(
        "--restart-grace",
        type=float,
        metavar="S",
        help="how long the scheduler gets to bring a lost worker back before the run fails "
        "(default: 60)",
    )
    _add_insecure_argument(parser)


def _add_insecure_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="run without CURVE keys (TROUPE_CURVE_KEYS_FILE unset): plain text, anyone who "
        "reaches the port may join. Only on a network nobody else can reach",
    )


def secure_or_refuse(insecure: bool, what: str) -> None:
    """CURVE from the environment's keys; without keys, refuse unless ``insecure`` (and then
    warn): a cluster port must never be open in plain text by accident."""
    from system.streams import transport
    from system.streams.security import ENV_KEYS_FILE

    if transport.secure_from_environment():
        if insecure:
            logger.warning("--insecure ignored: %s has CURVE keys and uses them", what)
        return
    if not insecure:
        raise UserError(
            f"{what} refuses to run without CURVE keys: set {ENV_KEYS_FILE} to the run's keys "
            f"file (troupe deploy makes one), or pass --insecure to accept plain text"
        )
    logger.warning(
        "INSECURE: %s runs without CURVE keys; every message is plain text and anyone who "
        "reaches its ports can join the run or read it",
        what,
    )


def run_controller(args: argparse.Namespace, console: Console) -> int:
    # Swarm and Slurm stop a run with SIGINT, Kubernetes with SIGTERM: both stop it in order,
    # even where the controller was started with SIGINT ignored (`nohup ... &`, a script's
    # background job), which Python would otherwise keep: the stop would never arrive. One that
    # comes while the controller is built is held back, and stops the run before any worker is
    # started (it raised in the middle of the imports before: a traceback and exit 1).
    interrupts = run_interrupts(defer=True, scheduler=True)
    run_dir = Path(args.run_dir)
    config_file = run_dir / run_folder.CONFIG
    if not config_file.exists():
        raise UserError(f"{config_file} does not exist: write the run's config.json first")
    from system.run import folder_lock, launch_end

    if (ended := launch_end.ended_summary(for_good=True)) is not None:  # Swarm started it again
        launch_end.say_nothing_to_resume(ended)
        return EXIT_DONE
    # one controller per run folder, on a shared volume too; one started again elsewhere
    # waits for the lock its lost predecessor holds until the file server lets it go
    folder_lock.acquire(run_dir, wait_s=folder_lock.SCHEDULER_WAIT_S)
    from system import logs

    logs.keep_in_run_folder(run_dir, "controller")  # beside the CLI's console lines
    _take_stop_requests(run_dir, interrupts)
    try:
        controller = _controller(args, run_dir)
    except UserError as e:  # a start again fails alike: the run ends here, not at each restart
        from system.run.finish import failed_before_start

        failed_before_start(run_dir, f"controller: {e}")
        raise
    launch_end.count_controller_start(run_dir)  # bound: its workers may now count on it
    try:
        summary = controller.run(stopped=interrupts.arm)
    except KeyboardInterrupt:  # a second signal while it stopped: its workers leave on their own
        return EXIT_ABANDONED
    console.print({k: summary.get(k) for k in ("solved", "stop_reason", "wall_s", "env_frames")})
    return exit_code_of(summary)


def _controller(args: argparse.Namespace, run_dir: Path):
    """The run's controller, built from its folder (the user's code loaded, its sockets bound)."""
    from distributed.launch.local import ExternalLauncher
    from system.run.controller import HEARTBEAT_TIMEOUT_S, Controller
    from system.run.resume_check import saved_config

    config = saved_config(run_dir)
    secure_or_refuse(args.insecure, "troupe controller")
    launcher = ExternalLauncher()
    if args.restart_grace is not None:
        launcher.restart_grace_s = args.restart_grace
    return Controller(
        config,
        run_dir,
        launcher,
        bind=args.bind,
        advertise_host=args.advertise_host,
        display=False if args.no_display else None,
        heartbeat_timeout_s=args.heartbeat_timeout or HEARTBEAT_TIMEOUT_S,
        metrics_port=args.metrics_port,
    )


def _take_stop_requests(run_dir: Path, interrupts) -> None:
    """A ``troupe stop`` that came before this controller held the run folder wrote its request
    there (:mod:`distributed.launch.stop_request`): one written before now stops the run before
    any worker starts; one written while the lock was being taken is seen within a second."""
    from distributed.launch import stop_request

    if stop_request.take(run_dir) is not None:
        logger.warning(
            "troupe stop asked for the run to stop before its controller started (%s): "
            "stopping it in order, no worker is started",
            stop_request.FILE,
        )
        interrupts.request()
        return
    stop_request.watch(run_dir, already_asked=lambda: interrupts.asked)


# --------------------------------------------------------------------- troupe worker
def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    from system.roles import Role

    parser.add_argument("--id", required=True, help="worker id, e.g. actor/{ordinal} or params")
    parser.add_argument(
        "--role", required=True, help=f"{', '.join(r.value for r in Role)}, or a role of yours"
    )
    parser.add_argument("--controller", required=True, help="tcp://HOST:PORT")
    parser.add_argument("--bind-host", default="0.0.0.0")
    parser.add_argument(
        "--advertise-host",
        default=None,
        help="address peers reach this worker by (default: this host's IP)",
    )
    parser.add_argument(
        "--controller-wait",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for a controller that has not answered yet (default 60; "
        f"`deploy k8s` and `deploy slurm` set {CONTROLLER_WAIT_S:.0f}: their controller may "
        "come minutes late, and a worker that gives up is not started again, or spends a "
        "restart)",
    )
    _add_insecure_argument(parser)


def run_worker(args: argparse.Namespace, console: Console) -> int:
    from system.run import worker_process

    logging.getLogger().handlers.clear()  # the worker configures its own log lines
    advertise = args.advertise_host or socket.gethostbyname(socket.gethostname())
    placement = {"bind_host": args.bind_host, "advertise_host": advertise}
    worker_id = resolve_worker_id(args.id)
    secure_or_refuse(args.insecure, f"troupe worker {worker_id}")
    if args.controller_wait <= 0:
        raise UserError(f"--controller-wait must be > 0 seconds, got {args.controller_wait:g}")
    return worker_process.main(
        worker_id, args.role, args.controller, placement, controller_wait_s=args.controller_wait
    )
