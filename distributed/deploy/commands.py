"""``troupe deploy swarm|k8s|slurm``: describe a run once, get the scheduler's own objects.

Each action is an ``add_*_arguments``/``run_*`` pair, as ``troupe`` subcommands are; this module
only dispatches. ``swarm`` lives in ``deploy/swarm.py`` and is imported when the parser is
built; while that module does not exist, ``troupe deploy swarm`` says so instead of failing to
parse.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from distributed.deploy.sizing import add_sizing_arguments, needs_from
from distributed.errors import DeployError
from distributed.images.build import DEFAULT_TAG
from distributed.images.pinning import image_reference
from distributed.launch.arguments import add_import_argument
from distributed.launch.run_commands import EXPERIMENT_HELP
from distributed.ops.record import DEFAULT_RUNS_DIR, LaunchRecord, point
from distributed.ops.record import write as write_record

SWARM_MODULE = "distributed.deploy.swarm"


def add_deploy_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="deploy_action", metavar="TARGET", required=True)
    _add_swarm(actions)
    for name, help_text, add, run in (
        ("k8s", "Kubernetes manifests for a run (and create them)", add_k8s_arguments, run_k8s),
        ("slurm", "an sbatch script for a run", add_slurm_arguments, run_slurm),
    ):
        p = actions.add_parser(name, help=help_text, description=help_text)
        add(p)
        p.set_defaults(deploy_run=run)


def run_deploy(args: argparse.Namespace, console: Console) -> int:
    return args.deploy_run(args, console)


class _SharedTargets:
    """Hands our ``TARGET`` subparsers to a module whose ``add_deploy_arguments`` makes them
    itself (``swarm.py`` does), so its ``swarm`` target lands beside ``k8s`` and ``slurm``."""

    def __init__(self, actions: argparse._SubParsersAction):
        self.actions = actions

    def add_subparsers(self, **kwargs) -> argparse._SubParsersAction:
        return self.actions


def _add_swarm(actions: argparse._SubParsersAction) -> None:
    """Add ``swarm`` from ``deploy/swarm.py``: its ``add_swarm_arguments``/``run_swarm`` pair,
    or its ``add_deploy_arguments``/``run_deploy`` pair; while the module does not exist, a
    stand-in that says so (only a missing module is forgiven: an import error inside it is a bug
    and keeps its traceback)."""
    help_text = "Docker Swarm services for a run"
    try:
        module = importlib.import_module(SWARM_MODULE)
    except ModuleNotFoundError as e:
        if e.name != SWARM_MODULE:
            raise
        p = actions.add_parser("swarm", help=help_text)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(deploy_run=_swarm_missing)
        return
    if hasattr(module, "add_swarm_arguments"):
        p = actions.add_parser("swarm", help=help_text, description=help_text)
        module.add_swarm_arguments(p)
        p.set_defaults(deploy_run=module.run_swarm)
        return
    module.add_deploy_arguments(_SharedTargets(actions))
    actions.choices["swarm"].set_defaults(deploy_run=module.run_deploy)


def _swarm_missing(args: argparse.Namespace, console: Console) -> int:
    raise DeployError(
        "troupe deploy swarm is not part of this installation (deploy/swarm.py is missing); "
        "use troupe deploy k8s or troupe deploy slurm"
    )


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", help=EXPERIMENT_HELP)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    add_import_argument(parser)
    parser.add_argument("--out", required=True, help="directory for the generated files")
    parser.add_argument("--run-name", default=None, help="names the run (default: exp-MMDD-time)")


# --------------------------------------------------------------------- troupe deploy k8s
def add_k8s_arguments(parser: argparse.ArgumentParser) -> None:
    _add_common(parser)
    add = parser.add_argument
    add(
        "--image",
        type=image_reference,
        default=DEFAULT_TAG,
        help="worker image (under --registry when given)",
    )
    add(
        "--registry",
        default=None,
        help="registry the nodes pull from, e.g. registry.example.com/rl",
    )
    add(
        "--image-pull-policy",
        default="IfNotPresent",
        choices=["Always", "IfNotPresent", "Never"],
        help="Never: the image is loaded on every node already (kind load, ctr import)",
    )
    add(
        "--image-pull-secret",
        action="append",
        default=[],
        metavar="SECRET",
        help="an existing dockerconfigjson Secret for a private registry; repeatable",
    )
    add("--gpu-image", default=None, help="image of GPU trainers (default: IMAGE-gpu)")
    add("--namespace", default="troupe")
    add("--no-namespace-object", action="store_true", help="the namespace exists: don't create it")
    add(
        "--storage",
        default="claim",
        choices=["claim", "pod", "none"],
        help="claim: the run folder on a ReadWriteMany claim; pod: a ReadWriteOnce claim per "
        "pod that writes (controller, parameter service, replay workers; trainers ship their "
        "state to the parameter service), kept for a resume; none: no volume (results and "
        "checkpoints go with the pods, the summary stays in the controller's log)",
    )
    add(
        "--storage-class",
        default=None,
        help="the claims' storage class (ReadWriteMany for claim, ReadWriteOnce for pod)",
    )
    add("--storage-size", default="10Gi", help="size of the claim (with pod: of each claim)")
    add("--existing-claim", default=None, help="a ReadWriteMany PVC for run folders, not a new one")
    add(
        "--keys-secret",
        default=None,
        metavar="SECRET",
        help="an existing Secret (key 'keys') with the run's CURVE keys, e.g. from a secret "
        "manager (default: RUN-keys, made by the command this prints, or by --apply)",
    )
    add(
        "--trainer-gpus",
        type=int,
        default=None,
        help="nvidia.com/gpu per trainer pod "
        "(default: 1 when the policy has device=cuda..., else 0)",
    )
    add_sizing_arguments(parser)
    add(
        "--resources",
        action="append",
        default=[],
        metavar="COMPONENT=SPEC",
        help="e.g. actor=cpu:2/4,memory:2Gi/4Gi (request/limit, over the measured figures); "
        "repeatable",
    )
    add(
        "--node-selector",
        action="append",
        default=[],
        metavar="[COMPONENT:]KEY=VALUE",
        help="node label the pods (or COMPONENT's only, e.g. trainer:gpu=a100) must land on",
    )
    add("--priority-class", default=None, help="PriorityClass of every pod")
    add(
        "--no-disruption-budget",
        dest="disruption_budget",
        action="store_false",
        help="leave out the PodDisruptionBudget that keeps drains off the controller, params and "
        "trainers (a drain then waits for the run to end)",
    )
    add(
        "--network-policy",
        action="store_true",
        help="a NetworkPolicy: the run's pods take traffic only from each other",
    )
    add(
        "--probe-stale-seconds",
        type=int,
        default=60,
        help="restart a worker whose heartbeat is older than this (liveness probe)",
    )
    add("--apply", action="store_true", help="also create the objects (kubeconfig context)")


def run_k8s(args: argparse.Namespace, console: Console, connect_api: Callable | None = None) -> int:
    """Write the manifests; with ``--apply`` create them through the Kubernetes API too."""
    import sys

    from distributed.deploy import k8s, k8s_apply
    from distributed.deploy.manifests import default_run_name, load_config, role_groups
    from distributed.deploy.manifests import parse_resource_overrides as resources
    from distributed.images.build import engine_if_any
    from distributed.images.code_check import check_image_imports
    from system.streams.security import RunKeys

    if args.trainer_gpus is not None and args.trainer_gpus < 0:
        raise DeployError(f"--trainer-gpus {args.trainer_gpus}: must be 0 or more")
    config = load_config(args.experiment, args.overrides, args.imports)
    needs = needs_from(args)
    options = k8s.K8sOptions(
        run_name=args.run_name or default_run_name(config.name),
        image=args.image,
        registry=args.registry,
        pull_secrets=tuple(args.image_pull_secret),
        gpu_image=args.gpu_image,
        namespace=args.namespace,
        namespace_object=not args.no_namespace_object,
        storage=args.storage,
        storage_class=args.storage_class,
        storage_size=args.storage_size,
        existing_claim=args.existing_claim,
        keys_secret=args.keys_secret,
        trainer_gpus=args.trainer_gpus,
        resources=resources(args.resources, needs),
        needs=needs,
        image_pull_policy=args.image_pull_policy,
        node_selectors=_node_selectors(args.node_selector),
        priority_class=args.priority_class,
        disruption_budget=args.disruption_budget,
        network_policy=args.network_policy,
        probe_stale_seconds=args.probe_stale_seconds,
    ).check()
    client = engine_if_any()
    options = _pinned(
        options,
        client,
        needs_gpu_image=any(k8s._gpus(config, g, options) for g in role_groups(config)),
    )
    if client is not None:  # the image is checked where this engine holds it
        check_image_imports(
            client, options.worker_image, config.code, args.image, config.environment
        )
    make_secret = args.apply and args.keys_secret is None
    keys = RunKeys.generate().to_text() if make_secret else None
    objects = k8s.build_manifests(config, options, keys)
    extras = k8s.fetch_pods(config, options)
    files = k8s.write_manifests(objects, extras, Path(args.out))
    launch = LaunchRecord("k8s", options.run_name, namespace=options.namespace)
    write_record(Path(args.out), launch)  # troupe status|logs|stop|ps OUT find the run by it
    console.print(f"wrote {len(files)} files to {args.out} (run {options.run_name})")
    if "/" not in options.worker_image.split(":")[0] and args.image_pull_policy != "Never":
        console.print(
            f"note: {options.worker_image} names no registry: every node must have it already "
            "(then pass --image-pull-policy Never), or push it and pass --registry"
        )
    if not args.apply:
        if args.keys_secret is None:
            console.print(f"make the run's keys (once, kept out of {args.out}):", highlight=False)
            console.print(f"  {k8s.secret_command(options, sys.executable)}", highlight=False)
        console.print(f"then create the run with: kubectl apply -k {args.out}")
        return 0
    for line in k8s_apply.apply_objects(objects, (connect_api or k8s_apply.connect)()):
        console.print(line)
    return 0


def _pinned(options, client, *, needs_gpu_image: bool):
    """The options with immutable image references (:mod:`distributed.images.pinning`): a
    rebuild of ``:latest`` must not give some nodes new code and others old. ``client``: this
    machine's Docker engine; None: the references stay as given (pin says so)."""
    import dataclasses

    from distributed.deploy.k8s import gpu_image
    from distributed.images.pinning import pin

    gpu = None
    if needs_gpu_image:
        gpu = pin(options.gpu_image or gpu_image(options.worker_image), client)
    return dataclasses.replace(
        options, image=pin(options.worker_image, client), registry=None, gpu_image=gpu
    )


