"""The command line of one worker process, shared by its two spellings.

A scheduler starts a worker as ``troupe worker ...`` or, in an image whose entrypoint is
replaced, ``python -m system.run.worker_process ...``. Both read these arguments and this
checking: the second once had its own, smaller parser that ran in plain text when the run's
CURVE keys were missing, bound to 127.0.0.1 and took neither ``--controller-wait`` nor an
``{ordinal}`` in its id. Two ways to start one worker must not mean two security postures.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import socket
from dataclasses import dataclass

from api.errors import UserError
from system.roles import Role

logger = logging.getLogger(__name__)

CONTROLLER_WAIT_S = 600.0
"""How long a Kubernetes or Slurm worker waits for a controller that has not answered yet: its
image may be pulled, and a controller started again waits up to ``folder_lock.SCHEDULER_WAIT_S``
(3 minutes) for the run folder's lock. The controller waits as long for its workers
(``ExternalLauncher.start_grace_s``)."""
DEFAULT_CONTROLLER_WAIT_S = 60.0


def add_insecure_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="run without CURVE keys (TROUPE_CURVE_KEYS_FILE unset): plain text, anyone who "
        "reaches the port may join. Only on a network nobody else can reach",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
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
        default=DEFAULT_CONTROLLER_WAIT_S,
        metavar="SECONDS",
        help=f"how long to wait for a controller that has not answered yet (default "
        f"{DEFAULT_CONTROLLER_WAIT_S:.0f}; `deploy k8s` and `deploy slurm` set "
        f"{CONTROLLER_WAIT_S:.0f}: their controller may come minutes late, and a worker that "
        "gives up is not started again, or spends a restart)",
    )
    add_insecure_argument(parser)


@dataclass(frozen=True)
class WorkerLaunchArgs:
    """What ``worker_process.main`` is called with, checked."""

    worker_id: str
    role: str
    controller: str
    placement: dict
    controller_wait_s: float


def checked(args: argparse.Namespace) -> WorkerLaunchArgs:
    """The arguments made whole (the id's ordinal, this host's address) and checked; CURVE is on
    from here, or refused (:func:`secure_or_refuse`)."""
    worker_id = resolve_worker_id(args.id)
    if args.controller_wait <= 0:
        raise UserError(f"--controller-wait must be > 0 seconds, got {args.controller_wait:g}")
    secure_or_refuse(args.insecure, f"worker {worker_id}")
    advertise = args.advertise_host or socket.gethostbyname(socket.gethostname())
    placement = {"bind_host": args.bind_host, "advertise_host": advertise}
    return WorkerLaunchArgs(worker_id, args.role, args.controller, placement, args.controller_wait)


def resolve_worker_id(template: str, environ=os.environ, hostname: str | None = None) -> str:
    """``actor/{ordinal}`` made ``actor/2`` from ``TROUPE_ORDINAL`` (0-based), ``TROUPE_SLOT``
    (1-based, as Swarm's ``{{.Task.Slot}}`` gives) or the trailing ``-N`` of the host name (a
    pod of a Kubernetes Indexed Job): one replicated service yields ``actor/0``, ``actor/1``..."""
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
