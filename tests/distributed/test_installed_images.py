"""An image build from a Troupe installed out of a wheel, not a checkout (distributed/images/
project.py): the Dockerfiles found, the requirements read from the metadata, the project wheel
packed from the installed files. The wheel is the real one, built from this checkout and
installed with pip into a folder of its own; a Python started there knows no checkout."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from distributed.images import project, wheelhouse

ROOT = Path(__file__).resolve().parents[2]
PIP_INSTALL = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target"]

# Run in the installed Troupe: what it finds, as JSON on stdout.
PROBE = """
import json, sys
from pathlib import Path
from distributed.errors import WheelhouseError
from distributed.images import build, project, wheelhouse
out = Path(sys.argv[1])
try:
    wheelhouse.project_dependencies(extras=["nonesuch"])
    unknown = None
except WheelhouseError as e:
    unknown = str(e)
print(json.dumps({
    "home": str(project.CHECKOUT_DIR),
    "checkout": project.is_checkout(),
    "docker_dir": str(build.DOCKER_DIR),
    "make_base_hint": build.MAKE_BASE_HINT,
    "requirements": {
        ",".join(extras): wheelhouse.project_dependencies(extras=extras)
        for extras in [(), ("atari", "multiagent"), ("mpe",), ("test",)]
    },
    "unknown_extra": unknown,
    "wheels": [str(wheelhouse.project_wheel(out / str(i))) for i in range(2)],
}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The project wheel built from this checkout, installed by pip into ``site/``; the probe's
    findings there."""
    tmp = tmp_path_factory.mktemp("installed")
    built = wheelhouse.project_wheel(tmp / "built")
    site = tmp / "site"
    subprocess.run(
        [*PIP_INSTALL, str(site), built],
        check=True,
        capture_output=True,
    )
    # The installed Troupe first; this environment's packages (torch, zmq...) after it. Run
    # from tmp: the checkout must not be on the path.
    deps = [p for p in sys.path if p.endswith("site-packages")]
    env = {"PYTHONPATH": ":".join([str(site), *deps]), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp / "packed")],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {"built": built, "site": site, **json.loads(done.stdout)}


def test_the_installed_troupe_is_not_a_checkout(installed):
    assert installed["home"] == str(installed["site"])
    assert installed["checkout"] is False


def test_the_dockerfiles_come_with_the_wheel(installed):
    docker_dir = Path(installed["docker_dir"])
    assert docker_dir == installed["site"] / "distributed" / "images" / "dockerfiles"
    for name in ("Dockerfile", "Dockerfile.gpu", ".dockerignore", "make-base-image.sh"):
        assert (docker_dir / name).read_bytes() == (ROOT / "docker" / name).read_bytes()
    assert (docker_dir / "make-base-image.sh").stat().st_mode & 0o100
    # the hint names the script where it is, not a path relative to site-packages
    assert f"{docker_dir / 'make-base-image.sh'}`" in installed["make_base_hint"]


def _normalised(requirements: list[str]) -> list[str]:
    from packaging.requirements import Requirement

    return sorted(str(Requirement(r)) for r in requirements)


@pytest.mark.parametrize("extras", ["", "atari,multiagent", "mpe", "test"])
def test_the_requirements_are_the_checkouts(installed, extras):
    """The metadata setuptools wrote says what pyproject.toml says, extras of extras too."""
    from_metadata = installed["requirements"][extras]
    from_pyproject = wheelhouse.project_dependencies(ROOT, extras.split(",") if extras else [])
    assert _normalised(from_metadata) == _normalised(from_pyproject)
    keys = [
        wheelhouse.dependency_key(r, gpu=False, torch_index=None)
        for r in (from_metadata, from_pyproject)
    ]
    assert keys[0] == keys[1]  # the same cached wheels, however the bounds are ordered
    assert not any(r.startswith("troupe-rl") for r in from_metadata)


def test_an_unknown_extra_is_named_with_the_known_ones(installed):
    assert installed["unknown_extra"] == (
        "troupe-rl has no extra 'nonesuch'; it has atari, box2d, k8s, mpe, mujoco, multiagent, "
        "test, video"
    )


def test_the_packed_wheel_holds_what_the_built_one_does(installed):
    packed = Path(installed["wheels"][0])
    assert packed.name == installed["built"].name
    with zipfile.ZipFile(installed["built"]) as b, zipfile.ZipFile(packed) as p:
        assert sorted(p.namelist()) == sorted(b.namelist())
        for name in b.namelist():
            if not name.endswith("RECORD"):
                assert p.read(name) == b.read(name), name
        record = p.read(next(n for n in p.namelist() if n.endswith("RECORD"))).decode()
        rows = [line.split(",") for line in record.splitlines()]
        assert sorted(name for name, _, _ in rows) == sorted(p.namelist())
        for name, digest, size in rows:  # what pip and installers check
            if digest:
                data = p.read(name)
                sha = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                assert (digest, int(size)) == (f"sha256={sha.decode()}", len(data)), name


def test_packing_twice_gives_the_same_bytes(installed):
    """So an image rebuilt from the same installation keeps Docker's cached project layer."""
    first, second = (Path(w).read_bytes() for w in installed["wheels"])
    assert first == second


def test_the_packed_wheel_installs(installed, tmp_path):
    """The image's Dockerfile installs it with pip, as here."""
    subprocess.run(
        [*PIP_INSTALL, str(tmp_path), installed["wheels"][0]],
        check=True,
        capture_output=True,
    )
    assert (tmp_path / "distributed" / "images" / "dockerfiles" / "Dockerfile").is_file()
    assert (tmp_path / "troupe" / "__init__.py").is_file()


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ("numpy>=1.24", ("numpy>=1.24", None)),
        ('ale-py>=0.9; extra == "atari"', ("ale-py>=0.9", "atari")),
        (
            "foo>=1; python_version < \"3.12\" and extra == 'x'",
            ('foo>=1; python_version < "3.12"', "x"),
        ),
        ('bar; extra == "y" and sys_platform == "linux"', ('bar; sys_platform == "linux"', "y")),
        ('qux; os_name == "nt"', ('qux; os_name == "nt"', None)),
    ],
)
def test_a_requirement_is_read_with_its_extra_apart(written, read):
    """Requires-Dist as setuptools writes it: the extra is a clause of the marker."""
    assert project._split(written) == read
