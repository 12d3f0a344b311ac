"""Packages of the user's own in a worker image (``troupe image build --pip``,
distributed/images/user_requirements.py): read, refused where wrong, and made into wheels by
pip with the image's other dependencies."""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from distributed.errors import WheelhouseError
from distributed.images import build as images
from distributed.images import wheelhouse
from distributed.images.pip_calls import COMPLETE
from distributed.images.user_requirements import (
    local_paths,
    read_requirements,
    user_wheels,
    with_user_requirements,
)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="troupe image")
    images.add_image_arguments(parser)
    return parser.parse_args(argv)


class _QuietConsole:
    def print(self, *args, **kwargs):
        pass


def test_pip_and_requirements_files_reach_the_build_and_the_wheelhouse(tmp_path, monkeypatch):
    listed = tmp_path / "requirements.txt"
    listed.write_text("# my environments\nminigrid>=2.3  # the grid worlds\n\nhighway-env\n")
    calls = []
    monkeypatch.setattr(images, "build_image", lambda *a, **kw: calls.append(kw) or "sha")
    monkeypatch.setattr(images, "build_wheelhouse", lambda *a, **kw: calls.append(kw) or [])
    argv = ["--pip", "procgen", "--requirements", str(listed), "--pip", "./my_pkg"]
    assert images.run_image(parse("build", *argv), console=_QuietConsole()) == 0
    assert images.run_image(parse("wheelhouse", "out", *argv), console=_QuietConsole()) == 0
    wanted = ["procgen", "./my_pkg", "minigrid>=2.3", "highway-env"]
    assert [c["requirements"] for c in calls] == [wanted, wanted]


def test_a_requirements_file_holds_requirements_only(tmp_path):
    listed = tmp_path / "req.txt"
    listed.write_text("minigrid\n--index-url https://example.org/simple\n")
    with pytest.raises(WheelhouseError) as e:
        read_requirements(listed)
    assert str(e.value) == (
        f"{listed}:2: '--index-url https://example.org/simple': only requirements, one a line "
        "(pip's options belong in its configuration, pip config or PIP_* variables)"
    )
    with pytest.raises(WheelhouseError, match=r"cannot read the requirements file .*nowhere"):
        read_requirements(tmp_path / "nowhere.txt")


@pytest.mark.parametrize("resolve", [with_user_requirements, user_wheels], ids=["joint", "apart"])
def test_troupe_itself_is_refused_and_its_extras_named(resolve):
    with pytest.raises(WheelhouseError) as e:
        if resolve is user_wheels:
            user_wheels(["troupe-rl[mujoco,box2d]"], image=[])
        else:
            with_user_requirements([], ["troupe-rl[mujoco,box2d]"])
    assert str(e.value) == (
        "--pip troupe-rl[mujoco,box2d]: the image holds this Troupe already; its extras are "
        "chosen with --extras mujoco,box2d"
    )


def test_a_path_that_names_nothing_is_refused(tmp_path, monkeypatch, links):
    """Refused where a build resolves the user's requirements, before pip says `Invalid
    requirement ... (from line 1 of .../requirements.txt)` of a file the user never wrote."""
    monkeypatch.chdir(tmp_path)
    project = _project(tmp_path / "p")
    with pytest.raises(WheelhouseError) as e:
        wheelhouse.fresh_wheels(
            tmp_path / "out", project, gpu=False, extras=(), requirements=["./my_envs[extra]"]
        )
    assert str(e.value) == f"--pip ./my_envs[extra]: there is no folder or file {tmp_path}/my_envs"


def test_a_local_path_is_made_absolute_and_a_name_is_left_alone(tmp_path, monkeypatch):
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "minigrid").mkdir()  # a folder of that name: pip would still take the name
    monkeypatch.chdir(tmp_path)
    user = ["./my_pkg[extra]", "minigrid", "numpy>=1.24"]
    assert with_user_requirements(["numpy>=1.24"], user) == [
        "numpy>=1.24",
        f"{tmp_path}/my_pkg[extra]",
        "minigrid",
    ]
    assert local_paths(user) == ["./my_pkg[extra]"]


