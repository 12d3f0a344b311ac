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

from distributed.deploy.manifests import DeployError
from distributed.images.build import DEFAULT_TAG

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
    parser.add_argument("experiment", help="registered experiment (troupe list shows them)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    parser.add_argument("--out", required=True, help="directory for the generated files")
    parser.add_argument("--run-name", default=None, help="names the run (default: exp-MMDD-time)")


# --------------------------------------------------------------------- troupe deploy k8s
def add_k8s_arguments(parser: argparse.ArgumentParser) -> None:
    _add_common(parser)
    add = parser.add_argument
    add("--image", default=DEFAULT_TAG, help="worker image, pushed where the cluster pulls from")
    add("--gpu-image", default=None, help="image of GPU trainers (default: IMAGE-gpu)")
    add("--namespace", default="troupe")
    add("--no-namespace-object", action="store_true", help="the namespace exists: don't create it")
    add("--storage-class", default=None, help="a storage class offering ReadWriteMany")
    add("--storage-size", default="10Gi", help="size of the run folder's claim")
    add("--existing-claim", default=None, help="a ReadWriteMany PVC for run folders, not a new one")
    add(
        "--trainer-gpus",
        type=int,
        default=None,
        help="nvidia.com/gpu per trainer pod "
        "(default: 1 when the policy has device=cuda..., else 0)",
    )
    add(
        "--resources",
        action="append",
        default=[],
        metavar="COMPONENT=SPEC",
        help="e.g. actor=cpu:2/4,memory:2Gi/4Gi (request/limit); repeatable",
    )
    add("--apply", action="store_true", help="also create the objects (kubeconfig context)")


def run_k8s(args: argparse.Namespace, console: Console, connect_api: Callable | None = None) -> int:
    """Write the manifests; with ``--apply`` create them through the Kubernetes API too."""
    from distributed.deploy import k8s
    from distributed.deploy.manifests import default_run_name, load_config
    from distributed.deploy.manifests import parse_resource_overrides as resources
    from system.streams.security import RunKeys

    if args.trainer_gpus is not None and args.trainer_gpus < 0:
        raise DeployError(f"--trainer-gpus {args.trainer_gpus}: must be 0 or more")
    config = load_config(args.experiment, args.overrides)
    options = k8s.K8sOptions(
        run_name=args.run_name or default_run_name(config.name),
        image=args.image,
        gpu_image=args.gpu_image,
        namespace=args.namespace,
        namespace_object=not args.no_namespace_object,
        storage_class=args.storage_class,
        storage_size=args.storage_size,
        existing_claim=args.existing_claim,
        trainer_gpus=args.trainer_gpus,
        resources=resources(args.resources),
    )
    objects = k8s.build_manifests(config, options, RunKeys.generate().to_text())
    files = k8s.write_manifests(objects, [k8s.fetch_pod(options)], Path(args.out))
    console.print(f"wrote {len(files)} files to {args.out} (run {options.run_name})")
    if not args.apply:
        console.print(f"create them with: kubectl apply -k {args.out}")
        return 0
    for line in k8s.apply_objects(objects, (connect_api or k8s.connect)()):
        console.print(line)
    return 0


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
    add("--partition", default=None)
    add("--time", default="04:00:00", help="the job's time limit, HH:MM:SS or D-HH:MM:SS")
    add("--nodes", type=int, default=None, help="default: as many as the tasks need")
    add("--gpus-per-trainer", type=int, default=0, help="GPUs of each trainer task (--gres)")
    _add_sizing(parser)
    add(
        "--interface",
        default=None,
        help="network interface whose address workers advertise, e.g. ib0 (default: the one "
        "their route to the controller goes through)",
    )
    add("--max-restarts", type=int, default=3, help="restarts of a failing worker task")
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

    config = load_config(args.experiment, args.overrides)
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
        extra_sbatch=tuple(args.sbatch),
        needs=_needs(args),
        interface=args.interface,
    ).check()
    files = slurm.write_deployment(config, options, RunKeys.generate().to_text())
    console.print(f"wrote {', '.join(str(f) for f in files)}")
    console.print(f"submit with: {files[0]}")
    return 0


def _add_sizing(parser: argparse.ArgumentParser) -> None:
    """What each role asks for: measured figures, overridable (``deploy/sizing.py``)."""
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
        help="CPUs one worker of COMPONENT (controller, params, trainer, policy, actor, eval) "
        "uses, e.g. trainer=8; repeatable",
    )
    parser.add_argument(
        "--memory",
        action="append",
        default=[],
        metavar="COMPONENT=MIB",
        help="peak memory (MiB) of one worker of COMPONENT, e.g. trainer=6000 (a margin is "
        "added); repeatable",
    )


def _needs(args: argparse.Namespace) -> dict:
    from distributed.deploy import sizing

    return sizing.role_needs(
        measured=sizing.measured_from(args.measured) if args.measured else None,
        cpus=sizing.parse_overrides(args.cpus, "--cpus"),
        memory_mib=sizing.parse_overrides(args.memory, "--memory"),
    )
