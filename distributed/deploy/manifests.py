"""What the cluster generators (``troupe deploy k8s|slurm``) share: the run's role groups, run
names, owner-only files and a small YAML writer.

A cluster scheduler starts every worker, so a generator must know them all in advance. It gets
them from :func:`system.run.plan.plan_workers`, the controller's own plan, grouped into one
scheduler object per group (``actor`` -> ``actor/0``, ``actor/1``, ...). Reading the controller's
plan rather than re-deriving it keeps the two from drifting apart: a worker id the controller
does not expect is never started, and every id it waits for is.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from api.config import ExperimentConfig
from api.resolve import load_experiment
from distributed.errors import DeployError

if TYPE_CHECKING:
    from distributed.deploy.sizing import RoleNeeds

logger = logging.getLogger(__name__)

ORDINAL = "{ordinal}"
LIMIT_FACTOR = 2.0
"""Kubernetes memory limit = request x this."""
CONTROLLER_RETRIES = 2
"""Times a cluster starts a run's controller again (a Kubernetes Job's backoffLimit, a Swarm
service's max_attempts), each resuming the run: one killed or lost with its node, not one that
ended its run (:mod:`system.run.launch_end`). A run that kills its controller every time ends."""


@dataclass(frozen=True)
class RoleGroup:
    """Workers of one role (and policy) that one scheduler object runs as replicas."""

    name: str
    """``params``, ``replay/<policy>``, ``trainer/<policy>``, ``policy/<policy>``, ``actor`` or
    ``eval``."""
    role: str
    """The ``--role`` of ``troupe worker`` (a :class:`system.roles.Role` value)."""
    id_template: str
    """The ``--id`` of ``troupe worker``: ``params`` or e.g. ``actor/{ordinal}``."""
    replicas: int
    policy: str | None = None
    """The policy a replay, trainer or policy worker group serves."""

    @property
    def component(self) -> str:
        """The kind of group, one of ``deploy.sizing.COMPONENTS`` but the controller."""
        return self.name.split("/", 1)[0]


def load_config(
    experiment: str, overrides: Sequence[str], imports: Sequence[str] = ()
) -> ExperimentConfig:
    """The experiment with ``key=value`` overrides applied and checked (every error at once),
    its policy workers scaled with its actors (:func:`scale_policy_workers`); ``imports``: the
    user's files or modules (``--import``), recorded for the workers as ``troupe run`` does."""
    config = load_experiment(experiment, list(overrides), list(imports))
    for line in scale_policy_workers(config, overrides):
        logger.warning("%s", line)
    return config


ACTORS_PER_POLICY_WORKER = 16
"""Actors one policy worker serves in a cluster deployment. One policy worker (one busy core)
served 14 Pong actors at 0.95 cores (BENCHMARKS.md, issue 23); a 64-actor Slurm run with one
had its policy lag reach 176 versions."""


def scale_policy_workers(config: ExperimentConfig, overrides: Sequence[str] = ()) -> list[str]:
    """Give each policy one policy worker per :data:`ACTORS_PER_POLICY_WORKER` actors, unless
    ``policies.<name>.policy_workers`` was set on the command line; returns what was changed.
    Local runs are sized by their machine's cores instead (``actors.workers=auto``)."""
    actors = config.actors.workers
    needed = max(1, math.ceil(actors / ACTORS_PER_POLICY_WORKER))
    said = []
    for name, policy in config.policies.items():
        key = f"policies.{name}.policy_workers"
        if any(o.partition("=")[0].strip() == key for o in overrides):
            continue
        if policy.policy_workers < needed:
            said.append(
                f"{key}: {policy.policy_workers} -> {needed} for {actors} actors (one per "
                f"{ACTORS_PER_POLICY_WORKER}; set {key}=N to choose)"
            )
            policy.policy_workers = needed
    return said


