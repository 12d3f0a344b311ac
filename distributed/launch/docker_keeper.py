"""A ``--launcher docker`` run's worker containers that Docker will not restart, started again.

Docker's restart policy (``on-failure``) brings back a worker whose process died by itself, but
never one a user stopped or killed (``docker stop``, ``docker kill``), whatever its policy, nor
one a user removed (``docker rm -f``). Such a worker was waited for until the restart grace ran
out, and the run failed; or, near its end, the run ended with exit 0 and the worker missing. On
a cluster the scheduler brings a task back however it ended (Swarm starts a new task,
Kubernetes a new pod): here the launching process is the run's scheduler, and does the same: it
starts the container again, or makes a removed one again from the run's plan.

It starts again only a container Docker would have restarted, had it not been stopped by
hand: one with a restart policy (a restartable role), that ended with a non-zero code (a
worker leaves with 0 only on its controller's stop), that Docker is not restarting itself, and
that Docker did not give up on as a crash loop. The controller inside counts the restart when
the worker says hello again, and gives up on a worker that keeps failing, as with any restart.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from distributed.launch.docker_output import CONTROLLER_ID
from system.run.worker_record import MAX_RESTARTS, PROGRESS_S

if TYPE_CHECKING:
    import docker

    from distributed.launch.docker_output import LogPrinter

logger = logging.getLogger(__name__)


GAVE_UP = (
    f"Docker restarts it no more: {MAX_RESTARTS} restarts, the last one running less than "
    f"{PROGRESS_S:.0f} s (a crash loop; see its lines above)"
)


def docker_gave_up(attrs: dict[str, Any]) -> bool:
    """Whether Docker spent its restarts on a crash loop: it is not restarting the container,
    whose restarts are as many as its policy allows, and whose last process ran less than
    :data:`PROGRESS_S` (a worker failing once an hour is not in one). At its last restart the
    count is already the most its policy allows."""
    state = attrs.get("State") or {}
    if state.get("Running") or state.get("Restarting"):
        return False
    policy = (attrs.get("HostConfig") or {}).get("RestartPolicy") or {}
    allowed = int(policy.get("MaximumRetryCount") or MAX_RESTARTS)
    ran = _seconds_between(state.get("StartedAt"), state.get("FinishedAt"))
    return int(attrs.get("RestartCount") or 0) >= allowed and (ran is None or ran < PROGRESS_S)


def to_start_again(attrs: dict[str, Any]) -> bool:
    """Whether a container that just ended (its inspection, ``attrs``) is to be started again:
    Docker would have restarted it, had a user not stopped it by hand."""
    state = attrs.get("State") or {}
    policy = ((attrs.get("HostConfig") or {}).get("RestartPolicy") or {}).get("Name")
    if policy in (None, "", "no") or state.get("Running") or state.get("Restarting"):
        return False  # not restartable, or Docker restarts it itself
    if state.get("Status", "exited") != "exited":
        return False  # being removed (docker rm -f): made again once it is gone
    return int(state.get("ExitCode") or 0) != 0 and not docker_gave_up(attrs)


def _seconds_between(start: str | None, end: str | None) -> float | None:
    """Seconds between two of Docker's timestamps (RFC 3339, nanoseconds); None if unreadable."""
    try:
        times = [datetime.fromisoformat(t[:26].rstrip("Z") + "+00:00") for t in (start, end)]
    except (TypeError, ValueError):
        return None
    return (times[1] - times[0]).total_seconds()


class Keeper:
    """Starts again the worker containers Docker will not (see the module's docstring), and
    makes again one removed by hand (``docker rm -f``), until the run stops: the controller's
    container ended, or the run is being stopped in order, or is over (:meth:`stop`)."""

    def __init__(
        self,
        client: docker.DockerClient,
        printer: LogPrinter,
        recreate: Callable[[str], object | None] | None = None,
    ):
        """``recreate(worker)``: make and start the container of a restartable worker as at the
        run's start (None for a worker that is not restarted)."""
        self.client, self.printer, self.recreate = client, printer, recreate
        self.stopping = threading.Event()
        """Set once nothing is to be started again: the run's end, or its ordered stop."""
        self._lock = threading.Lock()  # what the keeper does, against the run's clean-up

    def stop(self) -> None:
        """Start or make nothing more, once what it is doing is done: the run's clean-up, which
        removes every container it finds, must not miss one made meanwhile."""
        with self._lock:
            self.stopping.set()

    def on_event(self, action: str, worker: str, container_id: str) -> None:
        """A worker's container ended (``die``) or was removed (``destroy``)."""
        if worker == CONTROLLER_ID:  # the run is over: its workers leave or are removed
            self.stopping.set()
        with self._lock:
            if self.stopping.is_set():
                return
            if action == "die":
                self._on_die(worker, container_id)
            elif action == "destroy":
                self._on_destroy(worker)

    def _on_destroy(self, worker: str) -> None:
        import docker

        if self.recreate is None:
            return
        self.printer.always(
            worker,
            "its container was removed (docker rm): creating it again, as a cluster's "
            "scheduler would",
        )
        try:
            self.recreate(worker)
        except docker.errors.APIError as e:
            self.printer.always(worker, f"its container could not be made again: {e}")

    def _on_die(self, worker: str, container_id: str) -> None:
        import docker

        try:
            container = self.client.containers.get(container_id)
            if docker_gave_up(container.attrs):
                self.printer.always(worker, GAVE_UP)
            if not to_start_again(container.attrs):
                return
            self.printer.always(
                worker,
                "Docker does not restart a container stopped by hand (docker stop or kill): "
                "starting it again, as a cluster's scheduler would",
            )
            container.start()
        except docker.errors.APIError as e:  # being removed: its destroy event follows
            logger.debug("%s not started again: %s", worker, e)
