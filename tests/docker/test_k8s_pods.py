"""The Kubernetes manifests' pods, carried out under Docker by ``kubelet.py`` (no Kubernetes node
can be started here): cartpole-ppo learns from them, and a worker that hangs is restarted by its
liveness probe (the heartbeat file goes stale) and the run goes on."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from docker_support import assert_refused_for_the_missing_file, corridor_module, deploy_with_import
from kubelet import Kubelet

from api.config import make_experiment
from distributed.deploy import k8s
from distributed.images import build as images
from system.streams.security import RunKeys

pytestmark = pytest.mark.docker

RUN = "kc"
IMAGE = os.environ.get("TROUPE_TEST_IMAGE", images.DEFAULT_TAG)


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def test_the_pods_solve_cartpole_and_a_hung_worker_is_restarted_by_its_probe(
    docker_client, tmp_path
):
    # a frame budget, not the solve target, ends the run: solving can take less time than the
    # probe needs to see the hung worker (stale heartbeat file, then a restart). 300,000 frames
    # took 13 s here once, and the run ended before the probe restarted the hung actor.
    config = make_experiment(
        "cartpole-ppo",
        ["stop.eval_return=None", "stop.env_frames=1500000", "stop.wall_seconds=400"],
    )
    options = k8s.K8sOptions(run_name=RUN, image=IMAGE, probe_stale_seconds=6)
    objects = k8s.build_manifests(config, options)
    kubelet = Kubelet(docker_client, objects, RunKeys.generate().to_text(), tmp_path, RUN)
    run_dir = kubelet.claim_dir(options.claim) / RUN
    hung = False
    try:
        kubelet.start()
        deadline = time.monotonic() + 480
        while not kubelet.controller_done():
            assert time.monotonic() < deadline, "the run did not end in 480 s"
            kubelet.tick()
            actor = kubelet.pod(f"{RUN}-actor-1")
            if not hung and actor.started:  # configured and beating: hang it
                actor.container.kill(signal="SIGSTOP")
                hung = True
            time.sleep(1)
        logs = kubelet.pod(f"{RUN}-controller").container.logs().decode()[-6000:]
    finally:
        kubelet.stop()
    assert hung, f"the run ended before a worker could be hung:\n{logs}"
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "env_frames", logs
    assert summary["best_eval_return"] >= 475, logs  # CartPole learned, from the pods
    actor = kubelet.pod(f"{RUN}-actor-1")
    assert actor.probe_restarts == 1  # stopped, never crashed: only its probe could tell
    assert sum(p.probe_restarts for p in kubelet.pods) == 1
    # every pod ended with exit 0 (a worker that failed while the run started up, e.g. on a
    # peer's timeout on these 2 shared cores, was restarted by its OnFailure policy, as on k8s)
    assert all(p.exits[-1:] in ([], [0]) for p in kubelet.pods), (
        [(p.name, p.exits) for p in kubelet.pods],
        [line for line in logs.splitlines() if "failed" in line or "error" in line.lower()],
    )
    workers = read_json(run_dir / "workers.json")
    assert workers["actor/1"]["restarts"] >= 1, f"{workers}\n{logs}"
    assert docker_client.containers.list(all=True, filters={"label": f"troupe.kubelet={RUN}"}) == []
    assert {w: s["state"] for w, s in workers.items() if s["state"] != "stopped"} == {}, logs


def test_with_a_claim_per_pod_a_killed_trainer_gets_its_state_back_from_the_service(
    docker_client, tmp_path
):
    """``--storage pod``: no volume is shared (ReadWriteOnce claims only: the controller's, the
    parameter service's) and the trainer mounts none. Killed after its state was persisted,
    the trainer is restarted by its Job and restores that state from the parameter service."""
    run = "kp"
    config = make_experiment(
        "cartpole-ppo",
        ["stop.eval_return=None", "stop.env_frames=200000", "checkpoint.every=10"],
    )
    options = k8s.K8sOptions(run_name=run, image=IMAGE, storage="pod")
    objects = k8s.build_manifests(config, options)
    for job in (o for o in objects if o["metadata"]["name"] == f"{run}-trainer-default"):
        container = job["spec"]["template"]["spec"]["containers"][0]
        container["env"].append({"name": "TROUPE_LOG_LEVEL", "value": "INFO"})
    kubelet = Kubelet(docker_client, objects, RunKeys.generate().to_text(), tmp_path, run)
    saved = kubelet.claim_dir(f"{run}-params-0-run") / run / "checkpoints" / "default"
    killed = False
    try:
        kubelet.start()
        trainer = next(p for p in kubelet.pods if p.name.startswith(f"{run}-trainer-"))
        spec = trainer.job["spec"]["template"]["spec"]["containers"][0]
        assert {m["name"] for m in spec["volumeMounts"]} == {"keys", "tmp"}  # no run folder
        deadline = time.monotonic() + 400
        while not kubelet.controller_done():
            assert time.monotonic() < deadline, "the run did not end in 400 s"
            kubelet.tick()
            if not killed and (saved / "trainer.ckpt").exists():
                trainer.container.kill()  # SIGKILL: exit 137, restarted by its OnFailure
                killed = True
            time.sleep(1)
        logs = kubelet.pod(f"{run}-controller").container.logs().decode()[-6000:]
        trainer_logs = trainer.container.logs().decode()
    finally:
        kubelet.stop()
    assert killed, f"the run ended before the trainer state was saved:\n{logs}"
    run_dir = kubelet.claim_dir(f"{run}-controller-run") / run
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "env_frames", logs
    assert read_json(run_dir / "workers.json")["trainer/default/0"]["restarts"] == 1, logs
    assert "trainer state of version" in trainer_logs, trainer_logs[-3000:]
    assert sorted(p.name for p in saved.iterdir() if p.suffix == ".ckpt")  # versions, state
    assert not (kubelet.claim_dir(f"{run}-controller-run") / run / "checkpoints").exists()


def test_deploy_k8s_refuses_an_image_this_engine_holds_without_the_users_file(
    docker_client, tmp_path
):
    """``troupe deploy k8s --import my_corridor.py`` with an image built without it: every pod
    would fail to import it. Where this machine's engine holds the image, a container of it
    tries the import first, and no manifest is written."""
    module = corridor_module(tmp_path, "my_corridor.py")
    out = tmp_path / "manifests"
    command = ["k8s", "Corridor-v0", "--out", str(out)]
    result = deploy_with_import(docker_client, module, command, tmp_path, add=False)
    assert_refused_for_the_missing_file(result, module)
    assert not out.exists()


NEEDS_PACKAGE = """\
from api import environment
from api.errors import UserError
from api.registry import register_environment


def needs_package(**kwargs):
    \"\"\"CartPole that needs pytest: here, where the tests run, but not in a worker image.\"\"\"
    try:
        import pytest  # noqa: F401
    except ImportError as e:
        raise UserError("NeedsPackage-v0 needs pytest") from e
    return environment.make("CartPole-v1", **kwargs)


register_environment("NeedsPackage-v0", needs_package)
"""


def test_deploy_k8s_refuses_an_image_that_lacks_a_package_the_environment_needs(
    docker_client, tmp_path
):
    """``troupe deploy k8s pong-ppo`` with an image built without the atari extra wrote and
    applied every manifest; the run then ended on "Atari-v0 needs ale-py". The image's check
    now builds the environment as an actor would (the user's file is in the image here; the
    package it needs is not), and no manifest is written."""
    module = tmp_path / "my_needs.py"
    module.write_text(NEEDS_PACKAGE)
    out = tmp_path / "manifests"
    command = ["k8s", "NeedsPackage-v0", "--out", str(out)]
    result = deploy_with_import(docker_client, module, command, tmp_path)
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 1, said[-3000:]
    assert "cannot build the run's environment 'NeedsPackage-v0', as each actor would" in said
    assert "NeedsPackage-v0 needs pytest" in said, said
    assert not out.exists()
