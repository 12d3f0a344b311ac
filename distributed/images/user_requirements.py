"""Packages of the user's own in a worker image: ``troupe image build --pip minigrid``.

An environment that needs a package Troupe does not bring (``minigrid``, ``highway-env``, a
package of the user's own) could not be built in any worker image: ``--extras`` names only
troupe-rl's own extras, ``--add`` adds Python files, not installed packages; only a wheelhouse
made by hand or a Dockerfile of one's own on top of the image could. The requirements given
with ``--pip`` (or a file of them, ``--requirements``) now make wheels on this machine
(:func:`user_wheels`), resolved with the image's dependencies pinned to the versions it holds,
and the image installs the wheels they add in its small project layer, offline. They first
joined the dependency set itself, so each change to a package of one's own rebuilt the
dependency layer of a gigabyte (minutes); now it rebuilds the project layer (seconds).
A package that needs other versions of the image's dependencies (``--pip 'numpy<2'``) still
joins the set: the dependency layer must then change anyway.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from distributed.errors import WheelhouseError
from distributed.images.pip_calls import COMPLETE, cache_root, pip, reproducible_env, run_logged

_OURS = re.compile(r"\s*troupe[-_.]rl\s*(\[([^\]]*)\])?", re.IGNORECASE)


def read_requirements(path: Path) -> list[str]:
    """The requirements of a pip requirements file, one a line, comments and blank lines
    skipped. An option line (``-r``, ``--index-url``) is refused: pip's own configuration says
    where packages come from, and the requirements alone name the cached wheels."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise WheelhouseError(f"cannot read the requirements file {path}: {e.strerror}") from e
    requirements = []
    for number, line in enumerate(lines, 1):
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            raise WheelhouseError(
                f"{path}:{number}: '{line}': only requirements, one a line (pip's options belong "
                "in its configuration, pip config or PIP_* variables)"
            )
        requirements.append(line)
    return requirements


def with_user_requirements(project: Sequence[str], user: Sequence[str]) -> list[str]:
    """``project``'s requirements, then each of ``user`` (:func:`check_requirements`) not among
    them, a local path made absolute (pip would take it from its working folder)."""
    check_requirements(user)
    user = [_absolute(r) for r in user]
    return [*project, *(r for r in user if r not in project)]


def check_requirements(user: Sequence[str]) -> None:
    """Refuse Troupe itself (the image's troupe-rl is the one this command builds, its extras
    are ``--extras``) and a path that names nothing (before pip, whose words are of a
    requirements file the user never wrote)."""
    for requirement in user:
        ours = _OURS.fullmatch(requirement)
        if ours:
            extras = ours.group(2) or ""
            raise WheelhouseError(
                f"--pip {requirement}: the image holds this Troupe already"
                + (f"; its extras are chosen with --extras {extras}" if extras else "")
            )
        path = requirement.strip().partition("[")[0].strip()
        if path.startswith(("./", "../", "/")) and not Path(path).exists():
            raise WheelhouseError(
                f"--pip {requirement}: there is no folder or file {Path(path).resolve()}"
            )


def local_paths(user: Sequence[str]) -> list[str]:
    """Those of ``user`` that name a folder or file here (``./my_envs``, a ``.whl``): their
    wheels are made again at every build, since the same name may hold changed code."""
    return [r for r in user if _local(r) is not None]


def _local(requirement: str) -> Path | None:
    """The folder or archive ``requirement`` names, as pip tells a path from a name: one with
    a slash, or an archive's file name, that exists."""
    name = requirement.strip().partition("[")[0].strip()
    if "/" not in name and not name.endswith((".whl", ".tar.gz", ".zip")):
        return None
    return Path(name) if Path(name).exists() else None


def _absolute(requirement: str) -> str:
    """A local path made absolute, its ``[extras]`` kept."""
    path = _local(requirement)
    if path is None:
        return requirement
    _, bracket, extras = requirement.strip().partition("[")
    return str(path.resolve()) + bracket + extras


_CONFLICT = ("ResolutionImpossible", "conflicting dependencies")
"""What pip says when the requirements cannot go with the pinned versions."""


def user_wheels(requirements: Sequence[str], *, image: Sequence[Path]) -> list[Path] | None:
    """The wheels ``requirements`` add to ``image`` (the image's dependency wheels and its
    troupe-rl wheel), made by pip with each of those pinned to its version there: they install
    on top of the image's venv. None where they need another version of one of them: the
    caller then resolves everything together. Cached by requirements and ``image``; a local
    folder or file is made again at every build (the same path may hold changed code)."""
    if not requirements:
        return []
    check_requirements(requirements)
    wanted = [_absolute(r) for r in requirements]
    described = json.dumps([wanted, sorted(w.name for w in image)])
    folder = cache_root() / "user-wheels" / hashlib.sha256(described.encode()).hexdigest()[:16]
    if (folder / COMPLETE).exists() and not local_paths(requirements):
        return sorted(folder.glob("*.whl"))
    folder.parent.mkdir(parents=True, exist_ok=True)
    making = Path(tempfile.mkdtemp(prefix=f"{folder.name}.", dir=folder.parent))
    try:
        if not _pip_wheel(wanted, image, making):
            return None
        for wheel in making.glob("*.whl"):  # pip saves the pinned ones it used here too
            if wheel.name in {w.name for w in image}:
                wheel.unlink()
        (making / COMPLETE).write_text(described + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        making.rename(folder)
    finally:
        shutil.rmtree(making, ignore_errors=True)
    return sorted(folder.glob("*.whl"))


def _pip_wheel(wanted: list[str], image: Sequence[Path], out: Path) -> bool:
    """``pip wheel`` of ``wanted`` into ``out``, ``image``'s wheels pinned and found where they
    lie; False where pip finds no set that keeps the pins."""
    listed, pins = out / "requirements.txt", out / "pins.txt"
    listed.write_text("\n".join(wanted) + "\n")
    pins.write_text("".join(f"{_name_version(w)}\n" for w in image))
    command = [*pip("wheel"), "--wheel-dir", str(out), "-r", str(listed), "-c", str(pins)]
    for where in sorted({w.parent for w in image}):
        command += ["--find-links", str(where)]
    try:
        run_logged(command, what="pip wheel (--pip)", env=reproducible_env())
    except WheelhouseError as e:
        if any(words in str(e) for words in _CONFLICT):
            return False
        raise
    finally:
        listed.unlink()
        pins.unlink()
    return True


def _name_version(wheel: Path) -> str:
    """``name==version`` of a wheel's file name (PEP 427 escapes ``-`` in both)."""
    name, version = wheel.name.split("-")[:2]
    return f"{name}=={version}"
