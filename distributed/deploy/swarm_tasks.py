"""How a Swarm run's worker tasks ended, read from Swarm's task records.

Inside the swarm the controller sees only that a worker went silent: a task killed for memory,
one that crashed, and one Swarm could not place (an image missing on a node, no node with the
resources asked) all looked alike there, and the reason stayed in ``docker service ps``. Swarm
keeps each task's state, exit code and error in the manager, for every node alike, so
``troupe deploy swarm --wait`` reports each failed task as it sees it, and ``troupe ps`` says
how a service's last failed task ended.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from distributed.launch.docker_output import CONTROLLER_ID, container_exit
from distributed.launch.signals import EXIT_ABANDONED, EXIT_FAILED, EXIT_INTERRUPTED

if TYPE_CHECKING:
    import docker
    from docker.models.services import Service

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
