"""Shared fixtures of the docker tests: they skip, with the reason, when no engine or image."""

from __future__ import annotations

import os
import warnings

import pytest

from distributed.deploy import swarm
from distributed.images import build as images
from distributed.launch.docker_engine import remove_run_objects
from distributed.launch.docker_run import LABEL_RUN

IMAGE = os.environ.get("TROUPE_TEST_IMAGE", images.DEFAULT_TAG)


@pytest.fixture(scope="module")
def docker_client(no_runs_of_earlier_sessions):
    """A client of a running engine that has the worker image (built by .ci/docker-setup)."""
    import docker

    try:
        client = images.connect()
    except images.DockerUnavailableError as e:
        pytest.skip(str(e))
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"no image {IMAGE}: build it with .ci/docker-setup")
    return client


@pytest.fixture(scope="session")
def no_runs_of_earlier_sessions(left_by_earlier_sessions):
    """Remove the runs an earlier, killed pytest session left on the engine (containers, and
    services when it is a Swarm manager).

    A test's run is named after its folder (``docker-crash``): left containers make the same
    test of the next session fail with "containers of a run named ... still exist", and their
    workers go on using CPU. Only runs with a folder under an earlier session's temporary
    folder are removed (``left_by_earlier_sessions``).
    """
    try:
        client = images.connect()
    except images.DockerUnavailableError:
        return
    if (client.info().get("Swarm") or {}).get("ControlAvailable"):  # first: Swarm restarts tasks
        _remove_services_of_earlier_sessions(client, left_by_earlier_sessions)
    left = set()
    for container in client.containers.list(all=True, filters={"label": LABEL_RUN}):
        sources = [m.get("Source") or "" for m in container.attrs.get("Mounts", [])]
        if any(left_by_earlier_sessions(s) for s in sources if s):
            left.add(container.labels[LABEL_RUN])
    for run in sorted(left):
        warnings.warn(
            f"removing the containers of run {run!r}, left by an earlier test session", stacklevel=2
        )
        remove_run_objects(client, run)


def _remove_services_of_earlier_sessions(client, left_by_earlier_sessions) -> None:
    """The same for a Swarm run (services, network, secret): the engine stays a manager when
    the session that made it one was killed, and its services would go on running."""
    left = set()
    for service in client.services.list(filters={"label": LABEL_RUN}):
        labels = service.attrs["Spec"].get("Labels") or {}
        if left_by_earlier_sessions(labels.get(swarm.LABEL_RUN_DIR) or "/"):
            left.add(labels[LABEL_RUN])
    for run in sorted(left):
        warnings.warn(
            f"removing the services of Swarm run {run!r}, left by an earlier test session",
            stacklevel=2,
        )
        swarm.remove_run(client, run)