def test_a_build_with_the_pip_option_is_refused_with_a_wheelhouse():
    with pytest.raises(images.ImageError, match="make it with them"):
        images.build_image(None, "t", wheelhouse="/nowhere", requirements=["minigrid"])


def _wheel(
    folder: Path, name: str, version: str, value: int, requires: tuple[str, ...] = ()
) -> Path:
    """A pure-Python wheel of one module, made by hand: pip takes it with no build, no index."""
    info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        f"{name}.py": f"VALUE = {value}\n".encode(),
        f"{info}/METADATA": metadata.encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = [f"{n},sha256={_digest(d)},{len(d)}" for n, d in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)
    return path


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _project(folder: Path, *requires: str) -> Path:
    """A stand-in checkout of troupe-rl with these requirements and no code: pip builds its
    wheel in a second, as it builds the real one."""
    (folder / "docker").mkdir(parents=True)
    dependencies = ", ".join(f'"{r}"' for r in requires)
    (folder / "pyproject.toml").write_text(
        f'[project]\nname = "troupe-rl"\nversion = "0"\ndependencies = [{dependencies}]\n'
        "[tool.setuptools]\npackages = []\n"
    )
    return folder


@pytest.fixture
def links(tmp_path, monkeypatch) -> Path:
    """A folder of hand-made wheels, pip's only source (an empty cache of our own, no index)."""
    monkeypatch.setenv("TROUPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "links"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_CONSTRAINT", "")
    return tmp_path / "links"


def test_the_users_wheels_are_what_they_add_with_the_dependencies_pinned(tmp_path, links):
    """``my_envs`` needs ``my_base``, which the image holds at 1.0 though 2.0 is there: the
    user's wheels are ``my_envs`` and ``my_extra`` only, made to go on the image's 1.0."""
    _wheel(links, "my_base", "1.0", value=1)
    _wheel(links, "my_base", "2.0", value=2)
    _wheel(links, "my_extra", "1.0", value=3)
    user = _wheel(tmp_path / "mine", "my_envs", "1.0", value=4, requires=("my_base", "my_extra"))
    made = wheelhouse.fresh_wheels(
        tmp_path / "out",
        _project(tmp_path / "p", "my_base<2"),
        gpu=False,
        extras=(),
        requirements=[str(user)],
    )
    assert [w.name for w in made.dependencies] == ["my_base-1.0-py3-none-any.whl"]
    assert [w.name for w in made.user] == [
        "my_envs-1.0-py3-none-any.whl",
        "my_extra-1.0-py3-none-any.whl",
    ]
    assert made.project.name.startswith("troupe_rl-0-")
    assert made.dependencies[0].parent != made.user[0].parent  # the dependency set is not new


def test_a_package_that_needs_other_versions_joins_the_dependency_set(tmp_path, links):
    """``my_envs`` needs ``my_base<2`` where the image would hold 2.0: resolved together, the
    image's dependencies are the other version, and the user's wheel is among them."""
    _wheel(links, "my_base", "1.0", value=1)
    _wheel(links, "my_base", "2.0", value=2)
    user = _wheel(tmp_path / "mine", "my_envs", "1.0", value=4, requires=("my_base<2",))
    project = _project(tmp_path / "p", "my_base")
    alone = wheelhouse.fresh_wheels(tmp_path / "out", project, gpu=False, extras=())
    assert [w.name for w in alone.dependencies] == ["my_base-2.0-py3-none-any.whl"]
    made = wheelhouse.fresh_wheels(
        tmp_path / "out", project, gpu=False, extras=(), requirements=[str(user)]
    )
    assert made.user == []
    assert [w.name for w in made.dependencies] == [
        "my_base-1.0-py3-none-any.whl",
        "my_envs-1.0-py3-none-any.whl",
    ]


