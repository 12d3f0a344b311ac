"""Image builds without an engine: which wheels make an image, errors, the CLI wiring."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import docker
import pytest

from distributed.errors import BaseImageMissingError, DockerUnavailableError, WheelhouseError
from distributed.images import build as images
from distributed.images import project, wheelhouse
from distributed.images.wheel_checks import WheelName, wheelhouse_problems

TROUPE = "troupe_rl-0.1.0-py3-none-any.whl"
CPU_TORCH = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
PYPI_TORCH = "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"
CUBLAS = "nvidia_cublas_cu12-12.4.5.8-py3-none-manylinux2014_x86_64.whl"
# What `pip wheel` made on the CI machine, less the pure-Python majority.
CPU_WHEELHOUSE = [
    TROUPE,
    CPU_TORCH,
    "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
    "protobuf-7.36.2-cp310-abi3-manylinux2014_x86_64.whl",
    "tensorboard_data_server-0.7.2-py3-none-manylinux_2_31_x86_64.whl",
    "tzdata-2026.6-py2.py3-none-any.whl",
    "Farama_Notifications-0.0.6-py3-none-any.whl",
]


def test_parse_wheel_name_with_local_version_and_build_tag():
    w = WheelName.parse("Farama_Notifications-0.0.6-1-py2.py3-none-any.whl")
    assert (w.project, w.version) == ("farama-notifications", "0.0.6")
    assert w.python_tags == ("py2", "py3")
    assert WheelName.parse(CPU_TORCH).local_version == "cpu"


def test_parse_refuses_what_is_not_a_wheel():
    with pytest.raises(WheelhouseError) as e:
        WheelName.parse("torch-2.13.0.tar.gz")
    assert str(e.value) == (
        "torch-2.13.0.tar.gz is not a wheel file name (name-version-py-abi-plat)"
    )


def test_cpu_wheelhouse_of_this_machine_makes_a_cpu_image():
    assert wheelhouse_problems(CPU_WHEELHOUSE, gpu=False) == []


def test_pypi_cuda_torch_is_refused_for_a_cpu_image():
    wheels = [TROUPE, PYPI_TORCH, CUBLAS, "triton-3.5.0-cp311-cp311-manylinux_2_28_x86_64.whl"]
    assert wheelhouse_problems(wheels, gpu=False) == [
        f"CUDA wheels in a CPU wheelhouse: {CUBLAS}, triton-3.5.0-cp311-cp311-manylinux_2_28_"
        "x86_64.whl. PyPI's torch for Linux is the CUDA build: pass --torch-index "
        "https://download.pytorch.org/whl/cpu (or a --find-links directory holding a +cpu "
        "torch wheel), and empty the wheelhouse directory first"
    ]


def test_cuda_local_version_is_refused_for_a_cpu_image():
    [problem] = wheelhouse_problems(
        [TROUPE, "torch-2.13.0+cu124-cp311-cp311-linux_x86_64.whl"], gpu=False
    )
    assert problem.startswith(
        "CUDA wheels in a CPU wheelhouse: torch-2.13.0+cu124-cp311-cp311-linux_x86_64.whl. "
    )


def test_gpu_image_takes_cuda_wheels_and_refuses_cpu_torch():
    assert wheelhouse_problems([TROUPE, PYPI_TORCH, CUBLAS], gpu=True) == []
    assert wheelhouse_problems([TROUPE, CPU_TORCH], gpu=True) == [
        f"{CPU_TORCH} is a CPU build of torch: a GPU image needs a CUDA build (pass "
        "--torch-index https://download.pytorch.org/whl/cu124 and keep +cpu wheels out of "
        "pip's find-links)"
    ]


def test_wheels_for_another_python_or_os_are_refused():
    numpy_312 = "numpy-2.4.6-cp312-cp312-manylinux_2_28_x86_64.whl"
    numpy_mac = "numpy-2.4.6-cp311-cp311-macosx_14_0_arm64.whl"
    assert wheelhouse_problems([TROUPE, numpy_312, numpy_mac], gpu=False) == [
        f"{numpy_mac} is built for macosx_14_0_arm64, not Linux: build the wheelhouse on Linux",
        f"{numpy_312} is built for cp312, not Python 3.11 (the image's): build the wheelhouse "
        "with a Python 3.11 interpreter",
    ]


def test_stable_abi_wheels_run_on_later_pythons_only():
    older = "protobuf-7.36.2-cp310-abi3-manylinux2014_x86_64.whl"
    newer = "protobuf-7.36.2-cp312-abi3-manylinux2014_x86_64.whl"
    assert wheelhouse_problems([TROUPE, older], gpu=False) == []
    assert len(wheelhouse_problems([TROUPE, newer], gpu=False)) == 1


def test_a_wheelhouse_without_troupe_is_refused():
    assert wheelhouse_problems([CPU_TORCH], gpu=False) == ["there is no troupe-rl wheel"]


def test_dockerfiles_default_base_images():
    assert images.default_base_image(images.DOCKER_DIR / "Dockerfile") == "python:3.11-slim"
    gpu_base = images.default_base_image(images.DOCKER_DIR / "Dockerfile.gpu")
    assert gpu_base.startswith("nvidia/cuda:")


# --------------------------------------------------------------------- errors, with fakes
class FakeImages:
    """The two calls ensure_base_image makes; nothing is present and every pull fails."""

    def get(self, name):
        raise docker.errors.ImageNotFound(f"No such image: {name}")

    def pull(self, name):
        raise docker.errors.APIError(f"pull access denied for {name}")


class FakeClient:
    images = FakeImages()


AS_ROOT = "" if os.geteuid() == 0 else "sudo "


def test_missing_base_image_says_how_to_make_one():
    with pytest.raises(BaseImageMissingError) as e:
        images.build_image("troupe-test/absent:1", "troupe-test:1", client=FakeClient())
    assert str(e.value) == (
        "base image troupe-test/absent:1 is not present and cannot be pulled (pull access denied "
        "for troupe-test/absent:1): make troupe-base:bookworm-py311 offline (root, debootstrap "
        f"from a Debian mirror, about a minute) with `{AS_ROOT}docker/make-base-image.sh` and "
        "build again, or pass --make-base-image to do both now, or --base-image IMAGE"
    )


def test_without_any_base_image_the_error_names_the_command_that_makes_one():
    with pytest.raises(BaseImageMissingError) as e:
        images.build_image(None, "troupe-test:1", client=FakeClient())
    assert str(e.value).startswith("base image python:3.11-slim is not present and cannot be ")
    assert f"`{AS_ROOT}docker/make-base-image.sh`" in str(e.value)


def test_a_root_shell_is_not_told_to_use_sudo():
    """On a root shell (a container, a CI machine) sudo is often not installed at all."""
    assert ("sudo" in images.MAKE_BASE_HINT) == (os.geteuid() != 0)


def test_empty_wheelhouse_says_how_to_fill_it(tmp_path, monkeypatch):
    monkeypatch.setattr(images, "ensure_base_image", lambda client, base: None)
    with pytest.raises(WheelhouseError) as e:
        images.build_image("base:1", "troupe-test:1", wheelhouse=tmp_path, client=FakeClient())
    assert str(e.value) == (
        f"{tmp_path} holds no wheels: make them with `troupe image wheelhouse {tmp_path}`"
    )


def test_no_engine_says_how_to_start_one(tmp_path, monkeypatch):
    socket = f"unix://{tmp_path}/docker.sock"
    monkeypatch.setenv("DOCKER_HOST", socket)
    with pytest.raises(DockerUnavailableError) as e:
        images.connect()
    message = str(e.value)
    assert message.startswith(f"no Docker engine answers at {socket} (")
    assert message.endswith(
        "): start one (as root, `bash .ci/docker-setup` installs and starts it) or set DOCKER_HOST"
    )


# --------------------------------------------------------------------- troupe image
def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="troupe image")
    images.add_image_arguments(parser)
    return parser.parse_args(argv)


def test_image_build_arguments_reach_build_image(monkeypatch):
    calls = []
    monkeypatch.setattr(images, "build_image", lambda *a, **kw: calls.append((a, kw)) or "sha")
    args = parse("build", "--base-image", "troupe-base:bookworm-py311", "--gpu", "--push")
    assert images.run_image(args, console=_QuietConsole()) == 0
    assert calls == [
        (
            ("troupe-base:bookworm-py311", images.DEFAULT_GPU_TAG),
            {
                "wheelhouse": None,
                "gpu": True,
                "push": True,
                "torch_index": None,
                "make_base": False,
                "refresh_deps": False,
                "extras": None,
                "requirements": [],
            },
        )
    ]


def test_image_build_defaults():
    args = parse("build")
    assert (args.base_image, args.tag, args.gpu, args.push) == (None, None, False, False)
    assert args.extras is None  # build_image's default: DEFAULT_EXTRAS, or a wheelhouse's own
    assert parse("wheelhouse", "out").extras == wheelhouse.DEFAULT_EXTRAS == ("atari", "multiagent")
    assert parse("build", "--extras", "atari, mujoco").extras == ("atari", "mujoco")
    assert parse("build", "--extras", "").extras == ()


def test_an_image_holds_the_packages_of_its_extras():
    """The image held the core dependencies alone: `troupe run pong-ppo --launcher docker`
    failed in every container for want of ale-py, a PettingZoo game for want of PettingZoo."""
    core = wheelhouse.project_dependencies()
    assert not any(r.startswith(("ale-py", "pettingzoo")) for r in core)
    both = wheelhouse.project_dependencies(extras=wheelhouse.DEFAULT_EXTRAS)
    assert both[: len(core)] == core
    assert {r.split(">")[0] for r in both[len(core) :]} >= {"ale-py", "opencv-python-headless",
                                                           "pettingzoo"}  # fmt: skip
    test = wheelhouse.project_dependencies(extras=["test"])  # its troupe-rl[...] expanded
    assert "pettingzoo>=1.24,<2" in test and not any(r.startswith("troupe") for r in test)
    assert len(test) == len(set(test))
    with pytest.raises(WheelhouseError, match="no extra 'atar'; it has atari, "):
        wheelhouse.project_dependencies(extras=["atar"])
    with pytest.raises(images.ImageError, match="make it with them"):
        images.build_image(None, "t", wheelhouse="/nowhere", extras=["atari"])


class _QuietConsole:
    def print(self, *args, **kwargs):
        pass


# --------------------------------------------------------------------- the two parts
def test_the_project_wheel_is_built_out_of_tree(tmp_path):
    before = sorted(p.name for p in wheelhouse.PROJECT_DIR.iterdir())
    wheel = wheelhouse.project_wheel(tmp_path)
    assert wheel.name == "troupe_rl-0.1.0-py3-none-any.whl"
    assert sorted(p.name for p in wheelhouse.PROJECT_DIR.iterdir()) == before
    assert not (wheelhouse.PROJECT_DIR / "build").exists()


def test_the_dependency_cache_key_follows_what_picks_the_wheels(monkeypatch):
    reqs = wheelhouse.project_dependencies()
    assert "torch>=2.2,<2.14" in reqs and not any(r.startswith("troupe") for r in reqs)
    key = wheelhouse.dependency_key(reqs, gpu=False, torch_index=None)
    assert key == wheelhouse.dependency_key(list(reversed(reqs)), gpu=False, torch_index=None)
    others = {
        wheelhouse.dependency_key(reqs, gpu=True, torch_index=None),
        wheelhouse.dependency_key(reqs, gpu=False, torch_index=images.CPU_TORCH_INDEX),
        wheelhouse.dependency_key([*reqs, "scipy"], gpu=False, torch_index=None),
    }
    assert key not in others and len(others) == 3
    written_otherwise = [  # as an installed Troupe's metadata, or a hand, writes them
        "torch<2.14,>=2.2" if r == "torch>=2.2,<2.14" else r.replace(">=", " >= ").upper()
        for r in reqs
    ]
    assert key == wheelhouse.dependency_key(written_otherwise, gpu=False, torch_index=None)
    monkeypatch.setenv("TROUPE_CACHE_DIR", "/somewhere")
    assert wheelhouse.cache_root() == Path("/somewhere")


@pytest.mark.parametrize(
    "written, canonical",
    [
        ("torch<2.14,>=2.2", "torch<2.14,>=2.2"),
        (" Torch >= 2.2 , < 2.14 ", "torch<2.14,>=2.2"),
        ("ale_py[B, a]>=0.9; python_version < '3.13'", 'ale-py[a,b]>=0.9;python_version<"3.13"'),
        ("./my_envs[extra]", "./my_envs[extra]"),
        ("/abs/my_envs", "/abs/my_envs"),
        ("pkg @ https://example.org/pkg.whl", "pkg @ https://example.org/pkg.whl"),
    ],
)
def test_a_requirement_is_keyed_however_it_is_written(written, canonical):
    assert project.canonical_requirement(written) == canonical
