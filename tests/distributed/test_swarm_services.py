"""``troupe deploy swarm`` and ``troupe run --launcher docker`` without an engine: the services and
containers a run is made of, one per planned worker (``tests/docker`` runs them for real)."""

from __future__ import annotations

import argparse
import types
from pathlib import Path

import pytest

from api.config import make_experiment
from distributed.deploy import swarm
from distributed.deploy.cluster_commands import add_worker_arguments
from distributed.launch import docker_run as dl
from system.roles import Role


@pytest.mark.parametrize("experiment", ["cartpole-dqn", "pendulum-sac"])
def test_an_off_policy_run_gets_a_replay_service_that_restarts_and_mounts_the_run(experiment):
    config = make_experiment(experiment, [])
    specs = {s.worker_id: s for s in swarm.service_roles(config, "r1")}
    replay = specs["replay/default"]
    assert replay.role == "replay" and replay.replicas == 1 and replay.restartable
    assert replay.command[:5] == ["worker", "--id", "replay/default", "--role", "replay"]
    assert replay.labels[dl.LABEL_ROLE] == "replay"
    assert swarm.service_name("r1", "replay/default") == "troupe-r1-replay-default"
    secret = types.SimpleNamespace(id="s1", name="troupe-r1-keys")
    settings = swarm._service_settings(replay, {}, Path("/runs/r1"), secret, "node.role==manager")
    assert settings["restart_policy"]["Condition"] == "on-failure"
    assert [m["Target"] for m in settings["mounts"]] == [dl.CONTAINER_RUN_DIR]
    assert settings["constraints"] is None  # only trainers are placed on managers
    trainer = swarm._service_settings(
        specs["trainer/default/0"], {}, Path("/runs/r1"), secret, "node.role==manager"
    )
    assert trainer["constraints"] == ["node.role==manager"]
    containers = {s.worker_id: s for s in dl.container_roles(config, "r1")}
    assert containers["replay/default"].command[3:5] == ["--role", "replay"]


def test_troupe_worker_takes_every_role_of_the_plan():
    """A cluster starts each worker as ``troupe worker --role ROLE``: a role missing from its
    choices is a worker no cluster can start."""
    parser = argparse.ArgumentParser()
    add_worker_arguments(parser)
    for role in Role:
        args = parser.parse_args(["--id", "w", "--role", role.value, "--controller", "tcp://c:1"])
        assert args.role == role.value