def test_a_local_wheel_is_made_again_and_a_named_package_is_cached(tmp_path, links):
    _wheel(links, "my_extra", "1.0", value=3)
    user = _wheel(tmp_path / "mine", "my_envs", "1.0", value=1)
    project = _project(tmp_path / "p")
    made = wheelhouse.fresh_wheels(
        tmp_path / "out", project, gpu=False, extras=(), requirements=[str(user), "my_extra"]
    )
    folder = made.user[0].parent
    assert json.loads((folder / COMPLETE).read_text())[0] == [str(user), "my_extra"]

    _wheel(tmp_path / "mine", "my_envs", "1.0", value=2)  # changed code under the same name
    made = wheelhouse.fresh_wheels(
        tmp_path / "out", project, gpu=False, extras=(), requirements=[str(user), "my_extra"]
    )
    with zipfile.ZipFile(made.user[0]) as zf:
        assert zf.read("my_envs.py") == b"VALUE = 2\n"

    first = user_wheels(["my_extra"], image=[made.project])
    (links / "my_extra-1.0-py3-none-any.whl").unlink()  # a name alone: from the cache
    assert user_wheels(["my_extra"], image=[made.project]) == first
    assert [w.name for w in first] == ["my_extra-1.0-py3-none-any.whl"]


def test_pip_makes_the_users_wheels_with_the_others_and_remakes_a_local_one(tmp_path, monkeypatch):
    """The joint set (where the pins do not hold): a project with no dependencies of its own,
    so that pip makes only the user's wheel."""
    monkeypatch.setenv("TROUPE_CACHE_DIR", str(tmp_path / "cache"))
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "troupe-rl"\nversion = "0"\ndependencies = []\n'
    )
    user = _wheel(tmp_path, "my_envs", "1.0", value=1)
    wheels = wheelhouse.dependency_wheels(project, requirements=[str(user)])
    assert [w.name for w in wheels] == [user.name]
    folder = wheels[0].parent
    assert json.loads((folder / wheelhouse.COMPLETE).read_text()) == [str(user)]
    assert folder.name != wheelhouse.dependency_key([], gpu=False, torch_index=None)

    _wheel(tmp_path, "my_envs", "1.0", value=2)  # changed code under the same name
    [again] = wheelhouse.dependency_wheels(project, requirements=[str(user)])
    with zipfile.ZipFile(again) as zf:
        assert zf.read("my_envs.py") == b"VALUE = 2\n"


def test_a_wheelhouse_names_the_users_wheels_and_a_build_from_it_keeps_them_apart(tmp_path, links):
    """`troupe image wheelhouse DIR --pip ...` carried to another machine: a build from it puts
    the user's wheels in the project layer, as a build that made them would."""
    _wheel(links, "my_base", "1.0", value=1)
    user = _wheel(tmp_path / "mine", "my_envs", "1.0", value=4, requires=("my_base",))
    out = tmp_path / "wheelhouse"
    project = _project(tmp_path / "p", "my_base")
    wheelhouse.build_wheelhouse(out, project, extras=(), requirements=[str(user)])
    assert (out / wheelhouse.USER_WHEELS).read_text() == "my_envs-1.0-py3-none-any.whl\n"
    taken = wheelhouse.make_wheelhouse(tmp_path / "scratch", wheelhouse=out, gpu=False)
    assert [w.name for w in taken.user] == ["my_envs-1.0-py3-none-any.whl"]
    assert [w.name for w in taken.dependencies] == ["my_base-1.0-py3-none-any.whl"]

    (out / "my_envs-1.0-py3-none-any.whl").unlink()
    with pytest.raises(WheelhouseError, match=r"names wheels the folder does not hold \(my_envs"):
        wheelhouse.make_wheelhouse(tmp_path / "scratch", wheelhouse=out, gpu=False)
    (out / wheelhouse.USER_WHEELS).unlink()  # a wheelhouse made by hand: every wheel below
    taken = wheelhouse.make_wheelhouse(tmp_path / "scratch", wheelhouse=out, gpu=False)
    assert taken.user == [] and len(taken.dependencies) == 1
