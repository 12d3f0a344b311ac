"""What each launcher's scheduler says about a run, and how each stops one in order.

The run folder answers most of ``troupe status`` and ``troupe logs`` for every launcher
(:mod:`distributed.ops.folder`); a backend adds what only the scheduler knows (its processes,
containers, services, pods or job steps and their states), the scheduler's own log stream where
the folder is out of reach (a Kubernetes pod that does not mount it, a container's stdout), and
the stop: always the controller first, by the signal it turns into an orderly stop (SIGINT;
SIGTERM from Kubernetes), then, for schedulers that keep objects, their removal.

Longer than 400 lines because it holds one small class per launcher (five), which share the
shape of :class:`Backend` and are easiest to compare side by side.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

from distributed.errors import OpsError
from distributed.ops.record import LaunchRecord, pid_alive
from distributed.ops.record import read as read_record


@dataclass(frozen=True)
class Process:
    """One row of ``troupe ps``: a process, container, service, pod or job step."""

    name: str
    worker: str
    state: str
    where: str = ""
    detail: str = ""
    running: int = 0
    """Its processes, containers or tasks that run now, where the scheduler says so."""


class Backend(Protocol):
    def alive(self, record: LaunchRecord) -> bool | None:
        """Whether the run still goes on (None: cannot tell from here)."""

    def processes(self, record: LaunchRecord) -> list[Process]: ...

    def logs(
        self, record: LaunchRecord, worker: str | None, tail: int, follow: bool
    ) -> Iterator[tuple[str, str]]:
        """(worker id, line) from the scheduler's own stream (stdout and stderr)."""

    def stop(self, record: LaunchRecord, now: bool) -> str:
        """Ask the controller to stop the run (in order; ``now``: at once); say what was done."""

    def remove(self, record: LaunchRecord) -> str | None:
        """Remove what the scheduler keeps of a stopped run (None: nothing to remove)."""


# --------------------------------------------------------------------- local and docker
class LocalBackend:
    """A run whose controller (local) or container runner (docker) is a process of one machine:
    signals reach it there, from any shell of that machine."""

    def alive(self, record: LaunchRecord) -> bool | None:
        if record.pid is None:  # a copy of a run folder, or one of before records unlocked:
            return False  # no process is its own, on this machine or any other
        if not record.here:
            return None
        return record.running_here()

    def processes(self, record: LaunchRecord) -> list[Process]:
        from distributed.ops import folder

        run_dir = record.folder()
        table = folder.workers(run_dir) if run_dir else {}
        rows = [Process("controller", "controller", _pid_state(record), record.host or "",
                        f"pid {record.pid}" if record.pid else NO_PROCESS)]  # fmt: skip
        alive = self.alive(record)
        for worker, info in table.items():
            state = worker_state(record, info, alive)
            rows.append(Process(f"pid {info.get('pid')}", worker, state, record.host or "",
                                f"restarts {info.get('restarts', 0)}"))  # fmt: skip
        return rows

    def logs(self, record, worker, tail, follow) -> Iterator[tuple[str, str]]:
        return iter(())  # the run folder holds every process's log

    def stop(self, record: LaunchRecord, now: bool) -> str:
        if record.pid is None:
            return f"run '{record.run}' is not running ({NO_PROCESS})"
        if not record.here:
            raise OpsError(
                f"run '{record.run}' runs on {record.host}: run troupe stop there (its process "
                f"{record.pid} is not one of this machine's)"
            )
        if not record.running_here():
            return f"run '{record.run}' is not running (process {record.pid} has ended)"
        os.kill(record.pid, signal.SIGINT)
        if now:  # a second signal: the controller abandons the orderly stop
            if wait_until_ended(self, record, SECOND_SIGNAL_AFTER_S, every_s=0.05):  # in order
                return (f"sent SIGINT to process {record.pid}: the run stopped in order within "
                        f"{SECOND_SIGNAL_AFTER_S:g} s")  # fmt: skip
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.pid, signal.SIGINT)
            return f"sent two SIGINTs to process {record.pid}: the run stops at once"
        return f"sent SIGINT to process {record.pid}: the run stops in order"

    def remove(self, record: LaunchRecord) -> str | None:
        return None