def _node_selectors(items: list[str]) -> dict[str, dict[str, str]]:
    from distributed.deploy.sizing import components

    result: dict[str, dict[str, str]] = {}
    for item in items:
        head, sep, value = item.partition("=")
        component, _, key = head.rpartition(":") if ":" in head else ("*", "", head)
        if not sep or not key or component not in ("*", *components()):
            raise DeployError(
                f"--node-selector '{item}': write KEY=VALUE or COMPONENT:KEY=VALUE with "
                f"COMPONENT one of {', '.join(components())}"
            )
        result.setdefault(component, {})[key] = value
    return result


# --------------------------------------------------------------------- troupe deploy slurm
def add_slurm_arguments(parser: argparse.ArgumentParser) -> None:
    _add_common(parser)
    add = parser.add_argument
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--image", help="docker image reference or a .sif file")
    source.add_argument("--code", help="a Troupe checkout with its venv, on a shared file system")
    add("--venv", default=None, help="the venv of --code (default: CODE/.venv)")
    add(
        "--container-runtime",
        default=None,
        choices=["apptainer", "singularity", "enroot", "none"],
        help="default: apptainer with --image, none with --code",
    )
    add("--run-dir", default=None, help="run folder on a shared file system (default: OUT/run)")
    add(
        "--runs-dir",
        default=DEFAULT_RUNS_DIR,
        help="where the run's record is left, so troupe status|logs|ps find it by its name after "
        "the job has left the queue (runs)",
    )
    add("--partition", default=None)
    add("--time", default="04:00:00", help="the job's time limit, HH:MM:SS or D-HH:MM:SS")
    add("--nodes", type=int, default=None, help="default: as many as the tasks need")
    add("--gpus-per-trainer", type=int, default=0, help="GPUs of each trainer task (--gres)")
    add_sizing_arguments(parser)
    add(
        "--interface",
        default=None,
        help="network interface whose address workers advertise, e.g. ib0 (default: the one "
        "their route to the controller goes through)",
    )
    add("--max-restarts", type=int, default=3, help="restarts in a row of a failing worker task")
    add(
        "--no-requeue",
        action="store_true",
        help="do not let Slurm requeue the job after a preemption or node failure (by default a "
        "requeued job resumes the run from its run folder)",
    )
    add(
        "--stop-warning",
        type=int,
        default=180,
        metavar="S",
        help="SIGINT the steps this many seconds before the time limit, so the run stops in "
        "order (180; 0: none)",
    )
    add(
        "--sbatch",
        action="append",
        default=[],
        metavar="OPTION",
        help="an extra #SBATCH line, e.g. --sbatch=--account=rl; repeatable",
    )


