"""How much CPU and memory each kind of worker asks a cluster for, from measured figures.

A scheduler reserves what a job asks for, so over-asking costs as much as a real need: the first
generators asked every role for 1-2 CPUs and 1-4 GiB where a worker used a sixth of that. Here
the ask is the measured peak resident memory of each role (``peak_rss_mb``, which every worker
reports in its heartbeat and the controller keeps in the run folder's ``workers.json``) with a
margin, and the CPU a worker can use: actors, policy workers, trainers and replay workers are one
busy process each (one core); the controller and the parameter service mostly wait on sockets.

The components are the runtime's worker roles (every plan class of
:data:`system.run.plan.PLAN_TYPES`, Troupe's own and any defined outside it), plus the controller
and the evaluation actors, which are actors sized on their own. A role with no figure of its own
here asks what a policy worker does when it runs a network (``needs_torch``), else what an actor
does (:func:`needs_of`), until ``--measured``, ``--cpus`` or ``--memory`` say better.

:data:`MEASURED` holds the figures of a cartpole-ppo run from the worker image;
:func:`measured_from` reads a finished run (``workers.json``) or a ``troupe bench --json`` result
instead, so a big model's trainer asks for what it used. Every figure can be overridden.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from distributed.errors import DeployError
from system import run_folder
from system.roles import Role

if TYPE_CHECKING:
    from system.run.plan import WorkerPlan

CONTROLLER, EVAL = "controller", "eval"
ROLE_COMPONENTS: dict[str, str] = {
    role.value: "params" if role is Role.PARAMETER_SERVICE else role.value for role in Role
}
"""Each worker role's component: its own name, but the parameter service's short one (it names
cluster objects and groups: ``<run>-params``)."""
COMPONENTS = (CONTROLLER, *ROLE_COMPONENTS.values(), EVAL)
"""Troupe's own components; :func:`components` adds the roles defined outside Troupe."""
MEMORY_MARGIN = 1.25
"""Memory asked for = measured peak x this, rounded up to 16 MiB (the peak moves a little with
batch sizes and allocator timing)."""


@dataclass(frozen=True)
class RoleNeeds:
    """What one worker of a component needs."""

    cpus: float
    """CPU cores it keeps busy (Kubernetes request; Slurm asks for at least one whole CPU)."""
    cpu_limit: float
    """Cores it may use at most (Kubernetes limit): torch's threads in trainers and policy
    workers can use a second core; a single-threaded actor cannot."""
    peak_memory_mib: float
    """Measured peak resident memory of one worker (MiB)."""

    @property
    def memory_mib(self) -> int:
        """What to ask for: the peak plus :data:`MEMORY_MARGIN`, in whole 16 MiB."""
        return 16 * math.ceil(self.peak_memory_mib * MEMORY_MARGIN / 16)

    @property
    def slurm_cpus(self) -> int:
        """Slurm allocates whole CPUs."""
        return max(1, math.ceil(self.cpus))


# Peak RSS of each worker of a cartpole-ppo run from the worker image, one process per worker as
# on a cluster (workers.json of tests/docker/test_k8s_pods.py's run): actors and the parameter
# service never import torch there. The controller's is `troupe bench memory`'s (BENCHMARKS.md).
# The replay worker's is an estimate, not measured in the image: it imports what an actor does
# (no torch) and holds its buffer, about 10 MiB for 100k frames of small vector observations
# (cartpole, pendulum: a local pendulum-sac run's replay worker, 50k frames, peaked 7 MiB above
# its parameter service). A buffer of images needs capacity_frames x the bytes of one
# observation more: pass --memory replay=MIB (or --measured with a run's workers.json).
MEASURED: dict[str, RoleNeeds] = {
    "controller": RoleNeeds(0.25, 1, 208),
    "params": RoleNeeds(0.25, 1, 52),
    "trainer": RoleNeeds(1, 2, 323),
    "policy": RoleNeeds(1, 2, 241),
    "actor": RoleNeeds(1, 1, 53),
    "replay": RoleNeeds(1, 1, 64),
    "eval": RoleNeeds(0.25, 1, 53),
}


def components() -> tuple[str, ...]:
    """Every component: Troupe's own and the roles defined by the modules imported so far."""
    from system.run.plan import PLAN_TYPES

    return (*COMPONENTS, *(role for role in PLAN_TYPES if role not in ROLE_COMPONENTS))


def needs_of(needs: Mapping[str, RoleNeeds], component: str) -> RoleNeeds:
    """What one worker of ``component`` asks for: its figures in ``needs``, else (a role defined
    outside Troupe, never measured here) a policy worker's if its plan runs a network, else an
    actor's."""
    if component in needs:
        return needs[component]
    plan = component_plan(component)
    if plan is None:
        raise DeployError(f"no figures for '{component}': it is none of {', '.join(components())}")
    return needs["policy" if plan.needs_torch else "actor"]