SECOND_SIGNAL_AFTER_S = 0.5
"""``troupe stop --now`` sends its second SIGINT this long after the first: later than
:data:`distributed.launch.signals.DUPLICATE_S`, within which the two would be one request."""


def wait_until_ended(
    be: Backend, record: LaunchRecord, wait_s: float, every_s: float = 0.5
) -> bool:
    """Whether the run is seen ended (``be.alive`` False) within ``wait_s``, looked at every
    ``every_s``."""
    deadline = time.monotonic() + wait_s
    while be.alive(record) is not False:
        if time.monotonic() >= deadline:
            return False
        time.sleep(every_s)
    return True


FINAL_STATES = ("stopped", "failed", "killed")


def worker_state(record: LaunchRecord, info: dict, run_alive: bool | None) -> str:
    """A worker's state as ``workers.json`` has it, said to be stale where it is.

    The controller writes that file, so a controller killed outright (``kill -9``, the kernel's
    OOM killer) leaves its last word there: every worker ``alive`` after they have all gone.
    Where the worker's pid is this machine's (a local run launched here), its process is looked
    at (``gone (was alive)``; ``alive, no controller`` for one that outlived it); elsewhere, a
    run that is not running has none of its workers running either (``was alive``)."""
    state = str(info.get("state", "?"))
    if state in FINAL_STATES:
        return state
    pid = info.get("pid")
    if record.launcher == "local" and record.here and pid:
        if not pid_alive(pid):
            return f"gone (was {state})"
        if run_alive is False:
            return f"{state}, no controller"
        return state
    return f"was {state}" if run_alive is False else state


NO_PROCESS = (
    "no process is its own: a copy of another run's folder, or one that no controller holds"
)


def _pid_state(record: LaunchRecord) -> str:
    if record.pid is None:
        return "none"
    if not record.here:
        return f"on {record.host}"
    return "running" if record.running_here() else "ended"


class DockerBackend(LocalBackend):
    """``troupe run --launcher docker``: the runner process stops the run and removes its
    containers; when it is gone (killed), the containers are reached through the engine."""

    def _client(self):
        from distributed.images.build import connect

        return connect()

    def _containers(self, record: LaunchRecord, client: Any = None) -> list[Any]:
        from distributed.launch import docker_run as dr

        client = client or self._client()
        return client.containers.list(all=True, filters={"label": f"{dr.LABEL_RUN}={record.run}"})

    def alive(self, record: LaunchRecord) -> bool | None:
        if record.running_here():
            return True
        try:
            return any(c.status == "running" for c in self._containers(record))
        except Exception:  # no engine answers here: cannot tell
            return None

    def processes(self, record: LaunchRecord) -> list[Process]:
        from distributed.launch import docker_run as dr

        rows = [Process("runner", "controller", _pid_state(record), record.host or "",
                        f"pid {record.pid}" if record.pid else NO_PROCESS)]  # fmt: skip
        for c in sorted(self._containers(record), key=lambda c: c.name):
            restarts = c.attrs.get("RestartCount", 0)
            code = c.attrs.get("State", {}).get("ExitCode")
            detail = f"restarts {restarts}" + (f", exit {code}" if c.status == "exited" else "")
            rows.append(Process(c.name, c.labels.get(dr.LABEL_WORKER, "?"), c.status,
                                "docker", detail, int(c.status == "running")))  # fmt: skip
        return rows

    def logs(self, record, worker, tail, follow) -> Iterator[tuple[str, str]]:
        from distributed.launch import docker_run as dr

        streams = {}
        for c in self._containers(record):
            wid = c.labels.get(dr.LABEL_WORKER, c.name)
            if worker in (None, wid, wid.split("/")[0]):
                streams[wid] = c
        return _merge({w: _docker_lines(c, tail, follow) for w, c in streams.items()}, follow)

    def stop(self, record: LaunchRecord, now: bool) -> str:
        if record.running_here():
            return super().stop(record, now)
        from distributed.launch import docker_run as dr

        controller = [c for c in self._containers(record) if c.status == "running"
                      and c.labels.get(dr.LABEL_WORKER) == dr.CONTROLLER_ID]  # fmt: skip
        if not controller:
            return f"run '{record.run}' has no running controller container"
        controller[0].kill(signal="SIGKILL" if now else "SIGINT")
        return f"sent {'SIGKILL' if now else 'SIGINT'} to container {controller[0].name}"

    def remove(self, record: LaunchRecord) -> str | None:
        """Containers left by a runner that was killed (its own exit removes them)."""
        if record.running_here():
            return None
        from distributed.launch.docker_output import LABEL_RUN

        client = self._client()
        left = self._containers(record, client)
        networks = client.networks.list(filters={"label": f"{LABEL_RUN}={record.run}"})
        if not left and not networks:  # a network alone: its engine went away at the end
            return None
        from distributed.launch.docker_engine import remove_run_objects

        remove_run_objects(client, record.run)
        return f"removed {len(left)} container(s) and the network of run '{record.run}'"


