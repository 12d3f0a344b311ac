"""The wheels a worker image is made of, in parts that change at different speeds.

- **Dependencies** (torch, numpy, gymnasium... about 1 GB): made once by ``pip wheel`` of the
  project's ``[project].dependencies`` and kept in a cache folder keyed by those requirements,
  the image kind (CPU/GPU), the torch index and the Python version. A code-only change finds
  them there, and the image build finds its dependency layer in Docker's cache.
- **The project** (troupe-rl, a few hundred kB): built again every time, from a copy of the
  source in a temporary folder, so the checkout gets no ``build/`` or ``*.egg-info``.
- **The user's own packages** (``--pip``): the wheels they add to those two, installed in the
  project's layer (:mod:`.user_requirements`).

:mod:`.wheel_checks` checks a set of wheels: a CPU image must carry no CUDA (PyPI's torch for
Linux x86_64 is the CUDA build and drags in several GB of ``nvidia-*`` wheels).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from distributed.errors import WheelhouseError
from distributed.images import project
from distributed.images.pip_calls import COMPLETE, cache_root, pip, reproducible_env, run_logged
from distributed.images.project import canonical_requirement, project_dependencies
from distributed.images.user_requirements import local_paths, user_wheels, with_user_requirements
from distributed.images.wheel_checks import IMAGE_PYTHON, check_wheels, is_project_wheel

logger = logging.getLogger(__name__)

PROJECT_DIR = project.CHECKOUT_DIR
# Never part of the project wheel; copying them would only slow the out-of-tree build down
# (docker/ is copied apart, without a by-hand build's wheel folders).
_NOT_SOURCE = (".git", ".venv", "build", "dist", "runs", "wheelhouse", "tests", "docker")
_NOT_SOURCE_GLOBS = ("*.egg-info", "__pycache__", ".*_cache", "*.pyc")


# --------------------------------------------------------------------- the parts
@dataclass(frozen=True)
class Wheelhouse:
    """The wheels of one image: the cached dependencies, this build's project wheel, and the
    wheels the user's own packages (``--pip``) add to them, which go in the project's layer."""

    dependencies: list[Path]
    project: Path
    user: list[Path] = field(default_factory=list)

    @property
    def all(self) -> list[Path]:
        return [*self.dependencies, *self.user, self.project]


USER_WHEELS = "user-wheels.txt"
"""Written by ``troupe image wheelhouse`` beside the wheels: those of the ``--pip`` packages, one a
line, which an image build from that folder installs in its project layer, as it would have
made them: a wheelhouse made again after a change to one's own package then rebuilds that layer
alone, not the dependency layer of a gigabyte."""

DEFAULT_EXTRAS = ("atari", "multiagent")
"""The extras a worker image holds unless told otherwise: what the registered experiments need
(``pong-ppo`` and the Atari recipes, ``connect4-selfplay`` and PettingZoo games). An image of
the core dependencies alone failed them in every container, for want of ale-py or PettingZoo;
they add some 230 MB to its 1.1 GB."""


def dependency_key(requirements: list[str], *, gpu: bool, torch_index: str | None) -> str:
    """Names the cached dependency folder: anything that changes which wheels pip picks."""
    described = {
        "requirements": sorted(canonical_requirement(r) for r in requirements),
        "gpu": gpu,
        "torch_index": torch_index,
        "python": list(IMAGE_PYTHON),
        "pip_find_links": os.environ.get("PIP_FIND_LINKS"),
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


def dependency_wheels(
    project_dir: Path = PROJECT_DIR,
    *,
    gpu: bool = False,
    torch_index: str | None = None,
    refresh: bool = False,
    extras: Sequence[str] = (),
    requirements: Sequence[str] = (),
) -> list[Path]:
    """The dependency wheels, from the cache when they are there (``refresh``: made again);
    ``extras``: those of the project's extras too (:func:`project_dependencies`);
    ``requirements``: the user's own (``--pip``), with theirs.

    Made with this interpreter's pip (the project's venv), so its configuration applies: a
    ``find-links`` directory with a ``+cpu`` torch wheel is preferred over PyPI's CUDA build,
    because a local version label sorts above the plain release.
    """
    _check_python()
    wanted = with_user_requirements(project_dependencies(project_dir, extras), requirements)
    key = dependency_key(wanted, gpu=gpu, torch_index=torch_index)
    folder = cache_root() / "wheels" / key
    if (folder / COMPLETE).exists() and not refresh and not local_paths(requirements):
        logger.info("dependency wheels from the cache %s", folder)
        return sorted(folder.glob("*.whl"))
    folder.parent.mkdir(parents=True, exist_ok=True)
    making = Path(tempfile.mkdtemp(prefix=f"{folder.name}.", dir=folder.parent))
    try:
        listed = making / "requirements.txt"
        listed.write_text("\n".join(wanted) + "\n")
        command = [*pip("wheel"), "--wheel-dir", str(making), "-r", str(listed)]
        if torch_index:
            command += ["--extra-index-url", torch_index]
        logger.info("making the dependency wheels in %s (once per dependency set)", folder)
        run_logged(command, what="pip wheel")
        (making / COMPLETE).write_text(json.dumps(wanted) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        making.rename(folder)
    finally:
        shutil.rmtree(making, ignore_errors=True)
    return sorted(folder.glob("*.whl"))


def project_wheel(out_dir: Path, project_dir: Path = PROJECT_DIR) -> Path:
    """Build the troupe-rl wheel from a copy of the source: the checkout stays as it was."""
    if project_dir == PROJECT_DIR and not project.is_checkout(project_dir):
        return project.installed_wheel(out_dir)  # installed from a wheel: its files, packed
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="troupe-source-") as tmp:
        source = Path(tmp) / "src"
        shutil.copytree(
            project_dir,
            source,
            ignore=shutil.ignore_patterns(*_NOT_SOURCE, *_NOT_SOURCE_GLOBS),
            symlinks=True,
        )
        # docker/'s files ride in the wheel (project.py); deps/ and project/ are a GB of wheels
        skip = shutil.ignore_patterns("deps", "project")
        shutil.copytree(project_dir / "docker", source / "docker", ignore=skip, symlinks=True)
        command = [*pip("wheel"), "--no-deps", "--wheel-dir", str(out_dir), str(source)]
        if _has_build_backend():  # no isolated build env: no index, a second instead of ten
            command.insert(-1, "--no-build-isolation")
        # The same source, the same wheel byte for byte: a build with nothing changed gives
        # the same image ID.
        run_logged(command, what="pip wheel (troupe-rl)", env=reproducible_env())
    [wheel] = [w for w in out_dir.glob("*.whl") if is_project_wheel(w)]
    return wheel


def build_wheelhouse(
    out_dir: Path | str,
    project_dir: Path | str = PROJECT_DIR,
    *,
    gpu: bool = False,
    torch_index: str | None = None,
    extras: Sequence[str] = DEFAULT_EXTRAS,
    requirements: Sequence[str] = (),
) -> list[Path]:
    """Every wheel an image needs in one folder (``troupe image wheelhouse``, to carry to an
    air-gapped machine); returns them. Raises :class:`WheelhouseError` if pip fails or
    :func:`.wheel_checks.wheelhouse_problems` finds anything."""
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("troupe_rl-*.whl"):
        stale.unlink()
    made = fresh_wheels(
        out,
        Path(project_dir),
        gpu=gpu,
        torch_index=torch_index,
        extras=extras,
        requirements=requirements,
    )
    for wheel in [*made.dependencies, *made.user]:
        link_or_copy(wheel, out / wheel.name)
    (out / USER_WHEELS).write_text("".join(f"{w.name}\n" for w in made.user))
    wheels = sorted(out.glob("*.whl"))
    check_wheels(wheels, gpu=gpu, where=out)
    size = sum(w.stat().st_size for w in wheels) / 2**20
    logger.info("wheelhouse ready: %d wheels, %.0f MiB", len(wheels), size)
    return wheels


def fresh_wheels(
    out_dir: Path,
    project_dir: Path = PROJECT_DIR,
    *,
    gpu: bool,
    torch_index: str | None = None,
    refresh: bool = False,
    extras: Sequence[str] = DEFAULT_EXTRAS,
    requirements: Sequence[str] = (),
) -> Wheelhouse:
    """The cached dependencies (with those of ``extras``), a project wheel built into
    ``out_dir``, and the wheels ``requirements`` add to both. Those are resolved with the
    dependencies pinned (:func:`.user_requirements.user_wheels`); where they need other
    versions of them, everything is resolved in one set and the dependency layer rebuilt."""
    deps = dependency_wheels(
        project_dir, gpu=gpu, torch_index=torch_index, refresh=refresh, extras=extras
    )
    ours = project_wheel(out_dir, project_dir)
    user = user_wheels(requirements, image=[*deps, ours])
    if user is None:
        logger.info(
            "the --pip packages need other versions of the image's own dependencies: they are "
            "resolved together, and the dependency layer is built again (minutes)"
        )
        user = []
        deps = dependency_wheels(
            project_dir,
            gpu=gpu,
            torch_index=torch_index,
            refresh=refresh,
            extras=extras,
            requirements=requirements,
        )
    return Wheelhouse(deps, ours, user)


def make_wheelhouse(
    scratch: Path,
    *,
    wheelhouse: Path | None,
    gpu: bool,
    torch_index: str | None = None,
    refresh: bool = False,
    extras: Sequence[str] = DEFAULT_EXTRAS,
    requirements: Sequence[str] = (),
) -> Wheelhouse:
    """The wheels of one image build: from ``wheelhouse`` (a folder the user made) when given,
    else :func:`fresh_wheels` made into ``scratch``."""
    if wheelhouse is None:
        made = fresh_wheels(
            scratch,
            gpu=gpu,
            torch_index=torch_index,
            refresh=refresh,
            extras=extras,
            requirements=requirements,
        )
        check_wheels(made.all, gpu=gpu, where=scratch)
        return made
    wheels = sorted(Path(wheelhouse).glob("*.whl"))
    if not wheels:
        raise WheelhouseError(
            f"{wheelhouse} holds no wheels: make them with `troupe image wheelhouse {wheelhouse}`"
        )
    check_wheels(wheels, gpu=gpu, where=Path(wheelhouse))
    [project] = [w for w in wheels if is_project_wheel(w)]
    user = _listed_user_wheels(Path(wheelhouse))
    rest = [w for w in wheels if w is not project and w not in user]
    return Wheelhouse(rest, project, user)


def _listed_user_wheels(wheelhouse: Path) -> list[Path]:
    """The wheels :data:`USER_WHEELS` names in ``wheelhouse`` (none where it has no such file:
    one made by hand, or before the file was written)."""
    listed = wheelhouse / USER_WHEELS
    if not listed.exists():
        return []
    names = listed.read_text().split()
    missing = [n for n in names if not (wheelhouse / n).is_file()]
    if missing:
        raise WheelhouseError(
            f"{listed} names wheels the folder does not hold ({', '.join(missing)}): make it "
            f"again with `troupe image wheelhouse {wheelhouse} --pip ...`"
        )
    return [wheelhouse / n for n in names]


# --------------------------------------------------------------------- helpers
def link_or_copy(source: Path, target: Path) -> None:
    """Hard-link (same file system) or copy; an existing target is replaced."""
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _check_python() -> None:
    if sys.version_info[:2] != IMAGE_PYTHON:
        version = ".".join(map(str, IMAGE_PYTHON))
        raise WheelhouseError(
            f"this is Python {sys.version_info[0]}.{sys.version_info[1]}, but the image runs "
            f"Python {version}: run troupe from a Python {version} venv to build the wheelhouse"
        )


def _has_build_backend() -> bool:
    """setuptools >= 68 in this interpreter, as ``[build-system]`` asks for."""
    try:
        from importlib.metadata import version

        return int(version("setuptools").split(".")[0]) >= 68
    except Exception:  # not installed, or an unusual version string: let pip isolate the build
        return False
