"""Worker images: built from the wheelhouse (``images/wheelhouse.py``) through the Docker SDK.

:func:`build_image` stages ``docker/Dockerfile`` (or ``Dockerfile.gpu``), the dependency wheels
(``deps/``) and the project wheel (``project/``) in a fresh build context and builds it with the
build's network switched off: only the base image comes from outside. The dependencies are a
stage and an image layer of their own, so after a code-only change Docker's cache supplies them
and only the small project layer is made again.

When no base image is given, the Dockerfile's default (``python:3.11-slim``) is used if present
or pullable, else ``troupe-base:bookworm-py311`` (made offline by ``docker/make-base-image.sh``);
with neither, the error names the command that makes it, and ``--make-base-image`` runs it.

Errors are :class:`ImageError` subclasses (user errors) whose messages say what to do next. The
``docker`` SDK is imported only when an image is built, so ``troupe list`` does not pay for it.

Longer than 400 lines because the wheelhouse, the cached dependency stage and the image build are
one pipeline with shared checks (CUDA wheels, base image present, build context), each step usable
alone.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed.errors import (
    BaseImageMissingError,
    DockerUnavailableError,
    ImageBuildError,
    ImageError,
    ImagePushError,
    WheelhouseError,
)
from distributed.images import pinning, project, source
from distributed.images.wheel_checks import CPU_TORCH_INDEX
from distributed.images.wheelhouse import (
    DEFAULT_EXTRAS,
    Wheelhouse,
    build_wheelhouse,
    link_or_copy,
    make_wheelhouse,
)

if TYPE_CHECKING:
    import docker
    from rich.console import Console

logger = logging.getLogger(__name__)

__all__ = ["ImageError", "WheelhouseError", "build_image", "build_wheelhouse", "push_image"]

PROJECT_DIR = project.CHECKOUT_DIR
DOCKER_DIR = project.docker_dir()
"""The checkout's ``docker/``, or the copy a wheel installed (:mod:`.project`)."""
DEFAULT_TAG = "troupe-worker:latest"
DEFAULT_GPU_TAG = "troupe-worker:latest-gpu"
LOCAL_BASE = "troupe-base:bookworm-py311"
"""What ``docker/make-base-image.sh`` makes: Debian bookworm's Python 3.11, no registry needed."""
MAKE_BASE_SCRIPT = DOCKER_DIR / "make-base-image.sh"
DEPS_STAGE_LABEL = "org.troupe.stage=deps"
PROJECT_STAGE_LABEL = "org.troupe.stage=project"
DEPS_KEY_LABEL = "org.troupe.deps"


def _shown(path: Path) -> str:
    """``path`` as a hint names it: from the checkout's root there (the README's commands run
    in it), whole where a wheel installed it."""
    return str(path.relative_to(PROJECT_DIR) if project.is_checkout(PROJECT_DIR) else path)


_AS_ROOT = "" if os.geteuid() == 0 else "sudo "
"""A root shell has no sudo to run (often not even installed): the hints say it where needed."""
MAKE_BASE_HINT = (
    f"make {LOCAL_BASE} offline (root, debootstrap from a Debian mirror, about a minute) with "
    f"`{_AS_ROOT}{_shown(MAKE_BASE_SCRIPT)}` and build again, or pass "
    "--make-base-image to do both now, or --base-image IMAGE"
)


# --------------------------------------------------------------------- docker
def connect() -> docker.DockerClient:
    """A client for the engine named by the environment (``DOCKER_HOST``), checked to answer."""
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as e:
        where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise DockerUnavailableError(
            f"no Docker engine answers at {where} ({e}): start one (as root, "
            "`bash .ci/docker-setup` installs and starts it) or set DOCKER_HOST"
        ) from e
    return client


def engine_if_any() -> docker.DockerClient | None:
    """This machine's engine, or None where none answers (what it checks is then not checked)."""
    try:
        return connect()
    except DockerUnavailableError:
        return None


def default_base_image(dockerfile: Path) -> str:
    """The default of ``ARG BASE_IMAGE=...`` in ``dockerfile``."""
    match = re.search(r"^ARG BASE_IMAGE=(\S+)", dockerfile.read_text(), re.MULTILINE)
    if match is None:
        raise ImageError(f"{dockerfile} has no 'ARG BASE_IMAGE=...' line")
    return match.group(1)


