"""A stand-in for the Docker SDK: a Swarm manager whose state is a JSON file.

``troupe status``, ``logs`` and ``stop`` talk only to a Swarm manager; this machine has none
(and the tests may not make one of a shared engine). Put this folder first on ``PYTHONPATH`` and
set ``FAKE_SWARM_STATE`` to a JSON file of ``services`` (each: ``name``, ``labels``, ``replicas``,
``tasks``, ``logs``), ``secrets`` and ``networks`` (each: ``name``, ``labels``): the commands then
run their whole path, arguments to output, against it. What they change (a service scaled or
removed, a secret or network removed) is written back, and appended to the state's ``calls``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__version__ = "0-fake"


class errors:  # the SDK's module of exceptions; a namespace serves as well
    class DockerException(Exception):
        pass

    class APIError(DockerException):
        explanation = None

    class NotFound(APIError):
        pass


def from_env() -> DockerClient:
    return DockerClient(Path(os.environ["FAKE_SWARM_STATE"]))


class DockerClient:
    def __init__(self, path: Path):
        self.path = path
        self.services = _Services(self)
        self.secrets = _Objects(self, "secrets")
        self.networks = _Objects(self, "networks")

    def ping(self) -> bool:
        return True

    def state(self) -> dict:
        return json.loads(self.path.read_text())

    def change(self, call: str, edit) -> None:
        state = self.state()
        edit(state)
        state.setdefault("calls", []).append(call)
        self.path.write_text(json.dumps(state))


def _matches(item: dict, filters: dict | None) -> bool:
    label = (filters or {}).get("label")
    if label is None:
        return True
    key, _, value = label.partition("=")
    return item.get("labels", {}).get(key) == value


class _Services:
    def __init__(self, client: DockerClient):
        self.client = client

    def list(self, filters: dict | None = None) -> list[Service]:
        items = self.client.state()["services"]
        return [Service(self.client, s) for s in items if _matches(s, filters)]

    def get(self, name: str) -> Service:
        for s in self.client.state()["services"]:
            if s["name"] == name:
                return Service(self.client, s)
        raise errors.NotFound(f"service {name} not found")


class Service:
    def __init__(self, client: DockerClient, spec: dict):
        self.client, self.name = client, spec["name"]
        mode = {"Replicated": {"Replicas": spec.get("replicas", 1)}}
        self.attrs = {"Spec": {"Name": self.name, "Labels": spec["labels"], "Mode": mode}}

    def _spec(self) -> dict:
        return next(s for s in self.client.state()["services"] if s["name"] == self.name)

    def tasks(self) -> list[dict]:
        return self._spec()["tasks"]

    def logs(self, stdout=True, stderr=True, details=False, tail="all"):
        spec = self._spec()
        task = spec["tasks"][0]["ID"]
        lines = spec.get("logs", [])[-tail:] if tail != "all" else spec.get("logs", [])
        prefix = f"com.docker.swarm.task.id={task} " if details else ""
        return iter([(prefix + line + "\n").encode() for line in lines])

    def scale(self, replicas: int) -> None:
        def edit(state):
            for s in state["services"]:
                if s["name"] == self.name:
                    s["replicas"] = replicas
                    for task in s["tasks"][replicas:]:  # Swarm stops the tasks beyond
                        task["Status"] = {"State": "shutdown"}

        self.client.change(f"scale {self.name} {replicas}", edit)

    def remove(self) -> None:
        def edit(state):
            state["services"] = [s for s in state["services"] if s["name"] != self.name]

        self.client.change(f"remove service {self.name}", edit)


class _Objects:
    """Secrets or networks."""

    def __init__(self, client: DockerClient, kind: str):
        self.client, self.kind = client, kind

    def list(self, filters: dict | None = None) -> list[_Object]:
        items = self.client.state()[self.kind]
        return [_Object(self.client, self.kind, o["name"]) for o in items if _matches(o, filters)]


class _Object:
    def __init__(self, client: DockerClient, kind: str, name: str):
        self.client, self.kind, self.name = client, kind, name

    def remove(self) -> None:
        def edit(state):
            state[self.kind] = [o for o in state[self.kind] if o["name"] != self.name]

        self.client.change(f"remove {self.kind[:-1]} {self.name}", edit)
