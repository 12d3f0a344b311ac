"""A run as Docker Swarm services: ``troupe deploy swarm``, and what ``troupe status|logs|stop``
ask of a Swarm run (:class:`distributed.ops.backends.SwarmBackend`).

``deploy`` turns a run into Swarm's own objects and returns: an attachable overlay network, a
secret holding the run's CURVE keys, and one service per role. The controller, the parameter
service, each trainer and each policy worker get a service of their own (their ids are fixed);
actors are one replicated service whose tasks take their ids from ``{{.Task.Slot}}``, and so do
evaluation actors. Swarm restarts a task that fails (``on-failure``); the controller service is
never restarted, since its exit is the run's end. The run then keeps going until its controller's
stopping rule ends it; ``status``, ``logs`` and ``stop`` find it again by its name.

The run folder is a bind mount at the same path in every task. On a swarm of several nodes that
path must be a shared file system (NFS, ...) mounted at the same place on every node; trainers
are placed on manager nodes unless ``--trainer-constraint`` says otherwise.

Longer than 400 lines because deploying a run is one command: its services and what each asks
of the swarm (resources, the published metrics port, stop signals), and ``--wait`` with its
orderly and abandoned stops, share the run's naming and lookup.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from api.config import ExperimentConfig
from distributed.deploy.manifests import CONTROLLER_RETRIES
from distributed.deploy.sizing import (
    MEASURED,
    RoleNeeds,
    add_sizing_arguments,
    component_of,
    needs_from,
    needs_of,
    parse_overrides,
)
from distributed.deploy.swarm_tasks import controller_end
from distributed.errors import DockerRunError, SwarmError
from distributed.images.build import DEFAULT_TAG, connect
from distributed.images.code_check import check_image_imports
from distributed.images.pinning import image_reference
from distributed.launch import docker_run as dl
from distributed.launch.arguments import add_import_argument
from distributed.launch.docker_engine import Engine
from distributed.launch.docker_output import RETRY_S, engine_gone
from distributed.launch.signals import (
    EXIT_ABANDONED,
    EXIT_INTERRUPTED,
    raise_interrupt,
)
from system import run_folder
from system.run import launch_end
from system.run.worker_record import MAX_RESTARTS, PROGRESS_S

if TYPE_CHECKING:
    import docker
    from docker.models.services import Service

logger = logging.getLogger(__name__)

SECRET_FILE = "troupe-keys"
SECRET_PATH = f"/run/secrets/{SECRET_FILE}"
LABEL_RUN_DIR = "troupe.run_dir"
DEFAULT_TRAINER_CONSTRAINT = "node.role==manager"
SECOND_NS = 1_000_000_000
RESTART_WINDOW_S = PROGRESS_S * MAX_RESTARTS / 2
"""Swarm counts a task's restarts within this window, not over the service's life. Without one,
a worker failing now and then (a flaky simulator) was not restarted after its fifth failure in
a days-long run, where the controller, which counts failures in a row without running
PROGRESS_S, waited for it and failed the run. A task failing more often than every 30 s still
reaches ``max_attempts`` within the window (a crash loop, which the controller gives up on too)."""


# --------------------------------------------------------------------- the services of a run
def service_roles(config: ExperimentConfig, run: str) -> list[dl.RoleSpec]:
    """Controller, then one service per fixed worker id, then one per replicated group."""
    from system.roles import Role
    from system.run.plan import plan_workers

    controller = dl.container_name(run, dl.CONTROLLER_ID)
    command = [*dl.controller_command(controller), "--metrics-port", str(dl.METRICS_PORT)]
    specs = [dl.RoleSpec(dl.CONTROLLER_ID, "controller", command)]
    for plan in plan_workers(config):
        if plan.role is not Role.ACTOR:  # actor/i and eval/i become the replicated services below
            role = str(plan.role)
            command = dl.worker_command(plan.worker_id, role, controller, None)
            specs.append(dl.RoleSpec(plan.worker_id, role, command))
    actor = str(Role.ACTOR)
    for group, replicas in (("actor", config.actors.workers), ("eval", config.evaluation.workers)):
        if replicas > 0:
            command = dl.worker_command(f"{group}/{{ordinal}}", actor, controller, None)
            specs.append(dl.RoleSpec(f"{group}/{{ordinal}}", actor, command, replicas))
    return [
        dl.RoleSpec(
            s.worker_id, s.role, s.command, s.replicas, dl.role_labels(run, s.role, s.worker_id)
        )
        for s in specs
    ]


def service_name(run: str, worker_id: str) -> str:
    return dl.container_name(run, worker_id.replace("{ordinal}", ""))


def require_manager(client: docker.DockerClient) -> None:
    swarm = client.info().get("Swarm") or {}
    if swarm.get("LocalNodeState") != "active" or not swarm.get("ControlAvailable"):
        raise SwarmError(
            "this Docker engine is not a swarm manager: run `docker swarm init` here (or "
            "`docker swarm init --advertise-addr 127.0.0.1` for a one-machine swarm), or point "
            "DOCKER_HOST at a manager node"
        )


def refuse_deployed(client: docker.DockerClient, run: str) -> None:
    """SwarmError if services of ``run`` are left: it runs, or ended without ``--wait``."""
    if find_services(client, run):
        raise SwarmError(f"a run named '{run}' is deployed already: `troupe stop {run}` first")


def deploy(
    config: ExperimentConfig,
    run_dir: Path,
    *,
    image: str = DEFAULT_TAG,
    trainer_constraint: str = DEFAULT_TRAINER_CONSTRAINT,
    client: docker.DockerClient | None = None,
    metrics_port: int | None = dl.METRICS_PORT,
    needs: dict[str, RoleNeeds] | None = None,
    reserve_cpus: frozenset[str] = frozenset(),
) -> str:
    """Create the run's network, secret and services; returns the run's name.

    ``metrics_port``: the port of the controller's node where Prometheus scrapes it (published
    in host mode, as the services use DNS round-robin endpoints; None: not published, still
    reachable at ``troupe-<run>-controller:9400`` on the run's network).

    ``run_dir`` must hold ``config.json``. The keys are made in the run folder (owner-only) and
    handed to Swarm as a secret, which tasks read as a file only the host user can open. If Swarm
    refuses anything, whatever was created is removed again.
    """
    import docker

    client = client or connect()
    require_manager(client)
    run_dir = Path(run_dir).resolve()
    run = dl.run_name(run_dir)
    refuse_deployed(client, run)
    labels = {dl.LABEL_RUN: run, LABEL_RUN_DIR: str(run_dir)}
    keys = dl.ensure_keys(run_dir).read_bytes()
    launch = uuid.uuid4().hex[:12]  # this deployment's: a --resume is another
    try:
        network = client.networks.create(
            f"troupe-{run}", driver="overlay", attachable=True, labels=labels
        )
        secret = client.secrets.create(name=f"troupe-{run}-keys", data=keys, labels=labels)
        for spec in service_roles(config, run):
            settings = _service_settings(spec, labels, run_dir, secret, trainer_constraint, launch)
            settings["resources"] = service_resources(spec, needs or MEASURED, reserve_cpus)
            if spec.role == "controller" and metrics_port is not None:
                settings["endpoint_spec"] = _published_metrics(metrics_port)
            client.services.create(
                image,
                args=spec.command,
                name=service_name(run, spec.worker_id),
                networks=[network.id],
                **settings,
            )
    except docker.errors.APIError as e:
        remove_run(client, run)
        raise SwarmError(f"Swarm refused to create run '{run}': {e}") from e
    return run


def _service_settings(
    spec: dl.RoleSpec, labels, run_dir: Path, secret, trainer_constraint: str, launch: str
):
    """Everything about a role's service but its name, image, command and network.

    ``launch``: the deployment's id. With the run folder's mount, it lets a task that Swarm
    starts again after its run ended (an engine's restart) see that end and exit 0
    (:mod:`system.run.launch_end`), instead of looking for the controller for ever; and a
    controller started again tell an interrupted run, which it resumes, from one that ended."""
    from docker.types import EndpointSpec, Mount, SecretReference, ServiceMode

    from system.roles import Role
    from system.streams.security import ENV_KEYS_FILE

    uid, gid = str(os.getuid()), str(os.getgid())
    env = {**dl.container_environment(), ENV_KEYS_FILE: SECRET_PATH}
    env.update({launch_end.LAUNCH_ID_ENV: launch, launch_end.RUN_FOLDER_ENV: dl.CONTAINER_RUN_DIR,
                launch_end.CONTROLLER_STARTS_ENV: str(1 + CONTROLLER_RETRIES)})  # fmt: skip
    if "{ordinal}" in spec.worker_id:
        env["TROUPE_SLOT"] = "{{.Task.Slot}}"
    return {
        "labels": {**labels, **spec.labels},
        "container_labels": {**labels, **spec.labels},
        "env": env,
        "mode": ServiceMode("replicated", replicas=spec.replicas),
        "mounts": [Mount(dl.CONTAINER_RUN_DIR, str(run_dir), type="bind")],
        # Tasks are reached at their own addresses: ZeroMQ keeps connections open, and a
        # virtual IP (IPVS) adds a hop, an idle timeout, and needs kernel support.
        "endpoint_spec": EndpointSpec(mode="dnsrr"),
        "secrets": [SecretReference(secret.id, secret.name, SECRET_FILE, uid, gid, 0o400)],
        "user": f"{uid}:{gid}",
        "init": True,
        "restart_policy": _restart_policy(spec),
        "constraints": [trainer_constraint] if spec.role == Role.TRAINER else None,
        **_stop_settings(spec),
    }


def _restart_policy(spec: dl.RoleSpec):
    """Every worker (the parameter service too: it restores its versions from the run folder)
    comes back after a crash, counted within :data:`RESTART_WINDOW_S`. So does the controller,
    killed or stopped by its engine, up to :data:`CONTROLLER_RETRIES` times over the run: it
    resumes the run, and its workers, whose connection closed, start again and join it. One
    started again after its run ended by itself exits 0 at once (:mod:`system.run.launch_end`).
    It was never started again before: a killed controller lost the run, its workers looping."""
    from docker.types import RestartPolicy

    if spec.role == "controller":  # window 0: Swarm counts every restart of the task
        return RestartPolicy("on-failure", delay=SECOND_NS, max_attempts=CONTROLLER_RETRIES)
    window = int(RESTART_WINDOW_S * SECOND_NS)
    return RestartPolicy("on-failure", delay=SECOND_NS, max_attempts=MAX_RESTARTS, window=window)


def service_resources(
    spec: dl.RoleSpec, needs: dict[str, RoleNeeds], reserve_cpus: frozenset[str] = frozenset()
):
    """Reservations (what Swarm places a task by) and limits, from the role's measured needs
    as Kubernetes gets them (``deploy/sizing.py``, ``manifests.Resources``): memory reserved at
    the measured peak plus a margin and limited at twice that, CPUs limited at what the role can
    use. CPUs are reserved only for the components in ``reserve_cpus`` (those ``--cpus`` names):
    Swarm never places more reservations than a node has, and a core reserved per busy worker
    would leave a small swarm (one 2-core node) unable to place a cartpole run at all."""
    from docker.types import Resources as SwarmResources

    from distributed.deploy.manifests import LIMIT_FACTOR

    component = component_of(spec.worker_id.replace("{ordinal}", "0"), spec.role)
    need = needs_of(needs, component)
    mib = 2**20
    return SwarmResources(
        cpu_reservation=int(need.cpus * SECOND_NS) if component in reserve_cpus else None,
        cpu_limit=int(need.cpu_limit * SECOND_NS),
        mem_reservation=need.memory_mib * mib,
        mem_limit=int(need.memory_mib * LIMIT_FACTOR) * mib,
    )


def _published_metrics(port: int):
    from docker.types import EndpointSpec

    return EndpointSpec(mode="dnsrr", ports={port: (dl.METRICS_PORT, "tcp", "host")})


def _stop_settings(spec: dl.RoleSpec) -> dict:
    """The controller turns SIGINT into an orderly stop (workers told to stop, summary
    written), so that is what Swarm sends it when the run is stopped. A worker sent SIGTERM (a
    drained node, a removed service) waits for its stop from the controller, whose stop does
    its work (a trainer sends its last version): each gets the same grace before Swarm's
    SIGKILL, where Swarm's default is 10 s."""
    grace = {"stop_grace_period": int(dl.STOP_GRACE_S) * SECOND_NS}
    return {"stop_signal": "SIGINT", **grace} if spec.role == "controller" else grace


# --------------------------------------------------------------------- finding a run again
def resolve_run(target: str) -> str:
    """A run's name from its name or its run folder."""
    path = Path(target)
    return dl.run_name(path) if path.is_dir() or "/" in target else dl.sanitise(target)


def find_services(client: docker.DockerClient, run: str) -> list[Service]:
    import docker  # the SDK loads only for commands that talk to an engine

    try:
        return client.services.list(filters={"label": f"{dl.LABEL_RUN}={run}"})
    except docker.errors.APIError as e:
        # status/logs/stop name a deployed run: on an engine outside a swarm there is none.
        why = str(e.explanation or e).rstrip(".")
        raise SwarmError(
            f"cannot list the services of run '{run}': {why}. Run this on a manager of the "
            "swarm the run was deployed to (`docker node ls` works there)"
        ) from e


def services_of(client: docker.DockerClient, target: str) -> tuple[str, list[Service]]:
    run = resolve_run(target)
    services = find_services(client, run)
    if not services:
        raise SwarmError(
            f"no services of a run named '{run}' on this swarm: `docker service ls --filter "
            f"label={dl.LABEL_RUN}` lists the deployed runs"
        )
    return run, services


def worker_of(service: Service) -> str:
    return service.attrs["Spec"]["Labels"].get(dl.LABEL_WORKER, service.name)


def controller_exit_code(
    client: docker.DockerClient, run: str, run_dir: Path | None = None
) -> int | None:
    """The run's exit code once its controller has ended it, else None
    (:func:`~distributed.deploy.swarm_tasks.controller_end` of its service's tasks)."""
    return controller_end(client.services.get(service_name(run, dl.CONTROLLER_ID)), run_dir)


def wait_for_controller(engine: Engine, run: str, console: Console, run_dir: Path) -> int:
    """Print the controller's lines, and how each worker task that fails ended, until the
    controller's task finishes; its exit code. Across the engine's absence (its restart, its
    socket's hiccup), and a manager not ready yet after it: ``deploy --wait`` ended there in a
    traceback, its clean-up failing too, and left the run's services behind."""
    from distributed.deploy.swarm_tasks import TaskWatch

    client = engine.client
    service = client.services.get(service_name(run, dl.CONTROLLER_ID))
    threading.Thread(target=_echo_logs, args=(service, console), daemon=True).start()
    tasks = TaskWatch(client, find_services(client, run), worker_of)
    waits = "for the run's controller (its services run on meanwhile)"
    while (
        code := engine.across(lambda: controller_exit_code(client, run, run_dir), waits)
    ) is None:
        for line in tasks.poll():  # how a worker ended: the controller sees it go silent
            console.print(Text(line), highlight=False)
        time.sleep(1.0)
    time.sleep(1.0)  # the last log lines
    return code


def _echo_logs(service: Service, console: Console) -> None:
    """The controller service's lines as they come, followed again from the second of the last
    line shown whenever the stream ends while the service stands: an engine's absence breaks it,
    and its restart ends it ("context canceled"), where the lines of the controller Swarm
    started again, which resumed the run, were never shown. Each line carries its time, so one
    of that second is not shown twice."""
    since: int | None = None
    shown: set[str] = set()  # the lines of the second ``since``, as they came
    while True:
        try:
            for raw in service.logs(
                stdout=True, stderr=True, follow=True, since=since, timestamps=True
            ):
                text = raw.decode(errors="replace").rstrip()
                stamp, _, line = text.partition(" ")
                if (second := _log_second(stamp)) is None:  # the engine's ("Error grabbing ...")
                    console.print(Text(text), highlight=False)
                    continue
                if stamp in shown:
                    continue
                if second != since:
                    since, shown = second, set()
                shown.add(stamp)
                console.print(Text(line), highlight=False)
        except Exception as e:  # the service was removed under the stream: nothing more to show
            if not engine_gone(e):
                return
        time.sleep(RETRY_S)


def _log_second(stamp: str) -> int | None:
    """The whole second of a log line's time (``2026-12-05T21:36:00.123456789Z``)."""
    from datetime import datetime

    try:
        return int(datetime.fromisoformat(stamp).timestamp())
    except ValueError:
        return None


def remove_run(client: docker.DockerClient, run: str, timeout_s: float = 60.0) -> None:
    """Stop the controller in order, remove the run's services, then its secret and network,
    waiting until the engine no longer lists them (Swarm removes tasks, and so frees the
    network, a little after their services)."""
    import docker

    label = {"label": f"{dl.LABEL_RUN}={run}"}
    stop_controller(client, run, timeout_s=dl.STOP_GRACE_S)
    for service in client.services.list(filters=label):
        service.remove()
    deadline = time.monotonic() + timeout_s
    while left := [*client.secrets.list(filters=label), *client.networks.list(filters=label)]:
        for item in left:
            with contextlib.suppress(docker.errors.APIError):  # still in use, or already gone
                item.remove()
        if time.monotonic() > deadline:
            names = ", ".join(item.name for item in left)
            raise SwarmError(
                f"could not remove {names} of run '{run}' in {timeout_s:.0f}s: remove them with "
                "`docker network rm` / `docker secret rm` once `docker ps` shows no task of it"
            )
        time.sleep(0.5)


def stop_controller(
    client: docker.DockerClient, run: str, timeout_s: float, run_dir: Path | None = None
) -> str:
    """Scale a running controller to zero and wait for its task to end: Swarm sends it SIGINT,
    and it stops every worker in order and writes the summary before it exits. Says what
    happened: ``troupe stop`` said "it stopped in order" of a controller that had died, or had
    never started (its image missing).

    ``run_dir`` (the run folder, where this machine sees it): a controller that has not started
    yet, or not yet taken the folder's lock (until then a SIGINT may kill it as it imports), is
    asked to stop through a request in the folder, which it reads as it starts
    (:mod:`distributed.launch.stop_request`); the stop was lost before, and the run went on."""
    import docker

    from distributed.launch import stop_request

    try:
        service = client.services.get(service_name(run, dl.CONTROLLER_ID))
    except docker.errors.NotFound:
        return "the run has no controller service: nothing stopped in order"
    code = controller_exit_code(client, run, run_dir)
    if code is not None:
        return f"the controller had already ended (exit code {code}): nothing stopped in order"
    running = any(t["Status"]["State"] == "running" for t in service.tasks())
    if run_dir is not None and not (running and stop_request.controller_listening(run_dir)):
        path = stop_request.write(run_dir)
        yet = ("its task runs, but it has not taken the run folder yet" if running
               else f"it has not started yet ({_task_states(service)})")  # fmt: skip
        return (f"the controller is not listening: {yet}; wrote {path}, it stops the run in "
                "order as it starts")  # fmt: skip
    if not running:
        return f"the controller was not running ({_task_states(service)}): nothing stopped in order"
    service.scale(0)
    deadline = time.monotonic() + timeout_s
    while any(t["Status"]["State"] == "running" for t in service.tasks()):
        if time.monotonic() > deadline:  # removing the services kills it
            return f"the controller did not stop in {timeout_s:.0f}s: its services are removed"
        time.sleep(0.5)
    return "scaled the controller to zero: Swarm sent it SIGINT and it stopped in order"


def _task_states(service: Service) -> str:
    """``rejected: No such image: ...``: the controller's tasks as Swarm last saw them."""
    said = []
    for task in service.tasks():
        status = task.get("Status", {})
        said.append(f"{status.get('State', '?')}: {status.get('Err') or status.get('Message', '')}")
    return "; ".join(dict.fromkeys(said)) or "no task"


# --------------------------------------------------------------------- troupe deploy swarm
def add_swarm_arguments(parser: argparse.ArgumentParser) -> None:
    """``troupe deploy swarm EXPERIMENT [key=value ...]`` (``deploy/commands.py`` adds it)."""
    parser.add_argument("experiment", nargs="?", help="registered experiment, e.g. cartpole-ppo")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value")
    add_import_argument(parser)
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a stopped run of its folder (one every node sees), from its last "
        "persisted version, under the same run name",
    )
    parser.add_argument(
        "--image", type=image_reference, default=DEFAULT_TAG, help="worker image every node can run"
    )
    parser.add_argument(
        "--run-dir", help="run folder; on several nodes, a shared path mounted alike on each"
    )
    parser.add_argument(
        "--trainer-constraint",
        default=DEFAULT_TRAINER_CONSTRAINT,
        metavar="EXPR",
        help=f"Swarm placement constraint for trainers ({DEFAULT_TRAINER_CONSTRAINT})",
    )
    parser.add_argument(
        "--wait", action="store_true", help="follow the controller to the end, then remove the run"
    )
    add_sizing_arguments(parser)
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=dl.METRICS_PORT,
        metavar="PORT",
        help=f"port of the controller's node where Prometheus scrapes /metrics ({dl.METRICS_PORT}; "
        "0: not published)",
    )


