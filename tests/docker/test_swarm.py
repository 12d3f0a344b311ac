"""``troupe deploy swarm`` on a one-node swarm in a real engine.

The fixture makes this engine a swarm manager (``docker swarm init --advertise-addr 127.0.0.1``)
when it is not one, and leaves the swarm afterwards if it made it. Skipped when no engine answers
or the worker image is absent.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from docker.types import UpdateConfig
from docker_support import assert_refused_for_the_missing_file, corridor_module, deploy_with_import
from engine_proxy import EngineProxy, engine_socket
from rich.console import Console

from distributed.deploy import swarm
from distributed.deploy.swarm_tasks import FINISHED_STATES
from distributed.images import build as images
from distributed.launch import docker_run as dl
from distributed.ops import commands as ops

pytestmark = pytest.mark.docker

IMAGE = os.environ.get("TROUPE_TEST_IMAGE", images.DEFAULT_TAG)
ROOT = Path(__file__).resolve().parents[2]
QUICK = ["stop.eval_return=None", "evaluation.workers=1"]


@pytest.fixture(scope="module")
def client(docker_client):
    client = docker_client
    made_swarm = (client.info().get("Swarm") or {}).get("LocalNodeState") != "active"
    if made_swarm:
        client.swarm.init(advertise_addr="127.0.0.1")
    yield client
    if made_swarm:
        client.swarm.leave(force=True)


def deploy_args(run_dir: Path, overrides: list[str], *, wait: bool) -> argparse.Namespace:
    return argparse.Namespace(
        experiment="cartpole-ppo",
        imports=[],
        resume=None,
        overrides=overrides,
        image=IMAGE,
        run_dir=str(run_dir),
        trainer_constraint=swarm.DEFAULT_TRAINER_CONSTRAINT,
        wait=wait,
        metrics_port=METRICS_PORT,
        measured=None,
        cpus=[],
        memory=["trainer=400"],
    )


METRICS_PORT = 19400
"""Published on this node by the runs of these tests (off the default, which a real
deployment may hold)."""


def recording_console() -> Console:
    return Console(record=True, width=200, force_terminal=False)


def assert_nothing_left(client, run: str) -> None:
    label = {"label": f"{dl.LABEL_RUN}={run}"}
    assert client.services.list(filters=label) == []
    assert client.secrets.list(filters=label) == []
    assert client.networks.list(filters=label) == []


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def test_a_swarm_run_completes_and_its_services_are_removed(client, tmp_path):
    run_dir = tmp_path / "swarm-complete"
    command = [sys.executable, "-m", "distributed.cli", "deploy", "swarm", "cartpole-ppo"]
    command += [*QUICK, "stop.env_frames=8000", "--run-dir", str(run_dir), "--image", IMAGE]
    result = subprocess.run(
        [*command, "--wait"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    for name in ("config.json", "metrics.jsonl", "summary.json", "learning_curve.png"):
        assert (run_dir / name).exists(), out
    assert list((run_dir / "checkpoints" / "default").glob("v*.ckpt"))
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "env_frames" and summary["env_frames"] >= 8000
    assert "'best_eval_return'" in out  # the controller's lines were followed, to its summary
    assert_nothing_left(client, "swarm-complete")


def test_a_stopped_swarm_run_is_resumed_under_its_name(client, tmp_path):
    """A Swarm run stopped (by `troupe stop`, or by its engine's restart, which stops every
    task) could be continued only by another launcher: `deploy swarm` had no --resume."""
    run_dir = tmp_path / "swarm-resumed"
    deploy = [sys.executable, "-m", "distributed.cli", "deploy", "swarm"]
    common = ["--image", IMAGE, "--wait", "--metrics-port", "0"]
    first = subprocess.run([*deploy, "cartpole-ppo", *QUICK, "stop.env_frames=8000",
                            "--run-dir", str(run_dir), *common],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    before = read_json(run_dir / "summary.json")
    again = subprocess.run([*deploy, "--resume", str(run_dir), "stop.env_frames=20000", *common],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    out = again.stdout + again.stderr
    assert again.returncode == 0, out
    assert "stop.env_frames: 8000 -> 20000" in out, out
    after = read_json(run_dir / "summary.json")
    assert after["stop_reason"] == "env_frames" and after["env_frames"] >= 20000, after
    assert after["policy_versions"]["default"] > before["policy_versions"]["default"], after
    assert after["wall_s"] > before["wall_s"]  # one run's clock, across both parts
    assert_nothing_left(client, "swarm-resumed")


def test_deploy_wait_goes_on_across_the_engines_absence(client, tmp_path):
    """`troupe deploy swarm --wait`, its engine reached through a proxy that is cut for 4 s
    while the run trains (as a restart with live-restore looks to it): it ended in a
    traceback, its clean-up failing too, with the run's services left running. Now it waits
    for the engine, follows the run to its end and removes it."""
    target = engine_socket()
    if target is None:
        pytest.skip("the engine is not reached through a unix socket here")
    proxy = EngineProxy(tmp_path / "engine.sock", target)
    proxy.open()
    run_dir = tmp_path / "swarm-away"
    command = [sys.executable, "-m", "distributed.cli", "deploy", "swarm", "cartpole-ppo",
               *QUICK, "stop.env_frames=300000", "--run-dir", str(run_dir), "--image", IMAGE,
               "--wait", "--metrics-port", "0"]  # fmt: skip
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "DOCKER_HOST": proxy.url})  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not read_json(run_dir / "latest.json").get("env_frames") and proc.poll() is None:
            assert time.monotonic() < deadline, "no frames in 180 s"
            time.sleep(0.5)
        proxy.cut()
        time.sleep(4)
        proxy.open()
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        proxy.cut()
    assert proc.returncode == 0, out[-4000:]
    assert "the Docker engine answers again" in out and "Traceback" not in out, out[-4000:]
    assert "'stop_reason': 'env_frames'" in out, out[
        -4000:
    ]  # the controller's lines, followed again
    assert read_json(run_dir / "summary.json")["stop_reason"] == "env_frames", out[-4000:]
    assert_nothing_left(client, "swarm-away")


def test_a_signal_to_deploy_wait_stops_the_run_in_order_and_removes_it(client, tmp_path):
    """What a CI runner or a supervisor does to `troupe deploy swarm --wait`: SIGTERM to its
    pid. It once ended the command and left every service running."""
    run_dir = tmp_path / "swarm-signalled"
    command = [sys.executable, "-m", "distributed.cli", "deploy", "swarm", "cartpole-ppo", *QUICK,
               "stop.env_frames=100000000", "--run-dir", str(run_dir), "--image", IMAGE,
               "--wait", "--metrics-port", "0"]  # fmt: skip
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            metrics = run_dir / "metrics.jsonl"
            if metrics.exists() and metrics.stat().st_size > 0:
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.stdout.read()
        kill_an_actor(client, "swarm-signalled")  # and then see it said how it ended
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out[-3000:]
    # the controller inside saw only a worker gone silent; Swarm's task record says how
    assert re.search(r"\[actor/[01]\] its task ended: exit code 137 \(SIGKILL", out), out[-3000:]
    assert read_json(run_dir / "summary.json")["stop_reason"] == "interrupted", out[-3000:]
    assert_nothing_left(client, "swarm-signalled")


def kill_an_actor(client, run: str) -> None:
    """SIGKILL one actor task's container (as the kernel's OOM killer would), then wait until
    Swarm has recorded the failed task and started its replacement."""
    service = client.services.get(f"troupe-{run}-actor")
    (container, *_) = client.containers.list(
        filters={"label": f"com.docker.swarm.service.id={service.id}"}
    )
    container.kill()
    deadline = time.monotonic() + 120
    while True:
        states = [t["Status"]["State"] for t in service.tasks()]
        if "failed" in states and states.count("running") == 2:
            time.sleep(2.0)  # a poll of `deploy --wait` (each second) has seen it
            return
        assert time.monotonic() < deadline, f"Swarm did not replace the killed task: {states}"
        time.sleep(0.5)


def ops_args(*argv: str) -> argparse.Namespace:
    """``troupe status|logs|stop ...`` parsed as the command line would."""
    from distributed.cli import build_parser

    return build_parser().parse_args(list(argv))


def test_status_logs_and_stop_find_a_deployed_run(client, tmp_path, monkeypatch):
    monkeypatch.setenv("TROUPE_LOG_LEVEL", "INFO")  # passed on: each actor says it is ready
    run_dir = tmp_path / "swarm-status"
    console = recording_console()
    args = deploy_args(run_dir, [*QUICK, "stop.env_frames=100000000"], wait=False)
    assert swarm.run_swarm(args, console) == 0
    assert "troupe status swarm-status" in console.export_text()
    try:
        deadline = time.monotonic() + 120
        while len(read_json(run_dir / "workers.json")) < 5 or not all(
            w["state"] == "alive" for w in read_json(run_dir / "workers.json").values()
        ):
            assert time.monotonic() < deadline, "the workers did not all come alive"
            time.sleep(0.5)
        status = recording_console()
        assert ops.run_status(ops_args("status", str(run_dir)), status) == 0
        text = status.export_text()
        assert "run swarm-status (swarm): running" in text, text
        assert "troupe-swarm-status-actor" in text and "2/2 running" in text, text
        assert "actor/1" in text and "alive" in text, text
        trainer = client.services.get("troupe-swarm-status-trainer-default-0")
        resources = trainer.attrs["Spec"]["TaskTemplate"]["Resources"]
        assert resources["Reservations"]["MemoryBytes"] == 512 * 2**20  # 400 MiB + margin
        assert resources["Limits"]["MemoryBytes"] == 1024 * 2**20
        logs = recording_console()
        assert ops.run_logs(ops_args("logs", "swarm-status", "--worker", "controller"), logs) == 0
        lines = logs.export_text()
        assert "[controller] " in lines and " ready" in lines, lines
        scrape = f"http://127.0.0.1:{METRICS_PORT}/metrics"
        with urllib.request.urlopen(scrape, timeout=30) as answer:  # Swarm published it
            metrics = answer.read().decode()
        assert 'troupe_run_running{run="swarm-status"} 1' in metrics, metrics[:2000]
        assert "troupe_worker_up{" in metrics
        native = recording_console()
        argv = ("logs", "swarm-status", "--worker", "controller", "--source", "scheduler")
        assert ops.run_logs(ops_args(*argv), native) == 0
        lines = native.export_text()
        assert "[controller] " in lines, lines
        actors = recording_console()
        argv = ("logs", "swarm-status", "--worker", "actor", "--source", "scheduler")
        assert ops.run_logs(ops_args(*argv), actors) == 0
        lines = actors.export_text()
        assert "[actor/0] " in lines and "[actor/1] " in lines, lines  # ids from task slots
        kill_an_actor(client, "swarm-status")
        ps = Console(record=True, width=400, force_terminal=False)  # no cell wrapped
        assert ops.run_ps(ops_args("ps", "swarm-status"), ps) == 0
        text = ps.export_text()
        said = r"restarts \d+; last failed: actor/[01]: exit code 137 \(SIGKILL"
        assert re.search(said, text), text
    finally:
        stop = recording_console()
        assert ops.run_stop(ops_args("stop", "swarm-status"), stop) == 0
    assert "removed run 'swarm-status' from the swarm" in stop.export_text()
    assert_nothing_left(client, "swarm-status")
    # stop asks the controller to stop the run in order, so the summary is written
    assert read_json(run_dir / "summary.json")["stop_reason"] == "interrupted"


def _tasks_started_again(service, before: set[str], n: int, timeout_s: float) -> list[dict]:
    """Force ``service``'s tasks to start again, every one at once (a rolling update pauses
    when a new task ends while it is watched), as an engine's restart does; wait for the ``n``
    new tasks to end, and return them."""
    all_at_once = UpdateConfig(parallelism=0, failure_action="continue")
    service.update(force_update=True, update_config=all_at_once)
    deadline = time.monotonic() + timeout_s
    while True:
        again = [t for t in service.tasks() if t["ID"] not in before]
        states = [t["Status"]["State"] for t in again]
        if len(again) == n and all(state in FINISHED_STATES for state in states):
            return again
        assert time.monotonic() < deadline, f"{service.name} started again did not end: {states}"
        time.sleep(0.5)


def test_tasks_started_again_after_their_run_ended_by_itself_exit_0(client, tmp_path):
    """An engine's restart starts every task of a run again. After a run that ended by itself,
    a worker looked for its controller for 60 s, exited as orphaned (3) and was started again,
    for as long as the services stood; the controller now starts again too (to resume an
    interrupted run). Here the run spends its budget, and a forced update starts the actors
    and the controller again, as the engine's restart does: each exits 0 at once."""
    run_dir = tmp_path / "swarm-ended"
    args = deploy_args(run_dir, [*QUICK, "stop.env_frames=8000"], wait=False)
    assert swarm.run_swarm(args, recording_console()) == 0
    try:
        deadline = time.monotonic() + 180
        while (summary := read_json(run_dir / "summary.json")).get("stop_reason") != "env_frames":
            assert time.monotonic() < deadline, "the run did not spend its budget"
            time.sleep(0.5)
        controller = client.services.get("troupe-swarm-ended-controller")
        launch = controller.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]["Env"]
        assert f"TROUPE_LAUNCH_ID={summary['launch_id']}" in launch
        actors = client.services.get("troupe-swarm-ended-actor")
        before = {t["ID"] for t in actors.tasks()}  # ended by the controller's stop: exit 0
        while any(t["Status"]["State"] not in FINISHED_STATES for t in controller.tasks()):
            assert time.monotonic() < deadline, "the controller did not exit"
            time.sleep(0.5)
        ended = {t["ID"] for t in controller.tasks()}
        # less than a worker's 60 s wait for its controller
        for service, n in ((actors, 2), (controller, 1)):
            again = _tasks_started_again(service, before | ended, n, timeout_s=45)
            codes = [t["Status"].get("ContainerStatus", {}).get("ExitCode") for t in again]
            assert [t["Status"]["State"] for t in again] == ["complete"] * n and codes == [0] * n
        logs = (run_dir / "logs" / "actor-0.log").read_text()
        assert "actor/0: its run has ended (summary.json: env_frames)" in logs, logs[-2000:]
        logs = (run_dir / "logs" / "controller.log").read_text()
        assert "its run had ended (summary.json: env_frames) when this controller" in logs
        assert read_json(run_dir / "summary.json") == summary  # nothing resumed
    finally:
        stop = recording_console()
        assert ops.run_stop(ops_args("stop", "swarm-ended"), stop) == 0
    assert_nothing_left(client, "swarm-ended")


