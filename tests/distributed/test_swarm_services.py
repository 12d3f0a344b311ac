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
from system.run import launch_end


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
    settings = swarm._service_settings(
        replay, {}, Path("/runs/r1"), secret, "node.role==manager", "l1"
    )
    assert settings["restart_policy"]["Condition"] == "on-failure"
    # restarts count within a window, as the controller's in a row: a worker failing now and
    # then in a days-long run is restarted each time
    assert settings["restart_policy"]["Window"] == 150 * swarm.SECOND_NS
    assert [m["Target"] for m in settings["mounts"]] == [dl.CONTAINER_RUN_DIR]
    # a task Swarm starts again after the run's end finds that end in the mounted folder
    env = settings["env"]
    assert env[launch_end.LAUNCH_ID_ENV] == "l1"
    assert env[launch_end.RUN_FOLDER_ENV] == dl.CONTAINER_RUN_DIR
    assert settings["constraints"] is None  # only trainers are placed on managers
    trainer = swarm._service_settings(
        specs["trainer/default/0"], {}, Path("/runs/r1"), secret, "node.role==manager", "l1"
    )
    assert trainer["constraints"] == ["node.role==manager"]
    # a drained node's worker gets time for its stop (a trainer sends its last version), as
    # the controller gets time for the run's; Swarm's default is 10 s
    for spec in (replay, specs["trainer/default/0"]):
        settings = swarm._service_settings(spec, {}, Path("/r"), secret, "node.role==manager", "l1")
        assert settings["stop_grace_period"] == int(dl.STOP_GRACE_S) * swarm.SECOND_NS
        assert "stop_signal" not in settings  # SIGTERM: a worker's stop comes from its controller
    containers = {s.worker_id: s for s in dl.container_roles(config, "r1")}
    assert containers["replay/default"].command[3:5] == ["--role", "replay"]


def test_a_swarm_controller_is_started_again_a_few_times_over_the_run():
    """As Kubernetes starts a controller pod again (its Job's backoffLimit): a killed
    controller, or one its engine stopped, resumes the run. It was never started again: a
    killed controller lost the run. Its restarts count over the run (window 0), not within a
    window, so one killed every time ends after :data:`CONTROLLER_RETRIES` restarts."""
    config = make_experiment("cartpole-ppo", [])
    controller = swarm.service_roles(config, "r1")[0]
    assert controller.role == "controller"
    secret = types.SimpleNamespace(id="s1", name="troupe-r1-keys")
    settings = swarm._service_settings(
        controller, {}, Path("/r"), secret, "node.role==manager", "l1"
    )
    policy = settings["restart_policy"]
    assert policy["Condition"] == "on-failure"  # an exit 0 (the run's own end) stays ended
    assert policy["MaxAttempts"] == swarm.CONTROLLER_RETRIES == 2
    assert policy.get("Window", 0) == 0
    # it finds its run's end in the mounted folder, as the workers do, and exits 0 there
    assert settings["env"][launch_end.LAUNCH_ID_ENV] == "l1"
    assert settings["stop_signal"] == "SIGINT"
    # every task knows how many starts Swarm makes: once all are made, workers leave with 0
    assert settings["env"][launch_end.CONTROLLER_STARTS_ENV] == "3"


def test_troupe_worker_takes_every_role_of_the_plan():
    """A cluster starts each worker as ``troupe worker --role ROLE``: a role missing from its
    choices is a worker no cluster can start."""
    parser = argparse.ArgumentParser()
    add_worker_arguments(parser)
    for role in Role:
        args = parser.parse_args(["--id", "w", "--role", role.value, "--controller", "tcp://c:1"])
        assert args.role == role.value


def test_each_service_reserves_and_limits_what_its_role_was_measured_to_need():
    """Swarm tasks once ran with no reservation or limit: a node could be given more actors
    than it has memory for, and one runaway worker could take the node."""
    from distributed.deploy.sizing import MEASURED, role_needs
    from distributed.deploy.swarm import service_resources
    from distributed.launch.docker_run import RoleSpec

    actor = service_resources(RoleSpec("actor/{ordinal}", "actor", [], 4), MEASURED)
    mib = 2**20
    assert actor["Reservations"] == {"MemoryBytes": 80 * mib}  # CPUs: only where asked
    assert actor["Limits"] == {"NanoCPUs": 10**9, "MemoryBytes": 160 * mib}
    params = service_resources(RoleSpec("params", "parameter_service", []), MEASURED)
    assert params["Limits"]["NanoCPUs"] == 10**9 and params["Reservations"]["MemoryBytes"] > 0
    bigger = role_needs(memory_mib={"trainer": 4000.0}, cpus={"trainer": 4})
    spec = RoleSpec("trainer/default/0", "trainer", [])
    trainer = service_resources(spec, bigger, reserve_cpus=frozenset({"trainer"}))
    assert trainer["Reservations"] == {"NanoCPUs": 4 * 10**9, "MemoryBytes": 5008 * mib}
