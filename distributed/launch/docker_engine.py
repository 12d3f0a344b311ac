"""A ``--launcher docker`` run's Docker engine, which may go away for a while, and the removal
of a run's containers and network, which must outlast that.

An engine restarts (a package upgrade, ``systemctl restart docker``), or its socket stops
answering for a moment. The launching process ended in a traceback at its first call to it:
the run's containers and network were left behind, so Docker's restart policy started the
workers again once the engine was back, with no controller to answer them, and the run's
resume was refused until they were removed by hand. Now the launching process waits for the
engine (:data:`ENGINE_BACK_S`) and goes on where it was: the controller's exit code, the
removal of what the run made; one that never comes back is said, with how to remove the rest.
The threads that follow the containers' output and Docker's events wait for it too
(:mod:`.docker_output`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from distributed.errors import DockerRunError
from distributed.launch.docker_output import LABEL_RUN, engine_gone

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container

logger = logging.getLogger(__name__)
T = TypeVar("T")

ENGINE_BACK_S = 60.0
"""How long the launching process waits for an engine that stopped answering. A restart takes
seconds once the containers are stopped; without live-restore the engine's shutdown waits for
each container's stop first (``StopTimeout``, 120 s), during which the engine still answers."""


class Engine:
    """The run's Docker engine: waits for it once it stops answering, and remembers giving up,
    so that the run's clean-up does not wait again for an engine already waited for."""

    def __init__(self, client: docker.DockerClient, run: str, wait_s: float | None = None):
        self.client, self.run = client, run
        """``run``: the run as ``troupe status`` and ``troupe stop`` take it (a run folder, or a
        Swarm run's name), for what the user is told."""
        self.wait_s = ENGINE_BACK_S if wait_s is None else wait_s
        self.given_up = False

    def back(self, what: str, ctrl_c_gives_up: bool = False) -> bool:
        """Whether the engine answers again within :attr:`wait_s`. ``what``: what the wait is
        for, as the user is told. A Ctrl+C meanwhile is raised as it came, for the run's stop
        in order, which waits for the engine in turn (the first one gave up, and left the
        controller running with nothing to stop it); in the run's clean-up
        (``ctrl_c_gives_up``) it gives up."""
        if self.given_up:
            return False
        logger.warning("the Docker engine does not answer (restarting? stopped?): waiting up to "
                       "%.0fs for it, %s", self.wait_s, what)  # fmt: skip
        try:
            self.given_up = not answers_within(self.client, self.wait_s)
        except KeyboardInterrupt:
            if not ctrl_c_gives_up:
                raise
            self.given_up = True
        if not self.given_up:
            logger.warning("the Docker engine answers again")
        return not self.given_up

    def exit_code(self, controller: Container, timeout_s: float | None = None) -> int:
        """The controller container's exit code, once it has ended; across the engine's
        absences, in which the wait for it broke. A container that lived through one (the
        engine's live-restore) is waited for again. Raises DockerRunError when the engine did
        not come back, TimeoutError when ``timeout_s`` (absences included) passed first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s

        def wait() -> dict:
            if deadline is None:
                return controller.wait()
            try:
                return controller.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except Exception as e:
                if time.monotonic() < deadline:
                    raise
                # docker-py reports its read timeout as a ConnectionError: not an absence
                raise TimeoutError(f"the controller did not end in {timeout_s:.0f}s") from e

        return int(self.across(wait, "for the run's controller")["StatusCode"])

    def across(self, call: Callable[[], T], what: str) -> T:
        """``call()``, made again once the engine answers again if it did not answer: the
        launching process ended in a traceback at whichever call met the engine's restart
        (a wait, a Ctrl+C's signal, a status read). An engine that answers but is not ready
        (503: a swarm manager just started, "This node is not a swarm manager") is asked again
        each second. Raises DockerRunError when the engine was not back, or not ready, in
        :attr:`wait_s`; any other error as ``call`` raised it. ``what``: what the call is for,
        as the user is told while it waits."""
        unready_since: float | None = None
        while True:
            try:
                return call()
            except Exception as e:
                if engine_gone(e):
                    if not self.back(what):
                        raise self._not_back(e) from e
                elif not_ready(e):
                    now = time.monotonic()
                    if unready_since is None:
                        unready_since = now
                        logger.warning("the Docker engine answers but is not ready (%s): "
                                       "waiting up to %.0fs for it, %s",
                                       getattr(e, "explanation", e), self.wait_s, what)  # fmt: skip
                    elif now - unready_since >= self.wait_s:
                        raise self._not_back(e) from e
                    time.sleep(1.0)
                else:
                    raise

    def _not_back(self, error: BaseException) -> DockerRunError:
        how = (f"was not ready for {self.wait_s:.0f}s ({getattr(error, 'explanation', error)})"
               if not_ready(error) else f"stopped answering and was not back in "
               f"{self.wait_s:.0f}s")  # fmt: skip
        return DockerRunError(
            f"the Docker engine {how}: what became of the run's controller is not known here; "
            f"`troupe status {self.run}` says how far it got"
        )

    def remove_run_objects(self, run: str) -> None:
        """:func:`remove_run_objects`, once the engine answers again if it does not now; if it
        never does, say what is left and how to remove it."""
        try:
            remove_run_objects(self.client, run)
            return
        except Exception as e:
            if not engine_gone(e):
                raise
        if self.back("to remove the run's containers and network", ctrl_c_gives_up=True):
            remove_run_objects(self.client, run)
            return
        left = "the run's containers and network are left where the Docker engine was"
        logger.warning("%s: once it answers, `troupe stop %s` removes them", left, self.run)


def not_ready(error: BaseException) -> bool:
    """Whether ``error`` is the engine's answer that it cannot serve the request yet (503
    Service Unavailable: a swarm manager just after its engine's start)."""
    import docker

    return isinstance(error, docker.errors.APIError) and error.status_code == 503


def answers_within(client: docker.DockerClient, wait_s: float, every_s: float = 1.0) -> bool:
    """Whether the engine answers a ping within ``wait_s`` (one that is starting up refuses
    requests with an API error before it takes them)."""
    import docker

    deadline = time.monotonic() + wait_s
    while True:
        try:
            client.ping()
            return True
        except docker.errors.APIError:
            pass
        except Exception as e:
            if not engine_gone(e):
                raise
        if time.monotonic() >= deadline:
            return False
        time.sleep(every_s)


def remove_run_objects(client: docker.DockerClient, run: str) -> None:
    """Remove every container and network labelled with ``run`` (best effort, logged; an
    engine that does not answer raises its connection error)."""
    import docker

    for container in client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run}"}):
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            logger.warning("could not remove container %s: %s", container.name, e)
    for network in client.networks.list(filters={"label": f"{LABEL_RUN}={run}"}):
        try:
            network.remove()
        except docker.errors.APIError as e:
            logger.warning("could not remove network %s: %s", network.name, e)
