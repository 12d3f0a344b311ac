"""``troupe run EXPERIMENT --launcher docker``: every role of a run in its own container.

Docker is the scheduler here, as a cluster's would be: this module starts one container per role
(the controller too) on a user-defined bridge network, where each container is reachable by its
name. The controller runs with the ``ExternalLauncher``, so it never starts or kills anything: it
configures every worker that says hello, and Docker's restart policy (``on-failure``) brings back
an actor, policy worker or trainer that crashes, which then says hello again. Docker never
restarts a container stopped by ``docker kill``/``docker stop``: this process starts such a one
again, and makes again one removed by ``docker rm -f`` (:mod:`.docker_keeper`), as a cluster's
scheduler would.

The run folder is mounted at the same path in every container (the controller hands that path to
workers), containers run as the host user so the files it writes are the user's, and every socket
is CURVE-encrypted with keys made for this run (``RUN_DIR/keys``, owner-only, mounted read-only).
Whatever happens (the end of the run, Ctrl+C, an error), every container and the network go.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from api.config import ExperimentConfig
from distributed.deploy.cluster_commands import CONTROLLER_PORT, METRICS_PORT
from distributed.errors import DockerRunError
from distributed.images import user_layer
from distributed.images.build import DEFAULT_TAG, connect
from distributed.images.source import stale_image
from distributed.launch.docker_create import run_container
from distributed.launch.docker_engine import Engine
from distributed.launch.docker_keeper import Keeper
from distributed.launch.docker_output import (
    CONTROLLER_ID,
    LABEL_RUN,
    LABEL_WORKER,
    EventStreams,
    LogPrinter,
    follow_logs,
    report_exits,
)

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container

from distributed.launch.signals import (
    EXIT_ABANDONED,
    EXIT_INTERRUPTED,
    Interrupts,
    run_interrupts,
)
from system import run_folder

logger = logging.getLogger(__name__)

CONTAINER_RUN_DIR = "/troupe/run"
"""Where the run folder is mounted in every container (the controller's RUN_DIR argument)."""
CONTAINER_KEYS_FILE = "/troupe/keys"
KEYS_FILE = "keys"
LABEL_ROLE = "troupe.role"
STOP_GRACE_S = 120.0
"""How long the controller gets to stop the run in order after Ctrl+C."""


# --------------------------------------------------------------------- naming and roles
def sanitise(text: str) -> str:
    """A name Docker accepts as a container name and as a DNS label: ``a-z0-9-`` only."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "run"


def run_name(run_dir: Path) -> str:
    """The run's name in Docker objects: its folder's name, sanitised."""
    return sanitise(Path(run_dir).resolve().name)


@dataclass(frozen=True)
class RoleSpec:
    """One role of a run as a scheduler sees it: a ``troupe`` command line and its labels."""

    worker_id: str
    """A worker id from ``plan_workers`` (may hold ``{ordinal}`` for a replicated service)."""
    role: str
    """``controller``, or a worker role (a :class:`system.roles.Role` value)."""
    command: list[str]
    replicas: int = 1
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def restartable(self) -> bool:
        """Whether the scheduler should restart it: as the controller's plan says of the role."""
        from system.run.plan import plan_type

        return self.role != "controller" and plan_type(self.role).restartable


def controller_command(advertise_host: str) -> list[str]:
    return [
        "controller",
        CONTAINER_RUN_DIR,
        "--bind",
        f"tcp://0.0.0.0:{CONTROLLER_PORT}",
        "--advertise-host",
        advertise_host,
        "--no-display",
    ]


def worker_command(worker_id: str, role: str, controller_host: str, advertise: str | None):
    """``troupe worker ...``; without ``advertise`` the worker advertises its own IP."""
    command = ["worker", "--id", worker_id, "--role", role]
    command += ["--controller", f"tcp://{controller_host}:{CONTROLLER_PORT}"]
    return command + (["--advertise-host", advertise] if advertise else [])


def container_name(run: str, worker_id: str) -> str:
    return f"troupe-{run}-{sanitise(worker_id)}"


def container_roles(config: ExperimentConfig, run: str, metrics: bool = False) -> list[RoleSpec]:
    """Controller first, then every worker of ``plan_workers``, each advertising its name.
    ``metrics``: the controller serves Prometheus metrics on :data:`METRICS_PORT`."""
    from system.run.plan import plan_workers

    controller = container_name(run, CONTROLLER_ID)
    # its summary is printed here, as a local run's (Swarm's controller ends its log with it)
    command = [*controller_command(controller), "--no-summary"]
    if metrics:
        command += ["--metrics-port", str(METRICS_PORT)]
    specs = [RoleSpec(CONTROLLER_ID, "controller", command)]
    for plan in plan_workers(config):
        name = container_name(run, plan.worker_id)
        command = worker_command(plan.worker_id, str(plan.role), controller, name)
        specs.append(RoleSpec(plan.worker_id, str(plan.role), command))
    return [
        RoleSpec(s.worker_id, s.role, s.command, labels=role_labels(run, s.role, s.worker_id))
        for s in specs
    ]


def role_labels(run: str, role: str, worker_id: str) -> dict[str, str]:
    return {LABEL_RUN: run, LABEL_ROLE: role, LABEL_WORKER: worker_id}


def ensure_keys(run_dir: Path) -> Path:
    """The run's CURVE keys file, made owner-only on first use (a resumed run keeps its keys)."""
    from system.streams.security import RunKeys

    path = Path(run_dir) / KEYS_FILE
    if not path.exists():
        RunKeys.generate().save(path)
    return path


def container_environment() -> dict[str, str]:
    """CURVE on; a writable HOME for any uid; the host's TROUPE_LOG_LEVEL if set."""
    from system.streams.security import ENV_KEYS_FILE

    env = {ENV_KEYS_FILE: CONTAINER_KEYS_FILE, "HOME": "/tmp", "PYTHONUNBUFFERED": "1"}
    if os.environ.get("TROUPE_LOG_LEVEL"):
        env["TROUPE_LOG_LEVEL"] = os.environ["TROUPE_LOG_LEVEL"]
    return env


# --------------------------------------------------------------------- the run
def run_docker(
    config: ExperimentConfig,
    run_dir: Path,
    *,
    image: str = DEFAULT_TAG,
    display: bool | None = None,
    client: docker.DockerClient | None = None,
    out: TextIO | None = None,
    metrics_port: int | None = None,
    interrupts: Interrupts | None = None,
) -> int:
    """Run every role in its own container until the controller exits; its exit code.

    ``interrupts``: signals held back while the containers start (made here if not given), then
    passed to the controller, which stops in order (this process had ended: no summary).

    ``metrics_port``: publish the controller's Prometheus endpoint on this port of the host's
    loopback (0: any free port; ``endpoints.json`` names the one taken).

    ``run_dir`` must already hold ``config.json`` (``distributed.launch.run.prepare`` plus a write).
    ``display`` is accepted for parity with ``run_local``: the controller has no terminal in its
    container, so it always prints plain progress lines.
    """
    client = client or connect()
    run_dir = Path(run_dir).resolve()
    check_can_run(client, image, run_dir)
    run = run_name(run_dir)
    keys = ensure_keys(run_dir)
    printer = LogPrinter(out or sys.stdout)
    done = threading.Event()
    if interrupts is None and threading.current_thread() is threading.main_thread():
        # A shell may start us with SIGINT ignored (background jobs); Ctrl+C must still stop.
        interrupts = run_interrupts(defer=True)
    network = client.networks.create(f"troupe-{run}", driver="bridge", labels={LABEL_RUN: run})
    containers: list[Container] = []
    launched = time.time()
    specs = {s.worker_id: s for s in container_roles(config, run, metrics_port is not None)}

    def launch(worker_id: str) -> Container:
        spec, ports = specs[worker_id], {}
        if spec.worker_id == CONTROLLER_ID and metrics_port is not None:
            ports = {f"{METRICS_PORT}/tcp": ("127.0.0.1", metrics_port or None)}
        container = _start(
            client, image, spec, network.name, run_dir, keys, run, user_files(config), ports
        )
        follow = (container, spec.worker_id, printer, done)
        threading.Thread(target=follow_logs, args=follow, daemon=True).start()
        return container

    def again(worker_id: str) -> Container | None:  # a restartable worker's container removed
        spec = specs.get(worker_id)
        return launch(worker_id) if spec is not None and spec.restartable else None

    keeper, engine = Keeper(client, printer, again), Engine(client, str(run_dir))
    streams = EventStreams(client, _exit_filters(run), done)
    try:
        exits = (streams.since(None), printer, done, keeper.on_event, streams.since)
        threading.Thread(target=report_exits, args=exits, daemon=True).start()
        for worker_id in specs:  # the controller first
            containers.append(launch(worker_id))
            if interrupts is not None and interrupts.pending:
                break  # the controller's container runs (the first): it stops the run
        if interrupts is not None and interrupts.arm():
            _wait_until_it_takes_signals(containers[0], run_dir, launched, engine)
            return _stop_in_order(containers[0], keeper, engine)
        return _wait_for_controller(containers[0], keeper, engine)
    except KeyboardInterrupt:  # with no interrupts held back: before the controller ran
        return EXIT_INTERRUPTED
    finally:
        streams.close()  # sets done
        keeper.stop()  # nothing is made again once the clean-up below lists what to remove
        engine.remove_run_objects(run)


def _exit_filters(run: str) -> dict[str, object]:
    events = ["die", "oom", "destroy"]
    return {"type": "container", "event": events, "label": f"{LABEL_RUN}={run}"}


def check_can_run(client: docker.DockerClient, image: str, run_dir: Path) -> None:
    """Raise DockerRunError if the image is missing or an earlier run of this name is left."""
    _check_image(client, image)
    _refuse_leftovers(client, run_name(Path(run_dir).resolve()))


def _check_image(client: docker.DockerClient, image: str) -> None:
    import docker

    try:
        found = client.images.get(image)
    except docker.errors.ImageNotFound as e:
        raise DockerRunError(
            f"image {image} is not on this Docker host: build it with `troupe image build "
            f"--tag {image}` (or docker load it), or name another with --image"
        ) from e
    stale = stale_image(found.labels, image)
    if stale:
        logger.warning("%s", stale)


def _refuse_leftovers(client: docker.DockerClient, run: str) -> None:
    """Two runs with one name would share container names; say how to clear the old one."""
    label = {"label": f"{LABEL_RUN}={run}"}
    containers = client.containers.list(all=True, filters=label)
    if containers:
        raise DockerRunError(
            f"{len(containers)} containers of a run named '{run}' still exist: remove them with "
            f"`docker rm -f $(docker ps -aq --filter label={LABEL_RUN}={run})`, or pick another "
            "--run-dir"
        )
    if client.networks.list(filters=label):
        raise DockerRunError(
            f"the network of a run named '{run}' still exists: remove it with `docker network "
            f"rm troupe-{run}`, or pick another --run-dir"
        )


def user_files(config: ExperimentConfig) -> list[str]:
    """The user's own files the run's workers import (mounted into every container)."""
    code = config.code
    files = [i for i in code.imports if i.endswith(".py")] + list(code.sources.values())
    required = [i for r in code.registrations for i in r.requires if i.endswith(".py")]
    return [r.source for r in code.registrations] + required + files


def _start(client, image, spec: RoleSpec, network: str, run_dir: Path, keys: Path, run: str,
           user_files: list[str] = (), ports: dict | None = None):  # fmt: skip
    from system.run import folder_lock
    from system.run.worker_record import MAX_RESTARTS

    name = container_name(run, spec.worker_id)
    restart = {"Name": "on-failure", "MaximumRetryCount": MAX_RESTARTS}
    logger.debug("starting %s: troupe %s", name, " ".join(spec.command))
    # The launching process holds the run folder's lock for the whole run (folder_lock): the
    # controller's container, on the same folder, must not take it again.
    held = {folder_lock.ENV_HELD: "1"}
    return run_container(
        client,
        image,
        spec.command,
        name=name,
        hostname=name[:63],
        labels=spec.labels,
        network=network,
        user=f"{os.getuid()}:{os.getgid()}",
        environment={**container_environment(), **held},
        volumes={
            **user_layer.mounts(user_files),
            str(run_dir): {"bind": CONTAINER_RUN_DIR, "mode": "rw"},
            str(keys.resolve()): {"bind": CONTAINER_KEYS_FILE, "mode": "ro"},
        },
        # tini as PID 1 forwards Ctrl+C's SIGINT to troupe and reaps its children.
        init=True,
        ports=ports,
        **container_resources(spec),
        restart_policy=restart if spec.restartable else None,
        stop_timeout=int(STOP_GRACE_S),  # `docker stop`, a host's shutdown: as on a cluster
    )


def container_resources(spec: RoleSpec) -> dict[str, object]:
    """The role's measured needs (``deploy/sizing.py``) as Docker settings: its CPU limit (an
    actor cannot take a core from its policy worker) and its memory as a reservation, which
    Docker reclaims toward under memory pressure. No hard memory limit: a local run's
    experiment may need far more than the cartpole figures, and a container over a limit is
    killed; clusters get limits sized with ``--measured``."""
    from distributed.deploy.sizing import MEASURED, component_of, needs_of

    need = needs_of(MEASURED, component_of(spec.worker_id, spec.role))
    return {"nano_cpus": int(need.cpu_limit * 1e9), "mem_reservation": f"{need.memory_mib}m"}


def _wait_for_controller(controller: Container, keeper: Keeper, engine: Engine) -> int:
    """The controller's exit code (across the engine's restart); on Ctrl+C, let it stop the
    run in order first."""
    try:
        return engine.exit_code(controller)
    except KeyboardInterrupt:
        return _stop_in_order(controller, keeper, engine)


def _wait_until_it_takes_signals(
    controller: Container, run_dir: Path, since: float, engine: Engine
) -> None:
    """Until the controller in ``controller``'s container runs its loop, where a SIGINT stops
    the run in order (a SIGINT in its imports ended it in a traceback): until its first record
    (``latest.json``, newer than ``since``, when the containers started), its end, or
    :data:`STOP_GRACE_S`."""
    latest = run_dir / run_folder.LATEST
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        if latest.exists() and latest.stat().st_mtime >= since:
            return
        engine.across(controller.reload, "for the run's controller")
        if controller.status not in ("created", "running"):
            return
        time.sleep(0.2)


def _stop_in_order(controller: Container, keeper: Keeper, engine: Engine) -> int:
    """Ask the controller's container to stop the run in order, and wait for it (across the
    engine's absence): its exit code (130 when it stopped in order, with a summary), 131 on a
    second signal."""
    import docker

    keeper.stop()
    logger.warning("stopping the run in order (a second Ctrl+C or signal stops it at once)")
    deadline = time.monotonic() + STOP_GRACE_S
    try:
        with contextlib.suppress(docker.errors.APIError):  # ended meanwhile: its code is the run's
            engine.across(lambda: controller.kill(signal="SIGINT"), "to stop the run in order")
        return engine.exit_code(controller, timeout_s=max(deadline - time.monotonic(), 1.0))
    except KeyboardInterrupt:  # abandoned: the containers are removed as they are
        logger.warning("stopping at once: every container is removed")
        return EXIT_ABANDONED
    except DockerRunError as e:  # the engine is not back: the clean-up says what is left
        logger.warning("%s", e)
    except Exception:  # a timeout: the containers are removed all the same
        logger.warning("the controller did not stop in %.0fs", STOP_GRACE_S)
    return EXIT_INTERRUPTED
