"""Troupe itself, as an image build takes it: from a checkout, or from an installation.

From a checkout, ``troupe image build`` reads ``pyproject.toml`` for the requirements, builds
the project wheel from the source and stages ``docker/Dockerfile``. A Troupe installed without
its checkout (``pip install troupe-rl``, ``pip install git+...``, a wheel) has none of the three:
the build said ``cannot use .../site-packages/docker/Dockerfile`` and no image could be made,
though building images is the fourth step of every user's path. There the same three come
from the installation:

- the Dockerfiles ship in the wheel as ``distributed/images/dockerfiles/`` (``pyproject.toml``
  maps that package to ``docker/``), found by :func:`docker_dir`;
- the requirements, and each extra's, are the distribution's ``Requires-Dist`` metadata, which
  setuptools wrote from ``pyproject.toml`` (:func:`project_dependencies`);
- the project wheel is the installed files packed again (:func:`installed_wheel`), with fixed
  times, so the same installation gives the same wheel byte for byte and Docker's cache keeps
  the image's project layer.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path

from distributed.errors import WheelhouseError

PROJECT = "troupe-rl"
CHECKOUT_DIR = Path(__file__).resolve().parents[2]
"""The folder above the packages: a checkout (with ``pyproject.toml``) or site-packages."""
SHIPPED_DOCKER_DIR = Path(__file__).resolve().parent / "dockerfiles"
"""Where a wheel puts ``docker/``'s files (absent in a checkout or an editable install)."""
_DIST_INFO_KEPT = ("METADATA", "WHEEL", "entry_points.txt", "top_level.txt")
"""The metadata files a wheel carries; RECORD is written afresh, INSTALLER and the like are
pip's notes about this installation."""
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def is_checkout(folder: Path = CHECKOUT_DIR) -> bool:
    """Whether ``folder`` is Troupe's source tree (an editable install's too)."""
    return (folder / "pyproject.toml").is_file()


def docker_dir() -> Path:
    """The folder of the Dockerfiles and ``make-base-image.sh``: the checkout's ``docker/``, else
    the copy the wheel installed. (``site-packages/docker`` is the Docker SDK, not ours.)"""
    if (CHECKOUT_DIR / "docker" / "Dockerfile").is_file():
        return CHECKOUT_DIR / "docker"
    return SHIPPED_DOCKER_DIR


def _distribution() -> importlib.metadata.Distribution:
    try:
        return importlib.metadata.distribution(PROJECT)
    except importlib.metadata.PackageNotFoundError as e:
        raise WheelhouseError(
            f"no pyproject.toml in {CHECKOUT_DIR} and no installed {PROJECT} distribution: run "
            "troupe image from a Troupe checkout, or install Troupe with pip"
        ) from e


def _split(requirement: str) -> tuple[str, str | None]:
    """``spec; marker`` to the requirement without its ``extra == "x"`` clause and ``x``."""
    spec, _, marker = requirement.partition(";")
    found = _EXTRA_MARKER.search(marker)
    if found is None:
        return requirement.strip(), None
    rest = (marker[: found.start()] + marker[found.end() :]).strip()
    rest = re.sub(r"^and\s+|\s+and$", "", rest).strip()
    return (f"{spec.strip()}; {rest}" if rest else spec.strip()), found.group(1)


_REQUIREMENT = re.compile(
    r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?\s*([^;@]*?)\s*(?:;\s*(.*?))?\s*"
)


def canonical_requirement(requirement: str) -> str:
    """``requirement`` written one way (the name normalised, extras and version clauses sorted,
    no spaces, one kind of quote), for the cache key alone: a checkout's ``pyproject.toml`` says
    ``torch>=2.2,<2.14`` where an installed Troupe's metadata says ``torch<2.14,>=2.2``, and the
    same wheels were made twice under two keys. A path or URL is kept as written."""
    match = _REQUIREMENT.fullmatch(requirement)
    if match is None:
        return requirement
    name, extras, versions, marker = match.groups()
    name = re.sub(r"[-_.]+", "-", name).lower()
    extras = ",".join(sorted(e.strip().lower() for e in (extras or "").split(",") if e.strip()))
    versions = ",".join(sorted(re.sub(r"\s+", "", v) for v in versions.split(",") if v.strip()))
    marker = re.sub(r"\s+", "", (marker or "").replace("'", '"'))
    return name + (f"[{extras}]" if extras else "") + versions + (f";{marker}" if marker else "")