def component_plan(component: str) -> type[WorkerPlan] | None:
    """The plan class of ``component``'s workers (None: the controller; ``eval``: actors')."""
    from system.run.plan import PLAN_TYPES

    role = next((r for r, c in ROLE_COMPONENTS.items() if c == component), component)
    return PLAN_TYPES.get(Role.ACTOR.value if component == EVAL else role)


def component_of(worker_id: str, role: str) -> str:
    """``actor/3`` -> actor, ``eval/0`` -> eval, ``params`` -> params, ``trainer/red/0``..."""
    head = worker_id.split("/", 1)[0]
    if head in components():
        return head
    return ROLE_COMPONENTS.get(role, role)


def measured_from(path: Path) -> dict[str, float]:
    """Peak memory (MiB) per component from a run folder (its ``workers.json``), a
    ``workers.json`` itself, or a ``troupe bench --json`` result (its memory suite)."""
    file = path / run_folder.WORKERS if path.is_dir() else path
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise DeployError(
            f"--measured {path}: cannot read it ({e}); pass a finished run folder (it has "
            "workers.json) or the JSON that troupe bench memory --json wrote"
        ) from e
    if "suites" in data:  # a bench result: suites.memory.<experiment>.peak_rss_mb_by_role
        peaks: dict[str, float] = {}
        for figures in data["suites"].get("memory", {}).values():
            for role, mb in (figures or {}).get("peak_rss_mb_by_role", {}).items():
                if mb is None:  # a role the bench could not measure
                    continue
                component = component_of(role, role)
                peaks[component] = max(peaks.get(component, 0.0), float(mb))
        if "actor" in peaks:
            peaks.setdefault("eval", peaks["actor"])
    else:
        peaks = {}
        for worker_id, worker in data.items():
            component = component_of(worker_id, str(worker.get("role")))
            peaks[component] = max(peaks.get(component, 0.0), float(worker.get("peak_rss_mb") or 0))
    peaks = {c: mb for c, mb in peaks.items() if c in components() and mb > 0}
    if not peaks:
        raise DeployError(f"--measured {path}: holds no peak_rss_mb figure of any worker")
    return peaks


def role_needs(
    measured: Mapping[str, float] | None = None,
    cpus: Mapping[str, float] | None = None,
    memory_mib: Mapping[str, float] | None = None,
) -> dict[str, RoleNeeds]:
    """:data:`MEASURED`, updated by figures from a run (``measured``, MiB per component), then
    by explicit ``cpus`` and ``memory_mib`` (a peak in MiB; the margin is still added)."""
    needs = dict(MEASURED)
    for source, field in ((measured, "peak_memory_mib"), (memory_mib, "peak_memory_mib")):
        for component, value in (source or {}).items():
            needs[component] = replace(needs_of(needs, component), **{field: float(value)})
    for component, value in (cpus or {}).items():
        old = needs_of(needs, component)
        needs[component] = replace(old, cpus=float(value), cpu_limit=max(old.cpu_limit, value))
    return needs


def parse_overrides(items: Sequence[str], flag: str) -> dict[str, float]:
    """``["actor=2", "trainer=8"]`` -> ``{"actor": 2.0, "trainer": 8.0}``, every error at once."""
    result, errors = {}, []
    for item in items:
        component, sep, value = item.partition("=")
        if not sep or component not in components() or not re.fullmatch(r"\d+(\.\d+)?", value):
            errors.append(
                f"{flag} '{item}': write COMPONENT=NUMBER with COMPONENT one of "
                f"{', '.join(components())}"
            )
        elif float(value) <= 0:
            errors.append(f"{flag} '{item}': must be more than 0")
        else:
            result[component] = float(value)
    if errors:
        raise DeployError("\n".join(errors))
    return result


def add_sizing_arguments(parser: argparse.ArgumentParser) -> None:
    """What each role asks for: measured figures, overridable (``--measured/--cpus/--memory``
    of every ``troupe deploy``)."""
    parser.add_argument(
        "--measured",
        type=Path,
        default=None,
        metavar="PATH",
        help="size memory from a finished run folder (its workers.json) or a troupe bench "
        "--json result, instead of the built-in cartpole figures",
    )
    parser.add_argument(
        "--cpus",
        action="append",
        default=[],
        metavar="COMPONENT=N",
        help=f"CPUs one worker of COMPONENT ({', '.join(COMPONENTS)}) uses, e.g. trainer=8; "
        "repeatable",
    )
    parser.add_argument(
        "--memory",
        action="append",
        default=[],
        metavar="COMPONENT=MIB",
        help="peak memory (MiB) of one worker of COMPONENT, e.g. trainer=6000 (a margin is "
        "added); repeatable",
    )


def needs_from(args: argparse.Namespace) -> dict[str, RoleNeeds]:
    """The needs ``add_sizing_arguments``'s options ask for."""
    return role_needs(
        measured=measured_from(args.measured) if args.measured else None,
        cpus=parse_overrides(args.cpus, "--cpus"),
        memory_mib=parse_overrides(args.memory, "--memory"),
    )