def _docker_lines(container, tail: int, follow: bool) -> Iterator[str]:
    out = container.logs(stdout=True, stderr=True, tail=tail, stream=follow, follow=follow)
    if not follow:
        yield from out.decode(errors="replace").splitlines()
        return
    yield from _whole_lines(out)


def _whole_lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """Lines of a byte stream whose chunks end anywhere, a line split over two included."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.decode(errors="replace")
    if pending:
        yield pending.decode(errors="replace")


# --------------------------------------------------------------------- swarm
class SwarmBackend:
    """A ``troupe deploy swarm`` run: services labelled with the run's name."""

    @staticmethod
    def find(name: str) -> LaunchRecord | None:
        from distributed.deploy import swarm

        try:
            client = swarm.connect()
            run = swarm.resolve_run(name)
            services = swarm.find_services(client, run)
        except Exception:  # no engine, not a manager: not a Swarm run
            return None
        if not services:
            return None
        run_dir = services[0].attrs["Spec"]["Labels"].get(swarm.LABEL_RUN_DIR)
        return LaunchRecord("swarm", run, run_dir=run_dir)

    def _services(self, record: LaunchRecord):
        from distributed.deploy import swarm

        client = swarm.connect()
        return client, swarm.find_services(client, record.run)

    def alive(self, record: LaunchRecord) -> bool | None:
        """Whether the controller service has a task that has not finished, or one that Swarm
        is to start again (scaled to zero by a stop, its tasks end; at the run's end, its last
        task completes): ``swarm.controller_exit_code``."""
        from distributed.deploy import swarm
        from distributed.launch import docker_run as dl

        client, services = self._services(record)
        name = swarm.service_name(record.run, dl.CONTROLLER_ID)
        if not any(s.name == name for s in services):
            return False
        return swarm.controller_exit_code(client, record.run) is None

    def processes(self, record: LaunchRecord) -> list[Process]:
        from distributed.deploy import swarm
        from distributed.deploy.swarm_tasks import last_failure
        from distributed.launch.docker_output import CONTROLLER_ID

        rows = []
        for service in sorted(self._services(record)[1], key=lambda s: s.name):
            tasks = service.tasks()
            running = sum(t["Status"]["State"] == "running" for t in tasks)
            desired = service.attrs["Spec"]["Mode"].get("Replicated", {}).get("Replicas", 1)
            nodes = sorted({t.get("NodeID", "")[:12] for t in tasks if t.get("NodeID")})
            worker, note = swarm.worker_of(service), f"restarts {max(0, len(tasks) - desired)}"
            if failure := last_failure(tasks, worker):  # what `docker service ps` would say
                note += f"; {_how_it_ended(worker == CONTROLLER_ID, running)}: {failure}"
            rows.append(Process(service.name, worker, f"{running}/{desired} running",
                                ",".join(nodes), note, running))  # fmt: skip
        return rows

    def logs(self, record, worker, tail, follow) -> Iterator[tuple[str, str]]:
        from distributed.deploy import swarm

        _, services = self._services(record)
        for service in sorted(services, key=lambda s: s.name):
            for wid, line in _service_lines(swarm.worker_of(service), service, tail):
                if worker in (None, wid, wid.split("/")[0]):
                    yield wid, line

    def stop(self, record: LaunchRecord, now: bool) -> str:
        from distributed.deploy import swarm
        from distributed.launch import docker_run as dl

        client, services = self._services(record)
        if now:
            for service in services:
                service.remove()
            return f"removed the {len(services)} service(s) of run '{record.run}' at once"
        return swarm.stop_controller(
            client, record.run, timeout_s=dl.STOP_GRACE_S, run_dir=record.folder()
        )

    def remove(self, record: LaunchRecord) -> str | None:
        from distributed.deploy import swarm

        client, _ = self._services(record)
        swarm.remove_run(client, record.run)
        return f"removed run '{record.run}' from the swarm (services, secret, network)"


