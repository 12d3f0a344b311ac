"""Shared fixtures of the docker tests: they skip, with the reason, when no engine or image."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from distributed.images import build as images
from distributed.launch.docker_run import LABEL_RUN, remove_run_objects

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
def no_runs_of_earlier_sessions(tmp_path_factory):
    """Remove the containers of test runs an earlier, killed pytest session left on the engine.

    A test's run is named after its folder (``docker-crash``), so a session killed mid-run (CI
    stopped, a Ctrl+C twice) leaves containers that make the same test of the next session fail
    with "containers of a run named ... still exist", and workers that go on using CPU. Only
    runs whose folder lies under pytest's temporary root of this user and outside this session's
    are touched: a user's own runs on the same engine are left alone.
    """
    basetemp = tmp_path_factory.getbasetemp().resolve()
    root = next((p for p in basetemp.parents if p.name.startswith("pytest-of-")), None)
    if root is None:  # --basetemp: no earlier sessions to tell apart
        return
    try:
        client = images.connect()
    except images.DockerUnavailableError:
        return
    for run in sorted(_runs_under(client, root) - _runs_under(client, basetemp)):
        warnings.warn(
            f"removing the containers of run {run!r}, left by an earlier test session", stacklevel=2
        )
        remove_run_objects(client, run)


def _runs_under(client, folder: Path) -> set[str]:
    """Names of the runs with a container that mounts a folder under ``folder``."""
    runs = set()
    for container in client.containers.list(all=True, filters={"label": LABEL_RUN}):
        sources = [m.get("Source", "") for m in container.attrs.get("Mounts", [])]
        if any(Path(s).is_relative_to(folder) for s in sources if s):
            runs.add(container.labels[LABEL_RUN])
    return runs
