"""Packages of the user's own in a worker image: ``troupe image build --pip minigrid``.

An environment that needs a package Troupe does not bring (``minigrid``, ``highway-env``, a
package of the user's own) could not be built in any worker image: ``--extras`` names only
troupe-rl's own extras, ``--add`` adds Python files, not installed packages; only a wheelhouse
made by hand or a Dockerfile of one's own on top of the image could. The requirements given
with ``--pip`` (or a file of them, ``--requirements``) now join the image's dependencies: pip
makes their wheels on this machine with the others (cached under a key that names them), and
the image's dependency stage installs them with the rest, offline.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from distributed.errors import WheelhouseError

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
    """``project``'s requirements, then each of ``user`` not among them. Troupe itself is
    refused: the image's troupe-rl is the one this command builds, its extras are ``--extras``."""
    for requirement in user:
        ours = _OURS.fullmatch(requirement)
        if ours:
            extras = ours.group(2) or ""
            raise WheelhouseError(
                f"--pip {requirement}: the image holds this Troupe already"
                + (f"; its extras are chosen with --extras {extras}" if extras else "")
            )
    user = [_absolute(r) for r in user]  # pip would take them from its working folder
    return [*project, *(r for r in user if r not in project)]


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