def _how_it_ended(controller: bool, running: int) -> str:
    """A worker's task failed; a controller's exit is its run's end (130: stopped in order),
    unless Swarm started it again to resume the run (it runs: its last task ended)."""
    if not controller:
        return "last failed"
    return "last ended" if running else "ended"


def _service_lines(template: str, service, tail: int) -> Iterator[tuple[str, str]]:
    """(worker id, line) for a service's last lines; a replica's id comes from its task's slot
    (``actor/?`` for a line whose task Swarm no longer lists)."""
    from distributed.deploy.swarm_tasks import task_worker

    tasks = {t["ID"]: t for t in service.tasks()}
    for raw in service.logs(stdout=True, stderr=True, details=True, tail=tail):
        details, _, line = raw.decode(errors="replace").rstrip().partition(" ")
        found = re.search(r"com\.docker\.swarm\.task\.id=(\w+)", details)
        task = tasks.get(found.group(1), {}) if found else {}
        yield task_worker(template, task).replace("{ordinal}", "?"), line


# --------------------------------------------------------------------- kubernetes
class K8sBackend:
    """A ``troupe deploy k8s --apply`` run: objects labelled ``troupe.run=<run>`` in its
    namespace. Stopping suspends the controller's Job (the kubelet sends its pod SIGTERM, which
    it turns into an orderly stop, and nothing starts another), waits for the controller to
    finish, then deletes the run's Jobs, Services, config and secrets; the run's volume claim
    stays."""

    KINDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ("BatchV1Api", "job"),
        ("CoreV1Api", "service"),
        ("CoreV1Api", "config_map"),
        ("CoreV1Api", "secret"),
        ("PolicyV1Api", "pod_disruption_budget"),
        ("NetworkingV1Api", "network_policy"),
    )
    NAMESPACE: ClassVar[str] = os.environ.get("TROUPE_K8S_NAMESPACE", "troupe")

    def __init__(self, apis: dict[str, Any] | None = None) -> None:
        self._apis = apis

    def apis(self) -> dict[str, Any]:
        if self._apis is None:
            from distributed.deploy.k8s_apply import connect

            self._apis = connect()
        return self._apis

    @classmethod
    def find(cls, name: str) -> LaunchRecord | None:
        try:
            pods = cls().pods(LaunchRecord("k8s", name, namespace=cls.NAMESPACE))
        except Exception:  # no client, no kubeconfig, no such namespace
            return None
        return LaunchRecord("k8s", name, namespace=cls.NAMESPACE) if pods else None

    def pods(self, record: LaunchRecord) -> list[Any]:
        core = self.apis()["CoreV1Api"]
        found = core.list_namespaced_pod(
            record.namespace, label_selector=_selector(record), _request_timeout=API_TIMEOUT_S
        )
        return sorted(found.items, key=lambda p: p.metadata.name)

    def alive(self, record: LaunchRecord) -> bool | None:
        controllers = [p for p in self.pods(record) if _component(p) == "controller"]
        return any(p.status.phase in ("Pending", "Running") for p in controllers)

    def processes(self, record: LaunchRecord) -> list[Process]:
        rows = []
        for pod in self.pods(record):
            statuses = pod.status.container_statuses or []
            note = f"restarts {sum(s.restart_count or 0 for s in statuses)}"
            if ended := _last_termination(statuses):
                note += f"; last ended: {ended}"
            rows.append(Process(pod.metadata.name, _component(pod), pod.status.phase or "?",
                                pod.spec.node_name or "", note))  # fmt: skip
        return rows

    def logs(self, record, worker, tail, follow) -> Iterator[tuple[str, str]]:
        core = self.apis()["CoreV1Api"]
        streams = {}
        for pod in self.pods(record):
            name = pod.metadata.name
            if worker not in (None, name, _component(pod)):
                continue
            streams[name] = _pod_lines(core, name, record.namespace, tail, follow)
        return _merge(streams, follow)

    def stop(self, record: LaunchRecord, now: bool) -> str:
        """Suspend the controller's Job. Deleting its pod, as this did, let the Job controller
        start another at once (it replaces a pod as soon as it is terminating), which resumed
        the run: the stop never ended it, and a pod still pending was replaced before it ran. A
        suspended Job's pods get SIGTERM and the pod's grace period (the manifest's
        ``terminationGracePeriodSeconds``), and no pod takes their place. ``now``: the pods are
        then deleted with no grace (SIGKILL)."""
        from distributed.launch.docker_run import STOP_GRACE_S

        batch, core = self.apis()["BatchV1Api"], self.apis()["CoreV1Api"]
        selector = f"{_selector(record)},{COMPONENT_LABEL}=controller"
        jobs = batch.list_namespaced_job(
            record.namespace, label_selector=selector, _request_timeout=API_TIMEOUT_S
        ).items
        if not jobs:
            return f"run '{record.run}' has no controller Job"
        pods = [p for p in self.pods(record) if _component(p) == "controller"]
        for job in jobs:
            batch.patch_namespaced_job(job.metadata.name, record.namespace, SUSPEND,
                                       _request_timeout=API_TIMEOUT_S)  # fmt: skip
        if now:
            for pod in pods:
                core.delete_namespaced_pod(pod.metadata.name, record.namespace,
                                           grace_period_seconds=0,
                                           _request_timeout=API_TIMEOUT_S)  # fmt: skip
            return "suspended the controller's Job and deleted its pod at once (grace period 0)"
        if not any(p.status.phase == "Running" for p in pods):
            return (
                "suspended the controller's Job before its pod ran: Kubernetes removes the "
                "pending pod and starts no other, so the run ends without starting"
            )
        return (
            "suspended the controller's Job: Kubernetes sent its pod SIGTERM, and it stops the "
            f"run in order (its grace period: {STOP_GRACE_S:.0f} s); a suspended Job starts no "
            "other pod"
        )

    def remove(self, record: LaunchRecord) -> str | None:
        apis, removed = self.apis(), 0
        for api, kind in self.KINDS:
            listed = getattr(apis[api], f"list_namespaced_{kind}")(
                record.namespace, label_selector=_selector(record)
            )
            for item in listed.items:
                getattr(apis[api], f"delete_namespaced_{kind}")(
                    item.metadata.name, record.namespace, propagation_policy="Background"
                )
                removed += 1
        return f"deleted {removed} object(s) of run '{record.run}' (its volume claim is kept)"