def role_groups(config: ExperimentConfig) -> list[RoleGroup]:
    """The controller's worker plan as groups of replicas with 0-based, contiguous ordinals."""
    from system.run.plan import plan_workers

    groups: dict[str, list[str]] = {}
    roles: dict[str, str] = {}
    policies: dict[str, str | None] = {}
    for plan in plan_workers(config):
        head, _, index = plan.worker_id.rpartition("/")
        name = head if index.isdigit() else plan.worker_id
        groups.setdefault(name, []).append(plan.worker_id)
        roles[name] = str(plan.role)
        policies[name] = getattr(plan, "policy", None) or None
    result = []
    for name, ids in groups.items():
        if len(ids) == 1 and ids[0] == name:
            result.append(RoleGroup(name, roles[name], name, 1, policies[name]))
            continue
        expected = [f"{name}/{i}" for i in range(len(ids))]
        if ids != expected:  # a scheduler can only number replicas 0..n-1
            raise DeployError(f"workers {ids} of group '{name}' are not numbered 0..n-1")
        result.append(RoleGroup(name, roles[name], f"{name}/{ORDINAL}", len(ids), policies[name]))
    return result


def config_json(config: ExperimentConfig) -> str:
    """The run's ``config.json`` text, as ``troupe controller`` reads it."""
    return json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n"


_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def default_run_name(experiment: str) -> str:
    """``<experiment>-<MMDD-HHMMSS>``: unique per minute and a valid DNS label."""
    base = re.sub(r"[^a-z0-9]+", "-", experiment.lower()).strip("-") or "run"
    if not base[0].isalpha():
        base = f"run-{base}"
    return f"{base[:30].rstrip('-')}-{time.strftime('%m%d-%H%M%S')}"


def check_run_name(name: str, max_length: int) -> str:
    """Run names become object, host and folder names: a lower-case DNS label, short enough."""
    if not _DNS_LABEL.match(name) or len(name) > max_length:
        raise DeployError(
            f"run name '{name}' must be at most {max_length} characters of a-z, 0-9 and '-', "
            "start with a letter and end with a letter or digit; pass another --run-name"
        )
    return name


