"""How a Swarm run's tasks ended, read from Swarm's task records.

Inside the swarm the controller sees only that a worker went silent: a task killed for memory,
one that crashed, and one Swarm could not place (an image missing on a node, no node with the
resources asked) all looked alike there, and the reason stayed in ``docker service ps``. Swarm
keeps each task's state, exit code and error in the manager, for every node alike, so
``troupe deploy swarm --wait`` reports each failed task as it sees it, and ``troupe ps`` says
how a service's last failed task ended. A controller's last task is its run's end, unless Swarm
is to start it again, to resume the run (:func:`controller_end`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed.deploy.manifests import CONTROLLER_RETRIES
from distributed.launch.docker_output import CONTROLLER_ID, container_exit
from distributed.launch.signals import (
    EXIT_ABANDONED,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    exit_code_of,
)
from distributed.ops import folder
from system.run import launch_end

if TYPE_CHECKING:
    import docker
    from docker.models.services import Service

logger = logging.getLogger(__name__)

FINISHED_STATES = ("complete", "failed", "shutdown", "rejected", "orphaned", "remove")
CONTROLLER_EXITS = {
    EXIT_FAILED: "the run failed: summary.json says why",
    2: "a bad argument",
    EXIT_INTERRUPTED: "the run was stopped in order",
    EXIT_ABANDONED: "the run was stopped at once; resume it from its last persisted version",
}
"""What a controller's own exit codes mean (:mod:`distributed.launch.signals`): its run's end,
where in a worker's the same number is a death by a signal (130: SIGINT)."""
FAILED_STATES = ("failed", "rejected")
"""Task states that say something went wrong. A worker leaving on the run's stop completes
(exit 0), and a task removed with its service is shut down: neither is reported."""


def task_end(task: dict[str, Any], worker: str | None = None) -> str | None:
    """How ``task`` (of ``worker``'s service) ended, where it failed (``exit code 137 (SIGKILL;
    ...)``, ``rejected by Swarm: No such image ...``); None for a task that runs, completed or
    was shut down."""
    status = task.get("Status") or {}
    state = status.get("State")
    if state not in FAILED_STATES:
        return None
    error = str(status.get("Err") or "").strip()
    if state == "rejected":
        return f"rejected by Swarm: {error or 'no reason given'}"
    code = (status.get("ContainerStatus") or {}).get("ExitCode")
    if code is None or (code == 0 and error):  # 0: its container went, "No such container"
        return f"failed: {error or 'no reason given'}"
    if worker == CONTROLLER_ID and int(code) in CONTROLLER_EXITS:
        return f"exit code {code} ({CONTROLLER_EXITS[int(code)]})"
    return container_exit(int(code))


def last_failure(tasks: list[dict[str, Any]], worker: str) -> str | None:
    """How the most recent failed task among ``tasks`` (of ``worker``'s service) ended, if any
    did; a replica's says which (``actor/1: exit code 137 ...``)."""
    ended = [t for t in tasks if task_end(t, worker) is not None]
    if not ended:
        return None
    last = max(ended, key=lambda t: str(t.get("UpdatedAt", "")))
    which = task_worker(worker, last)
    end = task_end(last, worker)
    return f"{which}: {end}" if which != worker else end


def task_worker(worker: str, task: dict[str, Any]) -> str:
    """The worker id a task of ``worker``'s service runs: a replica's ordinal is its slot - 1
    (``actor/{ordinal}``, slot 2: ``actor/1``), as ``troupe worker`` reads ``TROUPE_SLOT``."""
    if "{ordinal}" in worker and task.get("Slot"):
        return worker.replace("{ordinal}", str(int(task["Slot"]) - 1))
    return worker


