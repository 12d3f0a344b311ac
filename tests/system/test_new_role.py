"""Issue 24: a role is its plan, its builder and its worker module, and nothing else.

``toy_role.py`` beside this file defines a ``version-watch`` role that no file of Troupe names.
An experiment asks for two of them (``roles``) and imports the file (``code.imports``); the
role then runs serially, as real worker processes of a run, and in what the Kubernetes, Slurm
and Swarm generators write.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from api.code import CodeConfig
from api.config import make_experiment
from api.errors import ConfigError
from api.user_code import import_file
from system.run.builders import BUILDERS
from system.run.plan import PLAN_TYPES, plan_workers

TOY = Path(__file__).with_name("toy_role.py")


@pytest.fixture(scope="module", autouse=True)
def toy_module():
    """Imported as every process of a run imports it (by its file), for this module's tests
    only: the other tests see Troupe's own roles alone."""
    global toy
    toy = import_file(TOY)
    yield
    PLAN_TYPES.pop(toy.ROLE, None)
    BUILDERS.pop(toy.ROLE, None)


def experiment(*overrides: str):
    config = make_experiment("cartpole-ppo", ["evaluation.workers=0", "stop.eval_return=None",
                                              *overrides])  # fmt: skip
    return dataclasses.replace(
        config,
        roles={toy.ROLE: {"workers": 2, "policy": "default"}},
        code=CodeConfig(imports=[str(TOY)]),
    )


def test_the_role_is_planned_only_where_an_experiment_asks_for_it():
    watches = [p for p in plan_workers(experiment()) if str(p.role) == toy.ROLE]
    assert [p.worker_id for p in watches] == [f"{toy.ROLE}/0", f"{toy.ROLE}/1"]
    assert not any(str(p.role) == toy.ROLE for p in plan_workers(make_experiment("cartpole-ppo")))
    with pytest.raises(ConfigError, match="no_such_role"):
        plan_workers(dataclasses.replace(experiment(), roles={"no_such_role": {}}))
    with pytest.raises(ConfigError, match="trainer"):
        plan_workers(dataclasses.replace(experiment(), roles={"trainer": {}}))


def test_a_run_naming_a_role_no_module_defines_is_refused_before_its_folder_is_made(tmp_path):
    from distributed.launch.run import prepare

    config = dataclasses.replace(make_experiment("cartpole-ppo"), roles={"nope": {}})
    with pytest.raises(ConfigError, match="nope is not a role defined outside Troupe"):
        prepare(config, [], str(tmp_path / "run"), None)
    assert not (tmp_path / "run").exists()


def test_the_role_runs_serially():
    from system.run.serial import SerialRun

    run = SerialRun(experiment())
    try:
        run.run(env_frames=4_000)
        watches = run.workers_of(toy.ROLE)
        trained = run.progress.trainer_steps("default")
    finally:
        run.close()
    assert len(watches) == 2 and trained >= 1
    for watch in watches:  # each followed the versions the trainer published, in order
        assert watch.seen and watch.seen == sorted(watch.seen)


@pytest.mark.multiprocess
def test_the_role_runs_as_worker_processes_of_a_run(tmp_path):
    """As a user starts it: an experiment file asking for the role, the module imported."""
    from e2e_support import finish, start

    (tmp_path / "watched.yaml").write_text(f"""\
base: cartpole-ppo
roles: {{{toy.ROLE}: {{workers: 2, policy: default}}}}
evaluation: {{workers: 0}}
stop: {{eval_return: null, env_frames: 6000}}
""")  # fmt: skip
    run = tmp_path / "run"
    out = finish(start(["run", str(tmp_path / "watched.yaml"), "--import", str(TOY),
                        "--run-dir", str(run), "--no-display"]))  # fmt: skip
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "env_frames", out[-3000:]
    workers = json.loads((run / "workers.json").read_text())
    for index in (0, 1):
        worker_id = f"{toy.ROLE}/{index}"
        assert workers[worker_id]["role"] == toy.ROLE, workers[worker_id]
        seen = json.loads((run / toy.ROLE / f"{index}.json").read_text())
        assert seen["versions"] and seen["versions"] == sorted(seen["versions"])


def test_the_role_appears_in_what_each_cluster_generator_writes():
    from distributed.deploy import k8s, slurm, swarm
    from distributed.deploy.sizing import MEASURED, component_of, needs_of

    config = experiment()
    objects = k8s.build_manifests(config, k8s.K8sOptions(run_name="r1"))
    jobs = [o for o in objects if o["kind"] == "Job" and o["metadata"]["name"] == "r1-" + toy.ROLE]
    assert jobs, [o["metadata"]["name"] for o in objects]
    (job,) = jobs
    assert job["spec"]["completions"] == 2  # one Indexed Job of two replicas
    (container,) = job["spec"]["template"]["spec"]["containers"]
    command = container["args"]
    assert "--role" in command and command[command.index("--role") + 1] == toy.ROLE
    # it writes in the run folder (its plan says so): mounted on its pods, as on the service's
    assert "run" in [m["name"] for m in container["volumeMounts"]]
    (budget,) = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    shielded = budget["spec"]["selector"]["matchExpressions"][0]["values"]
    assert "params" in shielded and toy.ROLE not in shielded  # losing it sets nothing back
    options = slurm.SlurmOptions(
        run_name="r1",
        run_dir=Path("/shared/runs/r1"),
        deploy_dir=Path("/shared/deploy/r1"),
        image="docker://troupe-worker:latest",
    )
    script = slurm.build_script(config, options)
    step = next(line for line in script.splitlines() if f"--job-name={toy.ROLE}" in line)
    assert "--ntasks=2" in step and f"worker {toy.ROLE} '{toy.ROLE}/{{ordinal}}'" in step, step
    services = {s.worker_id: s for s in swarm.service_roles(config, "r1")}
    for index in (0, 1):  # a service per worker, as for trainers and policy workers
        watch = services[f"{toy.ROLE}/{index}"]
        assert watch.role == toy.ROLE and watch.restartable
        assert watch.command[:5] == ["worker", "--id", watch.worker_id, "--role", toy.ROLE]
    # never measured: sized as an actor, since it runs no network
    assert needs_of(MEASURED, component_of(watch.worker_id, watch.role)) == MEASURED["actor"]