def run_slurm(args: argparse.Namespace, console: Console) -> int:
    """Write the sbatch script, config.json and the run's keys into ``--out``."""
    from distributed.deploy import slurm
    from distributed.deploy.manifests import check_run_name, default_run_name, load_config
    from system.streams.security import RunKeys

    config = load_config(args.experiment, args.overrides, args.imports)
    out = Path(args.out).resolve()
    run_name = check_run_name(args.run_name or default_run_name(config.name), 64)
    code = Path(args.code).resolve() if args.code else None
    options = slurm.SlurmOptions(
        run_name=run_name,
        run_dir=Path(args.run_dir).resolve() if args.run_dir else out / "run",
        deploy_dir=out,
        image=args.image,
        code=code,
        venv=Path(args.venv).resolve() if args.venv else None,
        runtime=args.container_runtime or ("none" if code else "apptainer"),
        partition=args.partition,
        time=args.time,
        nodes=args.nodes,
        gpus_per_trainer=args.gpus_per_trainer,
        max_restarts=args.max_restarts,
        requeue=not args.no_requeue,
        stop_warning_s=args.stop_warning,
        extra_sbatch=tuple(args.sbatch),
        needs=needs_from(args),
        interface=args.interface,
    ).check()
    files = slurm.write_deployment(config, options, RunKeys.generate().to_text())
    # The job adds its id to the run folder's own record when it starts (the sbatch script).
    launch = LaunchRecord("slurm", run_name, run_dir=str(options.run_dir))
    write_record(out, launch)
    pointer = point(Path(args.runs_dir), launch)
    console.print(f"wrote {', '.join(str(f) for f in files)}")
    console.print(f"submit with: {files[0]}")
    if pointer is not None:
        console.print(f"troupe status|logs|stop|ps {run_name} find the run by {pointer}")
    return 0
