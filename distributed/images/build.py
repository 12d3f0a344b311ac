"""Worker images: an offline wheelhouse of the project, and the image built from it.

Two steps, each usable alone:

1. :func:`build_wheelhouse` runs ``pip wheel`` on the project with this interpreter's pip, so the
   directory ends up holding troupe-rl and every dependency as wheels for Python 3.11 on Linux.
   :func:`wheelhouse_problems` checks the result: a CPU image must carry no CUDA (a torch from
   PyPI for Linux x86_64 is the CUDA build and drags in several GB of ``nvidia-*`` wheels).
2. :func:`build_image` copies ``docker/Dockerfile`` (or ``Dockerfile.gpu``) and the wheelhouse
   into a fresh build context and builds it through the Docker SDK with the build's network
   switched off: only the base image comes from outside (pulled beforehand when absent; when
   it cannot be, the error says how to make one locally).

Errors are :class:`ImageError` subclasses (user errors) whose messages say what to do next. The
``docker`` SDK is imported only when an image is built, so ``troupe list`` does not pay for it.

Longer than 400 lines because the wheelhouse and the image build are one pipeline with shared checks
(CUDA wheels, base image present, build context), each step usable alone.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from api.errors import UserError

if TYPE_CHECKING:
    import docker
    from rich.console import Console

logger = logging.getLogger(__name__)

PROJECT_DIR = Path(__file__).resolve().parents[2]
DOCKER_DIR = PROJECT_DIR / "docker"
DEFAULT_TAG = "troupe-worker:latest"
DEFAULT_GPU_TAG = "troupe-worker:latest-gpu"
IMAGE_PYTHON = (3, 11)
"""The Python of every base image the Dockerfiles accept; the wheelhouse must be built for it."""
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
BUILD_STAGE_LABEL = "org.troupe.stage=build"
"""Set in the Dockerfiles' build stage, so that stage's leftover image can be found."""
MAKE_BASE_HINT = "make one with docker/make-base-image.sh or pass --base-image"


# --------------------------------------------------------------------- errors
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


# --------------------------------------------------------------------- wheelhouse
@dataclass(frozen=True)
class WheelName:
    """The fields of a wheel's file name (PEP 427), e.g. ``torch-2.13.0+cpu-cp311-cp311-...``."""

    filename: str
    project: str
    """Normalised project name (PEP 503): lower case, runs of ``-_.`` as one ``-``."""
    version: str
    python_tags: tuple[str, ...]
    abi_tags: tuple[str, ...]
    platform_tags: tuple[str, ...]

    @classmethod
    def parse(cls, filename: str) -> WheelName:
        parts = filename.removesuffix(".whl").split("-")
        if not filename.endswith(".whl") or len(parts) not in (5, 6):
            raise WheelhouseError(f"{filename} is not a wheel file name (name-version-py-abi-plat)")
        project, version, python, abi, platform = parts[0], parts[1], *parts[-3:]
        return cls(
            filename=filename,
            project=re.sub(r"[-_.]+", "-", project).lower(),
            version=version,
            python_tags=tuple(python.split(".")),
            abi_tags=tuple(abi.split(".")),
            platform_tags=tuple(platform.split(".")),
        )

    @property
    def local_version(self) -> str:
        """The part after ``+`` (``cpu``, ``cu124``), or ``""``."""
        return self.version.partition("+")[2]


def _is_cuda_library(wheel: WheelName) -> bool:
    return wheel.project.startswith("nvidia-") or wheel.project in ("triton", "pytorch-triton")


def _runs_on_python(wheel: WheelName, python: tuple[int, int]) -> bool:
    """Whether an installer for CPython ``python`` accepts this wheel's interpreter tags."""
    major, minor = python
    for tag in wheel.python_tags:
        if tag in (f"py{major}", f"py{major}{minor}", f"cp{major}{minor}"):
            return True
        # A stable-ABI wheel (cp38-abi3) runs on its CPython and every later one.
        match = re.fullmatch(rf"cp{major}(\d+)", tag)
        if match and "abi3" in wheel.abi_tags and int(match.group(1)) <= minor:
            return True
    return False