def run_swarm(args: argparse.Namespace, console: Console) -> int:
    """Deploy a run; with ``--wait`` also see it to its end and clean up."""
    from distributed.launch.run import prepare
    from distributed.launch.run_commands import experiment_and_overrides

    experiment, overrides = experiment_and_overrides(args)
    config, run_dir = prepare(experiment, overrides, args.run_dir, args.resume, args.imports)
    try:
        client = connect()
        image = deployable_image(args.image, client)
        refuse_deployed(client, dl.run_name(run_dir.resolve()))  # before config.json changes
        check_image_imports(client, image, config.code, args.image, config.environment)
    except BaseException:
        _give_up_folder(run_dir)
        raise
    from distributed.deploy.manifests import scale_policy_workers

    for line in scale_policy_workers(config, overrides):
        console.print(line, highlight=False)
    run_folder.write_json(run_dir / run_folder.CONFIG, config.to_dict(), indent=2)
    from system.run import folder_lock

    # The run's controller service owns the folder from here (it takes the lock itself).
    folder_lock.release(run_dir)
    from distributed.launch import stop_request

    stop_request.clear(run_dir)  # one an earlier deployment of this folder left untaken
    run = deploy(
        config,
        run_dir,
        image=image,
        trainer_constraint=args.trainer_constraint,
        client=client,
        metrics_port=args.metrics_port or None,
        needs=needs_from(args),
        reserve_cpus=frozenset(parse_overrides(args.cpus, "--cpus")),
    )
    from distributed.ops import record

    record.write(run_dir, record.LaunchRecord("swarm", run, run_dir=str(run_dir.resolve())))
    console.print(f"deployed run '{run}' (run folder {run_dir.resolve()})", highlight=False)
    if not args.wait:
        console.print(
            f"watch it: troupe status {run} | troupe logs {run} [--worker ID]; "
            f"remove it: troupe stop {run}",
            highlight=False,
        )
        return 0
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, raise_interrupt)  # a supervisor's stop: as Ctrl+C
    engine = Engine(client, run)
    try:
        return _wait_or_stop(engine, run, console, run_dir)
    finally:
        # The services, secret and network go whatever happened; signals wait for that.
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)
        _remove_across(engine, run)