API_TIMEOUT_S = 10
"""A kubeconfig naming a cluster that does not answer must not hang ``troupe status``."""
COMPONENT_LABEL = "app.kubernetes.io/component"
SUSPEND = {"spec": {"suspend": True}}
"""The patch that stops a Job: its pods terminated gracefully, none started in their place."""


def _last_termination(statuses: list[Any]) -> str | None:
    """How a pod's container last ended before its restart, as the kubelet recorded it
    (``OOMKilled, exit code 137 (SIGKILL)``): the controller sees only a worker gone silent."""
    from distributed.launch.signals import signal_name

    for status in statuses:
        last = getattr(status, "last_state", None)
        ended = getattr(last, "terminated", None) if last is not None else None
        if ended is None:
            continue
        code = getattr(ended, "exit_code", None)
        text = f"{getattr(ended, 'reason', None) or 'terminated'}, exit code {code}"
        if isinstance(code, int) and 128 < code < 128 + signal.NSIG:
            text += f" ({signal_name(code - 128)})"
        return text
    return None


def _selector(record: LaunchRecord) -> str:
    return f"troupe.run={record.run}"


def _component(pod) -> str:
    return (pod.metadata.labels or {}).get(COMPONENT_LABEL, "?")


def _pod_lines(core, name: str, namespace: str, tail: int, follow: bool) -> Iterator[str]:
    if not follow:
        text = core.read_namespaced_pod_log(name, namespace, tail_lines=tail)
        yield from text.splitlines()
        return
    response = core.read_namespaced_pod_log(
        name, namespace, tail_lines=tail, follow=True, _preload_content=False
    )
    yield from _whole_lines(response.stream())