def wheelhouse_problems(
    filenames: Iterable[str], *, gpu: bool, python: tuple[int, int] = IMAGE_PYTHON
) -> list[str]:
    """Everything that keeps these wheels from making a working image; empty when they can.

    Checked: a troupe-rl wheel is there; every wheel installs on CPython ``python`` on Linux; a
    CPU wheelhouse (``gpu=False``) holds no CUDA build of torch and no ``nvidia-*``/triton
    wheels; a GPU wheelhouse holds a torch that is not a ``+cpu`` build.
    """
    wheels = [WheelName.parse(name) for name in sorted(filenames)]
    problems = []
    if not any(w.project == "troupe-rl" for w in wheels):
        problems.append("there is no troupe-rl wheel")
    version = f"{python[0]}.{python[1]}"
    for w in wheels:
        if not _runs_on_python(w, python):
            problems.append(
                f"{w.filename} is built for {'.'.join(w.python_tags)}, not Python {version} "
                f"(the image's): build the wheelhouse with a Python {version} interpreter"
            )
        if not any(p == "any" or "linux" in p for p in w.platform_tags):
            problems.append(
                f"{w.filename} is built for {'.'.join(w.platform_tags)}, not Linux: build the "
                "wheelhouse on Linux"
            )
    torch = [w for w in wheels if w.project == "torch"]
    if gpu:
        problems += [
            f"{w.filename} is a CPU build of torch: a GPU image needs a CUDA build (pass "
            "--torch-index https://download.pytorch.org/whl/cu124 and keep +cpu wheels out of "
            "pip's find-links)"
            for w in torch
            if w.local_version == "cpu"
        ]
    else:
        cuda = [w.filename for w in wheels if _is_cuda_library(w)]
        cuda += [w.filename for w in torch if w.local_version.startswith(("cu", "rocm"))]
        if cuda:
            problems.append(
                f"CUDA wheels in a CPU wheelhouse: {', '.join(cuda)}. PyPI's torch for Linux is "
                f"the CUDA build: pass --torch-index {CPU_TORCH_INDEX} (or a --find-links "
                "directory holding a +cpu torch wheel), and empty the wheelhouse directory first"
            )
    return problems


