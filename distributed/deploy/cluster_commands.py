"""``troupe controller`` and ``troupe worker``: the two entry points a cluster scheduler runs.

In a cluster the scheduler (Docker, Swarm, Kubernetes, Slurm) starts every role; the controller
then only configures, watches and stops them (see ``ExternalLauncher``). A worker's arguments
(an id with an ``{ordinal}``, CURVE or ``--insecure``) are :mod:`system.run.worker_arguments`,
which ``python -m system.run.worker_process`` reads too.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from rich.console import Console

from api.errors import UserError
from distributed.launch.last_lines import print_summary
from distributed.launch.signals import EXIT_ABANDONED, EXIT_DONE, exit_code_of, run_interrupts
from system import run_folder
from system.run import worker_arguments
from system.run.prometheus import DEFAULT_PORT as DEFAULT_METRICS_PORT
from system.run.prometheus import metrics_port
from system.run.worker_arguments import secure_or_refuse

logger = logging.getLogger(__name__)

CONTROLLER_PORT = 5555
METRICS_PORT = DEFAULT_METRICS_PORT
"""Where a cluster's controller serves Prometheus metrics (its manifests and services say so)."""


# --------------------------------------------------------------------- troupe controller
def add_controller_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="run folder holding config.json (shared with the host)")
    parser.add_argument("--bind", default=f"tcp://0.0.0.0:{CONTROLLER_PORT}")
    parser.add_argument(
        "--advertise-host", default=None, help="the name workers reach the controller by"
    )
    parser.add_argument("--no-display", action="store_true")
    parser.add_argument(
        "--no-summary",
        action="store_true",
        help="print no summary at the end: the launcher that started it prints its own "
        "(troupe run --launcher docker)",
    )
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
    worker_arguments.add_insecure_argument(parser)


def run_controller(args: argparse.Namespace, console: Console) -> int:
    # Swarm and Slurm stop a run with SIGINT, Kubernetes with SIGTERM: both stop it in order,
    # even where the controller was started with SIGINT ignored (`nohup ... &`, a script's
    # background job), which Python would otherwise keep: the stop would never arrive. One that
    # comes while the controller is built is held back, and stops the run before any worker is
    # started (it raised in the middle of the imports before: a traceback and exit 1).
    interrupts = run_interrupts(defer=True, scheduler=True)
    _log_as_every_process(args.verbose)
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
    if not args.no_summary:  # what Swarm's, Kubernetes' and Slurm's logs end with
        print_summary(summary, console)
    return exit_code_of(summary)


def _log_as_every_process(verbose: bool = False) -> None:
    """The controller's console as every worker's and a local run's controller's: NOTICE and
    up (``TROUPE_LOG_LEVEL``), text or JSON lines (``TROUPE_LOG_FORMAT``), ``--verbose``:
    DEBUG. It had the command line's rich INFO lines, which a log shipper cannot parse and
    which buried a Docker run's progress lines in every worker's hello."""
    from system import logs

    try:
        logs.configure_process("controller", logging.DEBUG if verbose else None)
    except ValueError as e:  # a wrong TROUPE_LOG_* names itself
        raise UserError(str(e)) from None


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
    worker_arguments.add_arguments(parser)


def run_worker(args: argparse.Namespace, console: Console) -> int:
    from system.run import worker_process

    logging.getLogger().handlers.clear()  # the worker configures its own log lines
    return worker_process.run(worker_arguments.checked(args))
