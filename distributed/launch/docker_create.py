"""One role's container made and started as ``client.containers.run(..., detach=True)`` would,
plus Docker's stop timeout, which docker-py's high-level ``run`` refuses.

Without it ``docker stop`` of a ``--launcher docker`` worker, or the Docker engine stopping
(a host's shutdown), gave the worker Docker's 10 s before SIGKILL, where the controller, Swarm
and Kubernetes give 120 s: a trainer's stop (its last versions and state sent to the parameter
service) could be cut short. The low-level API used here is docker-py's public one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container


HOST_SETTINGS = ("init", "restart_policy", "nano_cpus", "mem_reservation")
"""The settings of ``run`` that go into the host config; the rest are the container's own."""


def run_container(
    client: docker.DockerClient,
    image: str,
    command: list[str],
    *,
    network: str,
    volumes: dict[str, dict[str, str]],
    ports: dict[str, Any] | None,
    stop_timeout: int,
    **settings: Any,
) -> Container:
    """Create and start a container on ``network``. ``volumes``, ``ports`` and ``settings``
    (:data:`HOST_SETTINGS`; ``name``, ``hostname``, ``labels``, ``user``, ``environment``) as
    ``run`` takes them."""
    api = client.api
    host = {k: settings.pop(k) for k in HOST_SETTINGS if k in settings}
    host_config = api.create_host_config(
        binds=volumes, port_bindings=ports or None, network_mode=network, **host
    )
    created = api.create_container(
        image,
        command,
        volumes=[v["bind"] for v in volumes.values()],
        ports=[tuple(p.split("/", 1)) for p in sorted(ports or {})],
        host_config=host_config,
        networking_config=api.create_networking_config({network: api.create_endpoint_config()}),
        stop_timeout=stop_timeout,
        **settings,
    )
    container = client.containers.get(created["Id"])
    container.start()
    return container