def _remove_across(engine: Engine, run: str) -> None:
    """:func:`remove_run`, once the engine answers again if it does not now; if it never does,
    say what is left and how to remove it."""
    try:
        engine.across(lambda: remove_run(engine.client, run), "to remove the run's services")
    except DockerRunError:
        logger.warning("the run's services, secret and network are left in the swarm: once its "
                       "engine answers, `troupe stop %s` removes them", run)  # fmt: skip


def deployable_image(reference: str, client: docker.DockerClient) -> str:
    """The immutable reference every task of every node runs (:func:`pin`). An image this
    engine lacks must come from its registry, by digest: ``--image troupe-worker:nosuch``
    made the run folder, deployed every service and left the controller's task rejected with
    "No such image", its run never starting."""
    import docker

    from distributed.images.pinning import pin, repository
    from distributed.images.source import stale_image

    try:
        stale = stale_image(client.images.get(reference).labels, reference)
        if stale:
            logger.warning("%s", stale)
    except docker.errors.ImageNotFound:
        try:
            found = client.images.get_registry_data(reference)
        except docker.errors.APIError as e:
            raise SwarmError(
                f"image {reference} is neither in this engine nor found in a registry "
                f"({e.explanation or e}): build it here (troupe image build --tag {reference}), "
                "or push it where every node can pull it"
            ) from None
        return f"{repository(reference.partition('@')[0])}@{found.id}"
    return pin(reference, client)


def _give_up_folder(run_dir: Path) -> None:
    """Undo :func:`prepare` for a deployment refused after it: the lock goes, and the folder
    too when it holds nothing else (it was made for this run)."""
    from system.run import folder_lock

    folder_lock.release(run_dir)
    with contextlib.suppress(OSError):
        left = list(run_dir.iterdir())
        if all(path.name == folder_lock.LOCK_FILE for path in left):
            for path in left:
                path.unlink()
            run_dir.rmdir()


def _wait_or_stop(engine: Engine, run: str, console: Console, run_dir: Path) -> int:
    """The controller's exit code; on a first signal, its orderly stop (130); on a second
    while that goes on, every service removed at once (131)."""
    client = engine.client
    try:
        return wait_for_controller(engine, run, console, run_dir)
    except KeyboardInterrupt:
        console.print("stopping the run in order (a second Ctrl+C or signal stops it at once)")
    try:
        engine.across(lambda: stop_controller(client, run, dl.STOP_GRACE_S), "to stop the run")
    except KeyboardInterrupt:
        console.print("stopping at once: every service is removed")
        for service in find_services(client, run):
            service.remove()
        return EXIT_ABANDONED
    return EXIT_INTERRUPTED
