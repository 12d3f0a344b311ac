"""Errors of placing a run: images, Docker runs and cluster deployments.

Every one is a :class:`api.errors.UserError`: the message says what to change (start the Docker
engine, make the base image, fix a manifest option, ...).
"""

from __future__ import annotations

from api.errors import UserError


class DockerRunError(UserError):
    """A docker run cannot start: a leftover of an earlier run, a missing image, ..."""


class ImageError(UserError):
    """Making a wheelhouse, or building or pushing a worker image, failed."""


class WheelhouseError(ImageError):
    """``pip wheel`` failed, or the wheelhouse holds wheels the image cannot use."""


class DockerUnavailableError(ImageError):
    """No Docker engine answers."""


class BaseImageMissingError(ImageError):
    """The base image is not present locally and cannot be pulled."""


class ImageBuildError(ImageError):
    """A step of the Dockerfile failed."""


class ImagePushError(ImageError):
    """The registry refused the image or cannot be reached."""


class DeployError(UserError):
    """A deployment cannot be generated or applied as asked; the message says what to change."""


class SwarmError(DeployError):
    """The engine is not a swarm manager, a run is not found, or a run already exists."""


class KubernetesClientError(DeployError):
    """The ``kubernetes`` package or a cluster to talk to is missing."""


class ApplyError(DeployError):
    """The API refused an object (it exists already, no permission, invalid)."""


class OpsError(UserError):
    """``troupe status|logs|stop|ps`` cannot find a run or reach what runs it."""
