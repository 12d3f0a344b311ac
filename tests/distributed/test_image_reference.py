"""An image reference Docker cannot take is refused by the command line, before a run folder
is made or the engine is asked: it ended in docker's "invalid reference format" traceback."""

from __future__ import annotations

import argparse

import pytest

import troupe
from api.errors import UserError
from distributed.cli import main
from distributed.images.pinning import image_reference

GOOD = [
    "troupe-worker:latest",
    "troupe-worker:id-61852fdf2d1d",
    "localhost:5000/troupe-worker:1.0",
    "registry.example.com/team/troupe_worker__gpu",
    "troupe-worker@sha256:" + "a" * 64,
]
BAD = ["Troupe-Worker:Latest", "bad tag!", "troupe:a:b", ":latest", "troupe-worker:"]


@pytest.mark.parametrize("reference", GOOD)
def test_references_docker_takes_are_taken(reference):
    assert image_reference(reference) == reference


@pytest.mark.parametrize("reference", BAD)
def test_references_docker_refuses_are_refused(reference):
    with pytest.raises(argparse.ArgumentTypeError, match="is not an image reference"):
        image_reference(reference)


def test_upper_case_names_are_said_to_be_the_problem():
    with pytest.raises(argparse.ArgumentTypeError, match=r"\(names are lower case\)"):
        image_reference("Troupe-Worker:Latest")


def test_the_commands_refuse_a_bad_image_before_making_anything(tmp_path, capsys):
    run_dir = tmp_path / "run"
    for argv in (
        ["image", "build", "--tag", "Troupe-Worker:Latest"],
        ["run", "cartpole-ppo", "--launcher", "docker", "--image", "bad tag!",
         "--run-dir", str(run_dir)],
        ["deploy", "swarm", "cartpole-ppo", "--image", "bad tag!"],
        ["deploy", "k8s", "cartpole-ppo", "--image", "bad tag!", "--out", str(tmp_path / "k")],
    ):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2, argv
        assert "is not an image reference" in capsys.readouterr().err, argv
    assert not run_dir.exists()
    with pytest.raises(UserError, match="image: 'bad tag!' is not an image reference"):
        troupe.train("cartpole-ppo", launcher="docker", image="bad tag!", run_dir=run_dir)
    assert not run_dir.exists()