def build_wheelhouse(
    out_dir: Path | str,
    project_dir: Path | str = PROJECT_DIR,
    *,
    gpu: bool = False,
    torch_index: str | None = None,
) -> list[Path]:
    """``pip wheel`` the project and all its dependencies into ``out_dir``; returns the wheels.

    Uses this interpreter's pip (the project's venv), so its configuration applies: a
    ``find-links`` directory with a ``+cpu`` torch wheel is preferred over PyPI's CUDA build,
    because a local version label sorts above the plain release. ``torch_index`` adds an index
    (e.g. :data:`CPU_TORCH_INDEX`) for machines without such a wheel. Raises
    :class:`WheelhouseError` if pip fails or :func:`wheelhouse_problems` finds anything.
    """
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if sys.version_info[:2] != IMAGE_PYTHON:
        version = ".".join(map(str, IMAGE_PYTHON))
        raise WheelhouseError(
            f"this is Python {sys.version_info[0]}.{sys.version_info[1]}, but the image runs "
            f"Python {version}: run troupe from a Python {version} venv to build the wheelhouse"
        )
    command = [sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check"]
    command += ["--wheel-dir", str(out), str(Path(project_dir).resolve())]
    if torch_index:
        command += ["--extra-index-url", torch_index]
    logger.info("building the wheelhouse in %s", out)
    _run_logged(command, what="pip wheel")
    wheels = sorted(out.glob("*.whl"))
    problems = wheelhouse_problems([w.name for w in wheels], gpu=gpu)
    if problems:
        raise WheelhouseError(
            f"the wheelhouse {out} cannot make a {_kind(gpu)} image:\n  - "
            + "\n  - ".join(problems)
        )
    size = sum(w.stat().st_size for w in wheels) / 2**20
    logger.info("wheelhouse ready: %d wheels, %.0f MiB", len(wheels), size)
    return wheels


def _run_logged(command: list[str], *, what: str) -> None:
    """Run ``command``, its output to the debug log; on failure raise with the last lines."""
    tail: deque[str] = deque(maxlen=25)
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            tail.append(line.rstrip())
            logger.debug("%s: %s", what, line.rstrip())
    if process.returncode != 0:
        raise WheelhouseError(
            f"{what} failed with exit code {process.returncode}; its last lines:\n"
            + "\n".join(tail)
        )


def _kind(gpu: bool) -> str:
    return "GPU" if gpu else "CPU"


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


def default_base_image(dockerfile: Path) -> str:
    """The default of ``ARG BASE_IMAGE=...`` in ``dockerfile``."""
    match = re.search(r"^ARG BASE_IMAGE=(\S+)", dockerfile.read_text(), re.MULTILINE)
    if match is None:
        raise ImageError(f"{dockerfile} has no 'ARG BASE_IMAGE=...' line")
    return match.group(1)


def ensure_base_image(client: docker.DockerClient, base_image: str) -> None:
    """Make sure ``base_image`` is present, pulling it once if it is not."""
    import docker

    try:
        client.images.get(base_image)
        return
    except docker.errors.ImageNotFound:
        pass
    logger.info("pulling the base image %s", base_image)
    try:
        client.images.pull(base_image)
    except docker.errors.DockerException as e:
        raise BaseImageMissingError(
            f"base image {base_image} is not present and cannot be pulled ({e}): " + MAKE_BASE_HINT
        ) from e


def build_image(
    base_image: str | None,
    tag: str,
    *,
    wheelhouse: Path | str | None = None,
    gpu: bool = False,
    push: bool = False,
    client: docker.DockerClient | None = None,
    torch_index: str | None = None,
) -> str:
    """Build the worker image ``tag`` on ``base_image``; returns the image id.

    ``base_image`` None means the Dockerfile's default (``python:3.11-slim``, or the CUDA image
    for ``gpu``); it must be present or pullable, and it must have Python 3.11. The wheels come
    from ``wheelhouse`` when given (checked with :func:`wheelhouse_problems`), otherwise
    :func:`build_wheelhouse` makes them in a temporary directory. The CPU build runs with no
    network, so nothing but the base image is ever fetched. ``push`` then pushes ``tag``. The
    image ``tag`` named before is removed when nothing else uses it.
    """
    dockerfile = DOCKER_DIR / ("Dockerfile.gpu" if gpu else "Dockerfile")
    client = client or connect()
    base = base_image or default_base_image(dockerfile)
    ensure_base_image(client, base)
    previous = _image_id(client, tag)
    with tempfile.TemporaryDirectory(prefix="troupe-image-") as tmp:
        context = Path(tmp)
        shutil.copy2(dockerfile, context / dockerfile.name)
        shutil.copy2(DOCKER_DIR / ".dockerignore", context / ".dockerignore")
        if wheelhouse is None:
            build_wheelhouse(context / "wheelhouse", gpu=gpu, torch_index=torch_index)
        else:
            _stage_wheelhouse(Path(wheelhouse), context / "wheelhouse", gpu=gpu)
        logger.info("building %s on %s from %s", tag, base, dockerfile.name)
        try:
            image_id = _stream_build(
                lambda: client.api.build(
                    path=str(context),
                    dockerfile=dockerfile.name,
                    buildargs={"BASE_IMAGE": base},
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
        finally:
            # The build stage (a venv plus the wheels, over 1 GB) is left behind as an untagged
            # image, also by a failed build; it is only ever reused for the very same wheels.
            pruned = client.images.prune(filters={"dangling": True, "label": BUILD_STAGE_LABEL})
            logger.debug("removed build stages: %s", pruned)
    logger.info("built %s (%s)", tag, image_id)
    if previous not in (None, image_id):
        _remove_if_untagged(client, previous)
    if push:
        push_image(tag, client=client)
    return image_id


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
        if client.images.get(image_id).tags:
            return
        client.images.remove(image_id)
        logger.debug("removed the image %s replaced", image_id)
    except docker.errors.APIError as e:  # a container still uses it: keep it
        logger.debug("kept the replaced image %s: %s", image_id, e)


def _stage_wheelhouse(source: Path, target: Path, *, gpu: bool) -> None:
    """Check the wheels in ``source`` and hard-link (or copy) them into the build context."""
    wheels = sorted(source.glob("*.whl"))
    if not wheels:
        raise WheelhouseError(
            f"{source} holds no wheels: make them with `troupe image wheelhouse {source}`"
        )
    problems = wheelhouse_problems([w.name for w in wheels], gpu=gpu)
    if problems:
        raise WheelhouseError(
            f"the wheelhouse {source} cannot make a {_kind(gpu)} image:\n  - "
            + "\n  - ".join(problems)
        )
    target.mkdir()
    for wheel in wheels:
        try:
            os.link(wheel, target / wheel.name)
        except OSError:  # another file system: the context needs its own copy
            shutil.copy2(wheel, target / wheel.name)


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
        help="image with Python 3.11 to build on (default: python:3.11-slim, or a CUDA image "
        "with --gpu); without a registry, make one with docker/make-base-image.sh",
    )
    build.add_argument(
        "--tag", help=f"name of the image (default: {DEFAULT_TAG}, with --gpu {DEFAULT_GPU_TAG})"
    )
    build.add_argument("--gpu", action="store_true", help="build docker/Dockerfile.gpu (CUDA)")
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
    _add_torch_index_argument(wheelhouse)

    push = actions.add_parser("push", help="push a built image to its registry")
    push.add_argument("tag", help="image to push, e.g. registry.example.com/troupe-worker:latest")


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
        )
        if args.add:  # user code: a thin layer on top (distributed/images/user_layer.py)
            from distributed.images.user_layer import add_user_code

            image_id = add_user_code(connect(), tag, tag, args.add)
        console.print(Text(f"built {tag} ({image_id})", style="green"), highlight=False)
    elif args.image_action == "wheelhouse":
        wheels = build_wheelhouse(args.out_dir, gpu=args.gpu, torch_index=args.torch_index)
        console.print(Text(f"{len(wheels)} wheels in {args.out_dir}", style="green"))
    else:
        push_image(args.tag)
        console.print(Text(f"pushed {args.tag}", style="green"), highlight=False)
    return 0