def project_dependencies(project_dir: Path = CHECKOUT_DIR, extras: Sequence[str] = ()) -> list[str]:
    """``[project].dependencies`` of ``pyproject.toml``, and the requirements of each of
    ``extras`` (``atari``, ``multiagent``: its ``[project.optional-dependencies]``, an extra that
    names others, ``troupe-rl[video]``, with theirs): what the image installs besides us. The
    image held the first alone, so ``pong-ppo`` failed in every container for want of ale-py.
    Troupe installed from a wheel: the same from its metadata. Raises
    :class:`WheelhouseError` for an extra the project does not have."""
    if project_dir == CHECKOUT_DIR and not is_checkout(project_dir):
        core, optional = _installed_requirements()
    else:
        import tomllib  # Python 3.11+, as every image build is (wheelhouse._check_python)

        with open(project_dir / "pyproject.toml", "rb") as f:
            declared = tomllib.load(f)["project"]
        core, optional = declared["dependencies"], declared.get("optional-dependencies", {})
    requirements, pending, seen = list(core), list(extras), set()
    while pending:
        extra = pending.pop(0)
        if extra in seen:
            continue
        if extra not in optional:
            known = ", ".join(sorted(optional))
            raise WheelhouseError(f"{PROJECT} has no extra '{extra}'; it has {known}")
        seen.add(extra)
        for requirement in optional[extra]:
            own = re.fullmatch(rf"{re.escape(PROJECT)}\[([^\]]+)\]", requirement.strip())
            if own:  # an extra made of others of ours
                pending += [e.strip() for e in own.group(1).split(",")]
            elif requirement not in requirements:
                requirements.append(requirement)
    return requirements


def _installed_requirements() -> tuple[list[str], dict[str, list[str]]]:
    """The installed distribution's requirements: those of no extra, and each extra's."""
    dist = _distribution()
    optional: dict[str, list[str]] = {e: [] for e in dist.metadata.get_all("Provides-Extra") or []}
    core: list[str] = []
    for requirement in dist.requires or []:
        spec, extra = _split(requirement)
        (core if extra is None else optional.setdefault(extra, [])).append(spec)
    return core, optional


def installed_wheel(out_dir: Path) -> Path:
    """Pack the installed distribution's files into a wheel in ``out_dir``; returns it."""
    dist = _distribution()
    root = Path(dist.locate_file(""))
    listed = dist.files or []
    info = next(
        (
            f.parts[0]
            for f in listed
            if f.parts[1:] == ("METADATA",) and f.parts[0].endswith(".dist-info")
        ),
        None,
    )
    packages = set((dist.read_text("top_level.txt") or "").split())
    if info is None or not packages:  # no RECORD or top_level.txt: not installed by pip
        raise WheelhouseError(
            f"the installed {PROJECT} at {root} does not list its files and packages (RECORD, "
            "top_level.txt): install it with pip, or build the image from a Troupe checkout"
        )
    tag = next(
        (line.split(":", 1)[1].strip() for line in (dist.read_text("WHEEL") or "").splitlines()
         if line.startswith("Tag:")),
        "py3-none-any",
    )  # fmt: skip
    files = sorted({str(f) for f in listed if _belongs_in_wheel(f.parts, info, packages)})
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{info.removesuffix('.dist-info')}-{tag}.whl"
    record = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in files:
            data = (root / name).read_bytes()
            executable = (root / name).stat().st_mode & 0o111
            _write(zf, name, data, 0o755 if executable else 0o644)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{name},sha256={digest.decode()},{len(data)}")
        record.append(f"{info}/RECORD,,")
        _write(zf, f"{info}/RECORD", ("\n".join(record) + "\n").encode(), 0o644)
    return wheel


def _belongs_in_wheel(parts: Sequence[str], info: str, packages: set[str]) -> bool:
    """The packages' files and the wheel's own metadata: not the ``troupe`` script (in ``bin/``
    or ``../bin/``), bytecode, or pip's notes about the installation."""
    if not parts or "__pycache__" in parts or parts[-1].endswith(".pyc"):
        return False
    if parts[0] == info:
        return len(parts) == 2 and parts[1] in _DIST_INFO_KEPT
    return parts[0] in packages and len(parts) > 1


def _write(zf: zipfile.ZipFile, name: str, data: bytes, mode: int) -> None:
    entry = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
    entry.compress_type = zipfile.ZIP_DEFLATED
    entry.external_attr = (0o100000 | mode) << 16
    zf.writestr(entry, data)