def ensure_base_image(client: docker.DockerClient, base_image: str) -> None:
    """Make sure ``base_image`` is present, pulling it once if it is not."""
    import docker

    if _image_id(client, base_image) is not None:
        return
    logger.info("pulling the base image %s", base_image)
    try:
        client.images.pull(base_image)
    except docker.errors.DockerException as e:
        raise BaseImageMissingError(
            f"base image {base_image} is not present and cannot be pulled ({e}): " + MAKE_BASE_HINT
        ) from e


def resolve_base_image(
    client: docker.DockerClient, requested: str | None, *, gpu: bool, make_base: bool = False
) -> str:
    """The base to build on: ``requested`` if given; else the Dockerfile's default when present
    or pullable, else :data:`LOCAL_BASE` (made here first with ``make_base``)."""
    if requested is not None:
        ensure_base_image(client, requested)
        return requested
    default = default_base_image(DOCKER_DIR / ("Dockerfile.gpu" if gpu else "Dockerfile"))
    if gpu:  # the local base has no CUDA hooks: the GPU image needs its own default
        ensure_base_image(client, default)
        return default
    for present in (default, LOCAL_BASE):
        if _image_id(client, present) is not None:
            return present
    try:
        ensure_base_image(client, default)
        return default
    except BaseImageMissingError:
        if not make_base:
            raise
    make_base_image(LOCAL_BASE)
    return LOCAL_BASE