# --------------------------------------------------------------------- slurm
class SlurmBackend:
    """A ``troupe deploy slurm`` job: its steps are the roles (``controller``, ``actor``, ...).
    Stopping signals the controller step (SIGINT, an orderly stop; the job script ends when the
    controller does); ``--now`` cancels the whole job."""

    @staticmethod
    def find(name: str) -> LaunchRecord | None:
        if shutil.which("squeue") is None or not _controller_answers():
            return None
        try:
            out = _slurm("squeue", "-h", "-n", f"troupe-{name}", "-o", "%i")
        except OpsError:
            return None
        jobs = out.split()
        if not jobs:
            return None
        return LaunchRecord("slurm", name, run_dir=_run_dir_of(jobs[-1]), job_id=jobs[-1])

    def job(self, record: LaunchRecord) -> str:
        if record.job_id:
            return record.job_id
        found = self.find(record.run)
        if found is None:
            raise OpsError(
                f"run '{record.run}' has no Slurm job id yet: it is written to the run folder "
                f"when the job starts, and squeue lists no job named troupe-{record.run}"
            )
        return found.job_id

    def alive(self, record: LaunchRecord) -> bool | None:
        if not record.job_id and shutil.which("squeue") and self.find(record.run) is None:
            return False  # never started, and not (or no longer) queued: cancelled queued
        state = _slurm("squeue", "-h", "-j", self.job(record), "-o", "%T", check=False)
        return state.strip() in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED")

    def _steps(self, record: LaunchRecord) -> list[list[str]]:
        """``[step id, name, state, nodes]`` of each step. ``-O`` and not ``-o``: a step's state
        has no ``-o`` letter (``%T`` is a job's, printed as ``%T`` for a step on Slurm 22.05)."""
        fields = "StepId:|,StepName:|,StepState:|,Nodes:|"
        out = _slurm("squeue", "-h", "-s", "-j", self.job(record), "-O", fields, check=False)
        rows = [line.split("|")[:4] for line in out.splitlines() if line.count("|") >= 4]
        return [[field.strip() for field in row] for row in rows]

    def processes(self, record: LaunchRecord) -> list[Process]:
        job = _slurm("squeue", "-h", "-j", self.job(record), "-o", "%T|%N", check=False).strip()
        state, _, nodes = job.partition("|")
        rows = [Process(f"job {self.job(record)}", "(batch)", state or "ended", nodes)]
        for step, name, step_state, nodes in self._steps(record):
            rows.append(Process(f"step {step}", name, step_state or "?", nodes))
        return rows

    def logs(self, record, worker, tail, follow) -> Iterator[tuple[str, str]]:
        return iter(())  # the run folder (a file system every node mounts) holds the logs

    def stop(self, record: LaunchRecord, now: bool) -> str:
        """SIGINT to the controller step once its controller holds the run folder (it then
        stops the run in order). Before that: a job still queued is cancelled (nothing of it
        has run), and a started job whose controller has not started yet gets a stop request
        in its run folder, which its controller reads as it starts. Both used to be "no
        controller step running" and nothing more: the job started later and ran on, and a
        signal to a controller still importing killed it with a traceback and no summary."""
        from distributed.launch import stop_request

        job = self.job(record)
        record = replace(record, job_id=job)  # gone from squeue once cancelled: asked by id
        if now:
            _slurm("scancel", job)
            return f"cancelled job {job} at once"
        state = _slurm("squeue", "-h", "-j", job, "-o", "%T|%r", check=False).strip()
        state, _, reason = state.partition("|")
        if state == "PENDING":  # only if it still is: one that started meanwhile is not killed
            _slurm("scancel", "--state=PENDING", job)
            if self.alive(record) is False:
                return (f"job {job} was still waiting in the queue ({reason or 'pending'}): "
                        "cancelled it before anything of the run started")  # fmt: skip
        steps = [s for s in self._steps(record) if s[1] == "controller"]
        run_dir = Path(record.run_dir) if record.run_dir else None
        if run_dir is not None and not run_dir.parent.is_dir():  # not mounted here
            run_dir = None
        if steps and (run_dir is None or stop_request.controller_listening(run_dir)):
            _slurm("scancel", "--signal=INT", steps[0][0])
            return f"sent SIGINT to step {steps[0][0]} (the controller): the run stops in order"
        if run_dir is None:
            return (f"job {job} has not started its controller yet, and its run folder is not "
                    "known here: nothing stopped (troupe stop DEPLOY_FOLDER asks its "
                    "controller to stop as it starts; --now cancels the job)")  # fmt: skip
        path = stop_request.write(run_dir, job_id=job)
        return (f"job {job} has not started its controller yet: wrote {path}, its controller "
                "stops the run in order as it starts")  # fmt: skip

    def remove(self, record: LaunchRecord) -> str | None:
        return None  # the job ends with its controller


