"""Shared fixtures of the docker tests: they skip, with the reason, when no engine or image."""

from __future__ import annotations

import os

import pytest

from distributed.images import build as images

IMAGE = os.environ.get("TROUPE_TEST_IMAGE", images.DEFAULT_TAG)


@pytest.fixture(scope="module")
def docker_client():
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