class TaskWatch:
    """Reports each task of a run that fails, once: ``[actor/0] its task ended: exit code 137
    (SIGKILL; ...)``. One API call a poll, whatever the number of services. ``deploy --wait``
    polls only while the run goes on, so a controller's failure it reports is one Swarm starts
    again (``swarm.controller_exit_code``)."""

    def __init__(self, client: docker.DockerClient, services: list[Service], worker_of):
        self.client = client
        self.workers = {s.id: worker_of(s) for s in services}
        self.seen: set[str] = set()

    def poll(self) -> list[str]:
        """Lines for the tasks that failed since the last poll (none if Swarm cannot say)."""
        if not self.workers:
            return []
        try:
            tasks = self.client.api.tasks(filters={"service": list(self.workers)})
        except Exception:  # the engine busy or the services going: the next poll asks again
            return []
        lines = []
        for task in sorted(tasks, key=lambda t: str(t.get("UpdatedAt", ""))):
            worker = self.workers.get(task.get("ServiceID"))
            end = task_end(task, worker or "")
            if end is None or task.get("ID") in self.seen or worker is None:
                continue
            self.seen.add(task["ID"])
            if worker == CONTROLLER_ID:  # polled while the run goes on: a restart is due
                end += "; Swarm starts it again, to resume the run unless it had ended"
            lines.append(f"[{task_worker(worker, task)}] its task ended: {end}")
        return lines


def controller_end(service: Service, run_dir: Path | None = None) -> int | None:
    """The exit code of a run's controller service's last task once the run has ended, else
    None: while a task runs or starts, and while Swarm is to start a failed one again
    (:func:`_restart_due`). ``run_dir``: the run folder, where this machine sees it.

    - A task failed with exit code 0 has none of its own: its container went in the engine's
      restart ("No such container"), and ``troupe stop`` said "exit code 0" of a run that had
      stopped interrupted. Its code is then the one its summary gives (:func:`exit_code_of`; 1
      with no run folder here).
    - A task that exited 0 may be a controller started again after its run ended, which has
      nothing to resume: the run's code is its summary's (a failed run's 1, not 0)."""
    tasks = service.tasks()
    if not tasks:  # none yet; or none left: Swarm removes a service's tasks scaled to zero
        if _replicas(service) != 0:
            return None
        return exit_code_of(folder.summary(run_dir) if run_dir is not None else None)
    if any(t["Status"]["State"] not in FINISHED_STATES for t in tasks):
        return None
    last = max(tasks, key=lambda t: str(t.get("CreatedAt", "")))
    if _restart_due(service, tasks, last):
        return None
    status = last["Status"]
    code = int(status.get("ContainerStatus", {}).get("ExitCode", 1))
    if code != 0:
        return code
    summary = folder.summary(run_dir) if run_dir is not None else None
    if status["State"] == "complete":
        ours = summary is not None and summary.get(launch_end.SUMMARY_KEY) == _launch_of(service)
        return exit_code_of(summary) if ours else 0
    if run_dir is None:
        return EXIT_FAILED
    logger.warning("the controller's task %s with no exit code of its own (%s): the run %s",
                   status["State"], status.get("Err") or "no reason",
                   f"ended {summary.get('stop_reason')}, as its summary says"
                   if summary else "has no summary")  # fmt: skip
    return exit_code_of(summary)


RESTART_DUE_S = 15.0
"""How long after a controller task failed Swarm may still be to start it again: its restart
delay (1 s) and the manager's round, with room to spare."""


def _restart_due(service: Service, tasks: list[dict], last: dict) -> bool:
    """Whether Swarm is to start the controller's failed ``last`` task again: its service still
    wants it (``troupe stop`` scales it to zero), restarts are left, and it ended moments ago.
    ``deploy --wait`` and ``troupe stop`` took the first failure for the run's end before."""
    if last["Status"]["State"] == "complete":  # on-failure: an exit 0 is never restarted
        return False
    if _replicas(service) == 0 or len(tasks) > CONTROLLER_RETRIES:
        return False
    try:
        ended = datetime.fromisoformat(str(last["Status"]["Timestamp"]))
    except (KeyError, ValueError):
        return False
    return (datetime.now(timezone.utc) - ended).total_seconds() < RESTART_DUE_S


def _replicas(service: Service) -> int:
    """How many tasks the service wants (0 once ``troupe stop`` scaled it to zero)."""
    mode = (getattr(service, "attrs", None) or {}).get("Spec", {}).get("Mode", {})
    return int(mode.get("Replicated", {}).get("Replicas", 1))


def _launch_of(service: Service) -> str | None:
    """The launch id the service's tasks are given (:mod:`system.run.launch_end`)."""
    spec = (getattr(service, "attrs", None) or {}).get("Spec", {})
    env = spec.get("TaskTemplate", {}).get("ContainerSpec", {}).get("Env") or []
    prefix = f"{launch_end.LAUNCH_ID_ENV}="
    return next((e.removeprefix(prefix) for e in env if e.startswith(prefix)), None)