def _run_dir_of(job: str) -> str | None:
    """The run folder of a ``troupe deploy slurm`` job: its script lies in the deploy folder,
    whose launch record names the run folder (None where this machine does not see it)."""
    script = _slurm("squeue", "-h", "-j", job, "-o", "%o", check=False).strip()
    if not script.startswith("/"):
        return None
    try:
        record = read_record(Path(script).parent)
    except OpsError:
        return None
    return record.run_dir if record is not None else None


def _controller_answers() -> bool:
    """Whether a Slurm controller is up to ask, by ``scontrol ping`` (one try, milliseconds).
    ``squeue`` against a controller that is down retries for about 9 s before it fails: every
    ``troupe status NAME`` of a name that is not a run waited that long on a machine with the
    Slurm client installed and no controller running. Without ``scontrol``, assumed up."""
    if shutil.which("scontrol") is None:
        return True
    try:
        done = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return True  # squeue says what is wrong, if anything
    return " is UP" in done.stdout


def _slurm(*argv: str, check: bool = True) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise OpsError(f"{argv[0]} failed: {e}") from e
    if check and done.returncode != 0:
        raise OpsError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


# --------------------------------------------------------------------- merging streams
def _merge(streams: dict[str, Iterator[str]], follow: bool) -> Iterator[tuple[str, str]]:
    """(worker, line) from several streams: one after another, or (``follow``) as they come,
    one thread a stream."""
    if not follow:
        for worker, lines in streams.items():
            for line in lines:
                yield worker, line
        return
    lines: queue.Queue[tuple[str, str] | None] = queue.Queue(maxsize=10_000)

    def pump(worker: str, stream: Iterator[str]) -> None:
        try:
            for line in stream:
                lines.put((worker, line))
        except Exception as e:  # the object went away under the stream
            lines.put((worker, f"(stream ended: {e})"))
        finally:
            lines.put(None)

    for worker, stream in streams.items():
        threading.Thread(target=pump, args=(worker, stream), daemon=True).start()
    left = len(streams)
    while left:
        item = lines.get()
        if item is None:
            left -= 1
        else:
            yield item


BACKENDS: dict[str, type] = {
    "local": LocalBackend,
    "docker": DockerBackend,
    "swarm": SwarmBackend,
    "k8s": K8sBackend,
    "slurm": SlurmBackend,
}
FINDERS = (SwarmBackend, K8sBackend, SlurmBackend)
"""Who is asked for a run named by its name alone, in order."""


def backend(record: LaunchRecord) -> Backend:
    return BACKENDS[record.launcher]()


def resolve(name: str, runs_dir: Path) -> LaunchRecord:
    """The run ``name`` names: a folder, a folder under ``runs_dir``, or a cluster run of that
    name (Swarm, Kubernetes, Slurm, asked in that order where each answers). A folder that is
    no run folder (a ``cp1/`` of something else beside ``runs/``) does not hide the others."""
    not_runs: list[str] = []
    for folder in (Path(name), Path(runs_dir) / name):  # the same one where name is absolute
        if folder.is_dir() and str(folder) not in not_runs:
            record = read_record(folder)
            if record is not None:
                return record
            not_runs.append(str(folder))
    for backend in FINDERS:
        record = backend.find(name)
        if record is not None:
            return record
    if not_runs:
        what = "is a folder but not a run folder" if len(not_runs) == 1 else (
            "are folders but not run folders")  # fmt: skip
        raise OpsError(
            f"{' and '.join(not_runs)} {what} (no config.json or launch.json), and no Swarm, "
            f"Kubernetes or Slurm run is named '{name}'"
        )
    raise OpsError(
        f"no run '{name}': not a run folder, nothing under {runs_dir}/, and no Swarm service, "
        "Kubernetes pod or Slurm job carries that name (troupe ps lists the runs under "
        f"{runs_dir}/)"
    )