def write_private(path: Path, text: str) -> Path:
    """Write a file only its owner can read (CURVE keys, Secrets), even if it existed before."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # O_CREAT's mode does not apply to a file that already exists
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


# --------------------------------------------------------------------- YAML
# A writer for the subset manifests use (dicts, lists, strings, numbers, booleans, None), so
# generating needs no YAML package at run time. Strings are written JSON-quoted, which YAML reads
# back as the same string (no "yes"/"no"/"1.10" surprises); multi-line strings as literal blocks.
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")


def to_yaml(value: Any) -> str:
    """One YAML document for ``value`` (no leading ``---``)."""
    if isinstance(value, dict | list) and value:
        return "\n".join(_block(value, 0)) + "\n"
    return _inline(value) + "\n"


def to_yaml_documents(values: Sequence[Any]) -> str:
    """Several YAML documents separated by ``---``."""
    return "---\n".join(to_yaml(v) for v in values)


def _block(value: dict | list, indent: int) -> Iterator[str]:
    pad = " " * indent
    items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
    for key, item in items:
        head = f"{pad}{_key(key)}:" if key is not None else f"{pad}-"
        if isinstance(item, dict | list) and item:
            if key is None:  # a list item: its first line shares the "- "
                lines = list(_block(item, indent + 2))
                yield f"{head} {lines[0].lstrip()}"
                yield from lines[1:]
            else:
                yield head
                yield from _block(item, indent + 2 if isinstance(item, dict) else indent)
        elif isinstance(item, str) and _is_literal_block(item):
            yield f"{head} |" + ("" if item.endswith("\n") else "-")
            for line in item.removesuffix("\n").split("\n"):
                yield f"{pad}  {line}" if line else ""
        else:
            yield f"{head} {_inline(item)}"


def _key(key: Any) -> str:
    text = str(key)
    return text if _PLAIN_KEY.match(text) else json.dumps(text)


def _inline(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict | list) and not value:
        return "{}" if isinstance(value, dict) else "[]"
    raise TypeError(f"cannot write {type(value).__name__} as YAML")


def _is_literal_block(text: str) -> bool:
    """Multi-line text a ``|`` block keeps exactly (one trailing newline at most, no CRs, no
    leading blank or empty line, no trailing blanks that a block would lose)."""
    body = text.removesuffix("\n")
    return (
        "\n" in body
        and not body.endswith("\n")
        and "\r" not in text
        and not body.startswith((" ", "\t", "\n"))
        and all(line == line.rstrip(" \t") for line in body.split("\n"))
    )


# --------------------------------------------------------------------- resources
_SUFFIX = {
    "m": 1e-3,
    "": 1,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def quantity(text: str) -> float:
    """A Kubernetes quantity (``500m``, ``2``, ``4Gi``) as a number, or a DeployError."""
    match = _QUANTITY.match(text)
    if match is None:
        raise DeployError(f"'{text}' is not a quantity: write e.g. 500m or 2 (CPU), 512Mi or 4Gi")
    return float(match.group(1)) * _SUFFIX[match.group(2) or ""]


@dataclass(frozen=True)
class Resources:
    """CPU and memory a container asks for (request) and may use at most (limit)."""

    cpu: tuple[str, str]
    memory: tuple[str, str]

    def to_k8s(self, gpus: int = 0) -> dict[str, dict[str, str]]:
        limits = {"cpu": self.cpu[1], "memory": self.memory[1]}
        if gpus:  # extended resources are set as limits; the request follows the limit
            limits["nvidia.com/gpu"] = str(gpus)
        return {"requests": {"cpu": self.cpu[0], "memory": self.memory[0]}, "limits": limits}

    @classmethod
    def from_needs(cls, needs: RoleNeeds) -> Resources:
        """Request what was measured; limit CPU at what the process can use and memory at
        twice the request (a worker over it is OOM-killed and restarted)."""
        memory = needs.memory_mib
        return cls(
            (_cpu(needs.cpus), _cpu(needs.cpu_limit)),
            (f"{memory}Mi", f"{int(memory * LIMIT_FACTOR)}Mi"),
        )


def _cpu(cores: float) -> str:
    return str(int(cores)) if float(cores).is_integer() else f"{round(cores * 1000)}m"


HELPER_RESOURCES: dict[str, Resources] = {
    "init": Resources(("50m", "100m"), ("32Mi", "64Mi")),
    "fetch": Resources(("50m", "200m"), ("64Mi", "256Mi")),
}
"""Containers that are not workers: the config copy and the results pod."""


def parse_resource_overrides(
    items: Sequence[str], needs: Mapping[str, RoleNeeds] | None = None
) -> dict[str, Resources]:
    """``["actor=cpu:2/4,memory:2Gi"]`` -> actor asks 2 CPUs (at most 4) and 2Gi (at most 2Gi);
    what an item does not name keeps what ``needs`` (measured figures) gives."""
    from distributed.deploy.sizing import MEASURED, components, needs_of

    needs = needs or MEASURED
    defaults = {c: Resources.from_needs(needs_of(needs, c)) for c in components()}
    defaults.update(HELPER_RESOURCES)
    result: dict[str, Resources] = {}
    for item in items:
        component, sep, spec = item.partition("=")
        if not sep or component not in defaults:
            raise DeployError(
                f"--resources '{item}': write COMPONENT=cpu:REQ[/LIMIT],memory:REQ[/LIMIT] with "
                f"COMPONENT one of {', '.join(defaults)}"
            )
        values = {"cpu": None, "memory": None}
        for part in spec.split(","):
            kind, _, amount = part.partition(":")
            if kind not in values or not amount:
                raise DeployError(f"--resources '{item}': '{part}' must be cpu:... or memory:...")
            request, _, limit = amount.partition("/")
            if quantity(request) > quantity(limit or request):
                raise DeployError(f"--resources '{item}': request {request} exceeds limit {limit}")
            values[kind] = (request, limit or request)
        base = result.get(component, defaults[component])
        result[component] = Resources(values["cpu"] or base.cpu, values["memory"] or base.memory)
    return result
