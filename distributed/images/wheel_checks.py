"""Whether a set of wheels makes a working worker image, read from their file names alone.

A CPU image must carry no CUDA: PyPI's torch for Linux x86_64 is the CUDA build and drags in
several GB of ``nvidia-*`` wheels. Every wheel must install on the image's Python on Linux, and
the troupe-rl wheel must be there. Apart from ``wheelhouse.py``, which makes the wheels.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from distributed.errors import WheelhouseError

PROJECT = "troupe-rl"
IMAGE_PYTHON = (3, 11)
"""The Python of every base image the Dockerfiles accept; the wheelhouse must be built for it."""
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


# --------------------------------------------------------------------- wheel names
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


def is_project_wheel(path: Path | str) -> bool:
    return WheelName.parse(Path(path).name).project == PROJECT


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
    if not any(w.project == PROJECT for w in wheels):
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


def check_wheels(wheels: list[Path], *, gpu: bool, where: Path) -> None:
    """Raise :class:`WheelhouseError` listing every :func:`wheelhouse_problems`."""
    problems = wheelhouse_problems([w.name for w in wheels], gpu=gpu)
    if problems:
        kind = "GPU" if gpu else "CPU"
        raise WheelhouseError(
            f"the wheelhouse {where} cannot make a {kind} image:\n  - " + "\n  - ".join(problems)
        )