def make_base_image(tag: str) -> None:
    """Run ``docker/make-base-image.sh`` (debootstrap + ``docker import``); needs root."""
    if os.geteuid() != 0:
        raise BaseImageMissingError(
            f"making {tag} needs root (debootstrap): run `sudo {MAKE_BASE_SCRIPT} --tag {tag}`"
        )
    logger.info("making the base image %s with %s (about a minute)", tag, MAKE_BASE_SCRIPT.name)
    done = subprocess.run(
        ["bash", str(MAKE_BASE_SCRIPT), "--tag", tag], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise BaseImageMissingError(
            f"{MAKE_BASE_SCRIPT.name} failed (exit {done.returncode}):\n{done.stderr[-2000:]}"
        )


def build_image(
    base_image: str | None,
    tag: str,
    *,
    wheelhouse: Path | str | None = None,
    gpu: bool = False,
    push: bool = False,
    client: docker.DockerClient | None = None,
    torch_index: str | None = None,
    make_base: bool = False,
    refresh_deps: bool = False,
    extras: Sequence[str] | None = None,
    requirements: Sequence[str] = (),
) -> str:
    """Build the worker image ``tag`` on ``base_image``; returns the image id. ``extras``: the
    project's extras whose packages the image holds too (None: :data:`DEFAULT_EXTRAS`, or what
    ``wheelhouse`` holds); ``requirements``: pip requirements of the user's own, installed
    with them (:mod:`.user_requirements`).

    ``base_image`` None: see :func:`resolve_base_image`; it must have Python 3.11. The wheels
    come from ``wheelhouse`` when given, otherwise the dependency wheels from the cache (made on
    the first build, or again with ``refresh_deps``) and a project wheel built out of tree. The
    CPU build runs with no network. ``push`` then pushes ``tag``. The image ``tag`` named before
    is removed when nothing else uses it.
    """
    if extras is not None and wheelhouse is not None:
        raise ImageError(
            "--extras chooses the wheels a build makes; a --wheelhouse holds its own: make it "
            f"with them (troupe image wheelhouse DIR --extras {','.join(extras)})"
        )
    if requirements and wheelhouse is not None:
        raise ImageError(
            "--pip and --requirements choose the wheels a build makes; a --wheelhouse holds its "
            "own: make it with them (troupe image wheelhouse DIR --pip ...)"
        )
    dockerfile = DOCKER_DIR / ("Dockerfile.gpu" if gpu else "Dockerfile")
    client = client or connect()
    base = resolve_base_image(client, base_image, gpu=gpu, make_base=make_base)
    previous = _image_id(client, tag)
    with tempfile.TemporaryDirectory(prefix="troupe-image-") as tmp:
        context = Path(tmp)
        wheels = make_wheelhouse(
            context / "scratch",
            wheelhouse=Path(wheelhouse) if wheelhouse is not None else None,
            gpu=gpu,
            torch_index=torch_index,
            refresh=refresh_deps,
            extras=DEFAULT_EXTRAS if extras is None else extras,
            requirements=requirements,
        )
        deps_key = _stage_context(context, dockerfile, wheels)
        logger.info("building %s on %s from %s", tag, base, dockerfile.name)
        try:
            image_id = _stream_build(
                lambda: client.api.build(
                    path=str(context),
                    dockerfile=dockerfile.name,
                    buildargs={"BASE_IMAGE": base, "DEPS_KEY": deps_key},
                    labels={source.LABEL: source.source_digest()},  # a run tells a stale one
                    tag=tag,
                    rm=True,
                    forcerm=True,
                    pull=False,
                    # The GPU base may need apt to get Python 3.11 (see Dockerfile.gpu).
                    network_mode=None if gpu else "none",
                    decode=True,
                ),
                tag=tag,
                base=base,
            )
            _keep_deps_stage(client, tag, deps_key)
            _keep_project_stage(client, tag)
        finally:
            _prune_stages(client)
    pinned = _tag_content(client, tag, image_id)
    logger.info("built %s (%s), also tagged %s: a tag no rebuild moves", tag, image_id, pinned)
    if previous not in (None, image_id):
        _remove_if_untagged(client, previous)
    if push:
        push_image(tag, client=client)
        push_image(pinned, client=client)
    return image_id


def _tag_content(client: docker.DockerClient, tag: str, image_id: str) -> str:
    """Tag the image ``REPO:id-<12 hex>`` (:mod:`.pinning`): what deploys should name."""
    repo = pinning.repository(tag)
    content = pinning.content_tag(image_id)
    client.images.get(image_id).tag(repo, content)
    return f"{repo}:{content}"


def _stage_context(context: Path, dockerfile: Path, wheels: Wheelhouse) -> str:
    """Dockerfile, ``deps/`` and ``project/`` (the user's own wheels in ``project/user/``) in
    ``context``; returns the dependency set's key (a digest of the dependency wheels' names and
    sizes: the same wheels, the same key)."""
    import hashlib

    shutil.copy2(dockerfile, context / dockerfile.name)
    shutil.copy2(DOCKER_DIR / ".dockerignore", context / ".dockerignore")
    digest = hashlib.sha256()
    staged = [("deps", wheels.dependencies), ("project", [wheels.project])]
    for folder, files in [*staged, *([("project/user", wheels.user)] if wheels.user else [])]:
        (context / folder).mkdir()
        for wheel in files:
            link_or_copy(wheel, context / folder / wheel.name)
    for wheel in sorted(wheels.dependencies):
        digest.update(f"{wheel.name} {wheel.stat().st_size}\n".encode())
    return digest.hexdigest()[:16]


def _keep_deps_stage(client: docker.DockerClient, tag: str, deps_key: str) -> None:
    """Tag the dependency stage ``REPO:deps-KEY``, the next build's cache; untag older ones.

    A tag is what keeps Docker from removing the stage with the project stage built on it
    (removing an image removes its untagged parents). Stages of older dependency sets (over
    1 GB each) lose their tags, and :func:`_prune_stages` removes them.
    """
    import docker

    repository = docker.utils.parse_repository_tag(tag)[0]
    keep = f"{repository}:deps-{deps_key}"
    stages = client.images.list(
        all=True, filters={"label": [DEPS_STAGE_LABEL, f"{DEPS_KEY_LABEL}={deps_key}"]}
    )
    if stages:  # the stage's last image has the most layers
        last = max(stages, key=lambda i: len(i.attrs.get("RootFS", {}).get("Layers", [])))
        last.tag(repository, f"deps-{deps_key}")
    for image in client.images.list(name=repository, filters={"label": [DEPS_STAGE_LABEL]}):
        for stale in [t for t in image.tags if t.startswith(f"{repository}:deps-") and t != keep]:
            client.images.remove(stale)


def _keep_project_stage(client: docker.DockerClient, tag: str) -> None:
    """Tag the newest project stage ``REPO:project-stage``: with nothing changed, the next
    build takes every step from the cache and ends at the same image ID (it was pruned once,
    so each build made the project layer again and a new ID with it). The stage it replaces
    loses the tag and :func:`_prune_stages` removes it."""
    import docker

    repository = docker.utils.parse_repository_tag(tag)[0]
    stages = client.images.list(all=True, filters={"label": [PROJECT_STAGE_LABEL]})
    if stages:  # the stage's last step is its newest image
        last = max(stages, key=lambda i: (i.attrs.get("Created", ""), _layers(i)))
        last.tag(repository, "project-stage")


def _layers(image) -> int:
    return len(image.attrs.get("RootFS", {}).get("Layers", []))


def _prune_stages(client: docker.DockerClient) -> None:
    """Remove untagged build stages, also a failed build's: a project stage a newer one
    replaced, and a dependency stage that is failed or superseded."""
    for label in (PROJECT_STAGE_LABEL, DEPS_STAGE_LABEL):
        pruned = client.images.prune(filters={"dangling": True, "label": [label]})
        logger.debug("removed build stages: %s", pruned)


def _image_id(client: docker.DockerClient, name: str) -> str | None:
    import docker

    try:
        return client.images.get(name).id
    except docker.errors.ImageNotFound:
        return None


def _remove_if_untagged(client: docker.DockerClient, image_id: str) -> None:
    """Remove the image a rebuild took the tag from, unless it has other tags or containers.

    Rebuilding in CI would otherwise leave a gigabyte behind per run.
    """
    import docker

    try:
        image = client.images.get(image_id)
        own = [t for t in image.tags if t.rpartition(":")[2].startswith(pinning.ID_TAG_PREFIX)]
        if len(own) < len(image.tags):  # still named by a tag of its own: kept
            return
        for content in own:  # its content tag goes with it (and the image with its last tag)
            client.images.remove(content)
        if not own:
            client.images.remove(image_id)
        logger.debug("removed the image %s replaced", image_id)
    except docker.errors.APIError as e:  # a container still uses it: keep it
        logger.debug("kept the replaced image %s: %s", image_id, e)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_BUILDER_CHATTER = (" ---> ", "Removing intermediate container")


def _stream_build(start: Callable[[], Iterator[dict[str, Any]]], *, tag: str, base: str) -> str:
    """Start the build and log its output as it comes (steps at info, everything at debug)."""
    import docker

    image_id = None
    tail: deque[str] = deque(maxlen=20)
    try:
        for chunk in start():
            if "error" in chunk:
                raise ImageBuildError(
                    f"building {tag} on {base} failed: {chunk['error'].strip()}; the last lines "
                    "of its log:\n" + "\n".join(tail)
                )
            for line in _ANSI.sub("", chunk.get("stream", "")).splitlines():
                if not line.strip():
                    continue
                logger.debug("%s", line)
                if line.startswith("Step "):
                    logger.info("%s", line if len(line) <= 100 else line[:97] + "...")
                if not line.startswith(_BUILDER_CHATTER):
                    tail.append(line)
            image_id = chunk.get("aux", {}).get("ID", image_id)
    except docker.errors.DockerException as e:
        raise ImageBuildError(f"building {tag} on {base} failed: {e}") from e
    if image_id is None:
        raise ImageBuildError(f"building {tag} on {base} ended without an image id")
    return image_id


def push_image(tag: str, *, client: docker.DockerClient | None = None) -> None:
    """Push ``tag`` to its registry (Docker Hub when the tag names none)."""
    import docker

    client = client or connect()
    repository, version = docker.utils.parse_repository_tag(tag)
    logger.info("pushing %s", tag)
    hint = (
        "log in with `docker login REGISTRY`, and name the registry in the tag "
        "(--tag registry.example.com/troupe-worker:latest)"
    )
    try:
        for chunk in client.images.push(repository, tag=version or None, stream=True, decode=True):
            if "error" in chunk:
                raise ImagePushError(f"pushing {tag} failed: {chunk['error'].strip()}: {hint}")
            if "status" in chunk and "progress" not in chunk:
                logger.debug("push: %s %s", chunk.get("id", ""), chunk["status"])
    except docker.errors.DockerException as e:
        raise ImagePushError(f"pushing {tag} failed ({e}): {hint}") from e
    logger.info("pushed %s", tag)


# --------------------------------------------------------------------- troupe image
def add_image_arguments(parser: argparse.ArgumentParser) -> None:
    """``troupe image build|wheelhouse|push``."""
    actions = parser.add_subparsers(dest="image_action", metavar="ACTION", required=True)

    build = actions.add_parser(
        "build",
        help="build the worker image from an offline wheelhouse",
        description="Build the worker image: wheels of the project and its dependencies, "
        "installed on a base image with the build's network switched off.",
    )
    build.add_argument(
        "--base-image",
        metavar="IMAGE",
        help="image with Python 3.11 to build on (default: python:3.11-slim if present or "
        f"pullable, else {LOCAL_BASE}; a CUDA image with --gpu)",
    )
    build.add_argument(
        "--make-base-image",
        action="store_true",
        help=f"when no base image is present or pullable, make {LOCAL_BASE} offline first "
        "(root; docker/make-base-image.sh)",
    )
    build.add_argument(
        "--refresh-deps",
        action="store_true",
        help="make the cached dependency wheels again (after changing pip's find-links or index)",
    )
    build.add_argument(
        "--tag",
        type=pinning.image_reference,
        help=f"name of the image (default: {DEFAULT_TAG}, with --gpu {DEFAULT_GPU_TAG})",
    )
    build.add_argument("--gpu", action="store_true", help="build docker/Dockerfile.gpu (CUDA)")
    _add_extras_argument(build, None)
    _add_requirements_arguments(build)
    build.add_argument("--push", action="store_true", help="push the image after building it")
    build.add_argument(
        "--wheelhouse",
        type=Path,
        metavar="DIR",
        help="use the wheels in DIR (from `troupe image wheelhouse DIR`) instead of building them",
    )
    _add_torch_index_argument(build)
    build.add_argument(
        "--add",
        action="append",
        default=[],
        metavar="PATH",
        help="your own .py file or folder, added to the image (a layer on top; repeatable)",
    )

    wheelhouse = actions.add_parser(
        "wheelhouse",
        help="only make the wheelhouse (to copy to an air-gapped machine)",
        description="pip wheel the project and every dependency into a directory.",
    )
    wheelhouse.add_argument("out_dir", type=Path, metavar="DIR", help="directory for the wheels")
    wheelhouse.add_argument("--gpu", action="store_true", help="wheels for the GPU image")
    _add_extras_argument(wheelhouse, DEFAULT_EXTRAS)
    _add_requirements_arguments(wheelhouse)
    _add_torch_index_argument(wheelhouse)

    push = actions.add_parser("push", help="push a built image to its registry")
    push.add_argument("tag", help="image to push, e.g. registry.example.com/troupe-worker:latest")


def _add_extras_argument(parser: argparse.ArgumentParser, default: tuple[str, ...] | None) -> None:
    parser.add_argument(
        "--extras",
        type=_extras,
        default=default,
        metavar="EXTRA[,EXTRA]",
        help="troupe-rl's extras whose packages the image holds (default: "
        f"{','.join(DEFAULT_EXTRAS)}, what the registered experiments need: the Atari recipes, "
        "PettingZoo games; also mujoco, box2d, video; '' for none)",
    )


def _add_requirements_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pip",
        action="append",
        default=[],
        metavar="REQUIREMENT",
        help="a package your environments need, installed in the image too: a name with its "
        "version range (minigrid>=2.3), a folder (./my_pkg) or a wheel (repeatable)",
    )
    parser.add_argument(
        "--requirements",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="the same for every requirement of a requirements file, one a line (repeatable)",
    )