def test_a_killed_swarm_controller_is_started_again_and_resumes_the_run(client, tmp_path):
    """The controller's container SIGKILLed while the run trains (out of memory, a lost node):
    Swarm never started it again, so the run was lost, `deploy --wait` exited 137 and the
    workers looped. Now Swarm starts it again, it resumes the run from the run folder, the
    workers whose connection closed start again and join it, and `deploy --wait` follows the
    run to its budget and exits 0."""
    run_dir = tmp_path / "swarm-killed"
    deploy = [sys.executable, "-m", "distributed.cli", "deploy", "swarm", "cartpole-ppo", *QUICK]
    deploy += ["stop.env_frames=150000", "--run-dir", str(run_dir), "--image", IMAGE, "--wait"]
    proc = subprocess.Popen([*deploy, "--metrics-port", "0"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not (before := read_json(run_dir / "latest.json")).get("env_frames"):
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not train"
            time.sleep(0.5)
        controller = client.services.get("troupe-swarm-killed-controller")
        (container,) = client.containers.list(
            filters={"label": f"com.docker.swarm.service.id={controller.id}"}
        )
        container.kill(signal="SIGKILL")
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            out, _ = proc.communicate()
    assert proc.returncode == 0, out[-4000:]
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "env_frames" and summary["env_frames"] >= 150000, summary
    assert summary["env_frames"] > before["env_frames"]
    assert summary["policy_versions"]["default"] > 0
    # how its first task ended, and that each worker of it left and joined the new one
    assert "[controller] its task ended: exit code 137 (SIGKILL" in out, out[-4000:]
    said = (run_dir / "logs" / "controller.log").read_text()
    for worker in ("params", "actor/0", "actor/1", "trainer/default/0"):
        assert said.count(f"{worker} says hello") == 2, said[-4000:]
    assert_nothing_left(client, "swarm-killed")


def test_workers_leave_with_0_once_every_start_of_their_controller_was_killed(client, tmp_path):
    """The controller SIGKILLed at each of the three starts Swarm makes, so no summary is ever
    written: the workers looked for it for a minute, exited as orphaned and were started again
    for as long as the services stood. Now each worker, started again, waits its minute, finds
    every start made, and exits 0, which Swarm leaves ended."""
    run_dir = tmp_path / "swarm-lost"
    args = deploy_args(run_dir, [*QUICK, "stop.env_frames=100000000"], wait=False)
    assert swarm.run_swarm(args, recording_console()) == 0
    try:
        controller = client.services.get("troupe-swarm-lost-controller")
        for start in (1, 2, 3):
            _kill_the_controller_at_its_start(client, controller, run_dir, start)
        deadline = time.monotonic() + 240
        for name in ("params", "trainer-default-0", "policy-default-0", "actor", "eval"):
            service = client.services.get(f"troupe-swarm-lost-{name}")
            while (states := _latest_states(service)) != [("complete", 0)] * len(states):
                assert time.monotonic() < deadline, f"{name} did not leave: {states}"
                time.sleep(1)
        said = (run_dir / "logs" / "actor-0.log").read_text()
        assert "has started the run's controller 3 times, all it starts" in said, said[-3000:]
        assert not (run_dir / "summary.json").exists()
    finally:
        assert ops.run_stop(ops_args("stop", "swarm-lost"), recording_console()) == 0
    assert_nothing_left(client, "swarm-lost")


def _kill_the_controller_at_its_start(client, controller, run_dir: Path, start: int) -> None:
    """SIGKILL the controller's container once its ``start``-th start has bound its sockets
    (and, at the first, once the run trains)."""
    deadline = time.monotonic() + 180
    while True:
        starts = read_json(run_dir / "controller_starts.json").get("starts")
        trains = start > 1 or read_json(run_dir / "latest.json").get("env_frames")
        running = client.containers.list(
            filters={"label": f"com.docker.swarm.service.id={controller.id}"}
        )
        if starts == start and trains and running:
            running[0].kill(signal="SIGKILL")
            return
        assert time.monotonic() < deadline, f"start {start} did not come: {starts} so far"
        time.sleep(0.5)


def _latest_states(service) -> list[tuple[str, int | None]]:
    """Each slot's newest task: its state and exit code."""
    newest: dict[int, dict] = {}
    for task in service.tasks():
        slot = task.get("Slot", 0)
        if slot not in newest or task["CreatedAt"] > newest[slot]["CreatedAt"]:
            newest[slot] = task
    return [
        (t["Status"]["State"], t["Status"].get("ContainerStatus", {}).get("ExitCode"))
        for t in newest.values()
    ]


def test_a_users_environment_file_is_deployed_with_import_and_an_image_holding_it(client, tmp_path):
    """A user's own environment on a cluster, as the README says: the file added to the worker
    image (``troupe image build --add``, the layer it builds), and the same ``--import`` as
    ``troupe run`` takes. The containers do not see the file's path: each worker finds it in
    the image. ``deploy`` had no ``--import`` before."""
    module = corridor_module(tmp_path, "my_corridor.py")
    run_dir = tmp_path / "swarm-user-code"
    result = deploy_with_import(client, module, ["swarm", *_corridor_run(run_dir)], tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "env_frames", out[-3000:]
    config = read_json(run_dir / "config.json")
    assert config["environment"]["type"] == "Corridor-v0"
    assert config["code"]["imports"] == [str(module)]
    assert_nothing_left(client, "swarm-user-code")


def _corridor_run(run_dir: Path) -> list[str]:
    """A short Corridor-v0 run followed to its end."""
    return ["Corridor-v0", *QUICK, "stop.env_frames=3000", "--run-dir", str(run_dir),
            "--metrics-port", "0", "--wait"]  # fmt: skip


def test_an_image_without_the_users_file_is_refused_before_anything_is_made(client, tmp_path):
    """The same deploy with the image built without ``--add``: Swarm started the controller
    three times over, each failing with "cannot import", while the workers looked for it. A
    container of the image tries the import first; the deploy is refused with the worker's own
    message and remedy, and leaves no folder or service."""
    module = corridor_module(tmp_path, "my_corridor.py")
    run_dir = tmp_path / "swarm-no-user-code"
    command = ["swarm", *_corridor_run(run_dir)]
    assert_refused_for_the_missing_file(
        deploy_with_import(client, module, command, tmp_path, add=False), module
    )
    assert not run_dir.exists()
    assert_nothing_left(client, "swarm-no-user-code")


def test_a_controller_that_cannot_load_its_run_fails_it_once(client, tmp_path):
    """The user's file is in the image but fails where the run is deployed (here: it raises
    under a launch id, as one needing a dataset that is not mounted would). The controller
    failed three times alike (Swarm started it again each time) while its workers looked for
    it; now its first failure is the run's summary, Swarm's start again has nothing to resume,
    and ``--wait`` exits 1."""
    unmounted = 'import os\nif os.environ.get("TROUPE_LAUNCH_ID"):\n'
    unmounted += '    raise RuntimeError("its dataset is not mounted here")\n'
    module = corridor_module(tmp_path, "unmounted_corridor.py", prefix=unmounted)
    run_dir = tmp_path / "swarm-cannot-load"
    result = deploy_with_import(client, module, ["swarm", *_corridor_run(run_dir)], tmp_path)
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 1, said[-3000:]
    assert said.count("its dataset is not mounted here") == 1, said[-3000:]
    assert "nothing to resume" in said, said[-3000:]
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "failed", summary
    assert "controller: importing" in summary["failure"], summary
    assert_nothing_left(client, "swarm-cannot-load")


def test_an_image_no_node_can_get_is_refused_before_anything_is_made(client, tmp_path):
    """`--image troupe-worker:nosuch` made the run folder and deployed every service, whose
    tasks Swarm then rejected ("No such image"). It is refused at once, naming the image and
    how to make it; no folder or service is left."""
    run_dir = tmp_path / "no-image"
    command = [sys.executable, "-m", "distributed.cli", "deploy", "swarm", "cartpole-ppo"]
    command += ["--run-dir", str(run_dir), "--image", "troupe-worker:nosuch-t1"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "image troupe-worker:nosuch-t1 is neither in this engine nor found in a registry" in (
        result.stderr
    )
    assert "troupe image build --tag troupe-worker:nosuch-t1" in result.stderr
    assert not run_dir.exists()
    assert_nothing_left(client, "no-image")
    # an image this engine has is deployed by an immutable reference to its build
    assert re.fullmatch(r".+:id-[0-9a-f]{12}|.+@sha256:[0-9a-f]{64}",
                        swarm.deployable_image(IMAGE, client))  # fmt: skip


def test_an_engine_that_is_not_a_manager_is_told_to_init_a_swarm():
    class NotInSwarm:
        def info(self) -> dict:
            return {"Swarm": {"LocalNodeState": "inactive", "ControlAvailable": False}}

    with pytest.raises(swarm.SwarmError, match=r"run `docker swarm init` here"):
        swarm.require_manager(NotInSwarm())