def _user_requirements(args: argparse.Namespace) -> list[str]:
    """``--pip``'s requirements, then each ``--requirements`` file's."""
    from distributed.images.user_requirements import read_requirements

    return [*args.pip, *(r for path in args.requirements for r in read_requirements(path))]


def _extras(value: str) -> tuple[str, ...]:
    return tuple(e.strip() for e in value.split(",") if e.strip())


def _add_torch_index_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--torch-index",
        metavar="URL",
        help=f"extra pip index for torch, e.g. {CPU_TORCH_INDEX} when no CPU torch wheel is in "
        "pip's find-links",
    )


def run_image(args: argparse.Namespace, console: Console) -> int:
    """Carry out ``troupe image ACTION``."""
    from rich.text import Text

    if args.image_action == "build":
        tag = args.tag or (DEFAULT_GPU_TAG if args.gpu else DEFAULT_TAG)
        image_id = build_image(
            args.base_image,
            tag,
            wheelhouse=args.wheelhouse,
            gpu=args.gpu,
            push=args.push,
            torch_index=args.torch_index,
            make_base=args.make_base_image,
            refresh_deps=args.refresh_deps,
            extras=args.extras,
            requirements=_user_requirements(args),
        )
        if args.add:  # user code: a thin layer on top (distributed/images/user_layer.py)
            from distributed.images.user_layer import add_user_code

            image_id = add_user_code(connect(), tag, tag, args.add)
        console.print(Text(f"built {tag} ({image_id})", style="green"), highlight=False)
    elif args.image_action == "wheelhouse":
        wheels = build_wheelhouse(
            args.out_dir,
            gpu=args.gpu,
            torch_index=args.torch_index,
            extras=args.extras,
            requirements=_user_requirements(args),
        )
        console.print(Text(f"{len(wheels)} wheels in {args.out_dir}", style="green"))
    else:
        push_image(args.tag)
        console.print(Text(f"pushed {args.tag}", style="green"), highlight=False)
    return 0
