"""A ``--launcher docker`` run whose Docker engine stops answering for a while (a restart with
live-restore, a socket's hiccup), through a proxy of the real engine's socket that the test
cuts and opens again (``engine_proxy.py``).

The launching process ended in a traceback at its next call to the engine: the run's
containers and network were left, the keeper stopped hearing of workers' ends, and the output
of every container stopped. Now it waits for the engine and goes on where it was.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from docker_support import (
    QUICK,
    BackgroundRun,
    assert_nothing_left,
    frames,
    read_json,
    troupe_run_docker,
    wait_until_it_trains,
)
from engine_proxy import EngineProxy, engine_socket

from distributed.launch import docker_run as dl
from distributed.launch.docker_engine import Engine
from distributed.ops import record as launch

pytestmark = pytest.mark.docker


@pytest.fixture
def proxy(docker_client, tmp_path):
    import docker

    target = engine_socket()
    if target is None:
        pytest.skip("the engine is not reached through a unix socket here")
    proxy = EngineProxy(tmp_path / "engine.sock", target)
    proxy.open()
    client = docker.DockerClient(base_url=proxy.url)
    yield proxy, client
    proxy.cut()
    client.close()


def test_a_run_goes_on_across_the_engines_absence_and_hears_what_ended_in_it(
    docker_client, proxy, tmp_path, caplog
):
    """The engine gone for 4 s while a worker's container is killed by hand: once it answers,
    the launching process hears of that end (its event stream opened again from the last
    event it read), starts the worker again, and the run ends by its budget."""
    caplog.set_level(logging.WARNING, logger="distributed.launch")
    away, client = proxy
    run = BackgroundRun(client, tmp_path / "docker-away", [*QUICK, "stop.env_frames=600000"])
    run.wait_for(lambda: frames(run.run_dir) > 3000, "3000 frames")
    away.cut()
    labels = {"label": [f"{dl.LABEL_RUN}={run.run}", f"{dl.LABEL_WORKER}=actor/0"]}
    (victim,) = docker_client.containers.list(filters=labels)  # through the real socket
    victim.kill()
    time.sleep(4)
    away.open()

    def restarted() -> bool:
        return read_json(run.run_dir / "workers.json").get("actor/0", {}).get("restarts", 0) >= 1

    run.wait_for(restarted, "actor/0 started again and counted restarted")
    assert run.join() == 0, run.log()
    output = run.output.getvalue()
    assert "[actor/0] its container ended: exit code 137" in output, run.log()
    assert "[actor/0] Docker does not restart a container stopped by hand" in output, run.log()
    said = caplog.text
    assert "the Docker engine does not answer" in said and "answers again" in said, said
    assert read_json(run.run_dir / "summary.json")["stop_reason"] == "env_frames", run.log()
    assert_nothing_left(docker_client, run.run)


def test_what_an_engine_that_does_not_come_back_leaves_is_said_and_troupe_stop_removes_it(
    docker_client, proxy, tmp_path, caplog
):
    """The run's clean-up waits for the engine; one that is not back in time leaves the run's
    objects, and the user is told how to remove them once it is: `troupe stop RUN_DIR`, which
    removed containers only, not a network left alone."""
    caplog.set_level(logging.WARNING, logger="distributed.launch")
    away, client = proxy
    run_dir = tmp_path / "engine-away"
    run_dir.mkdir()
    (run_dir / "config.json").write_text("{}")
    gone = subprocess.Popen(["true"])  # the launching process, ended
    gone.wait()
    launch.write(run_dir, launch.for_process("docker", run_dir, gone.pid))
    run = dl.run_name(run_dir)
    docker_client.networks.create(f"troupe-{run}", labels={dl.LABEL_RUN: run})
    try:
        away.cut()
        Engine(client, str(run_dir), wait_s=1.0).remove_run_objects(run)
        assert f"`troupe stop {run_dir}` removes them" in caplog.text, caplog.text
        assert docker_client.networks.list(filters={"label": f"{dl.LABEL_RUN}={run}"})
        back = threading.Timer(1.5, away.open)  # a wait that it outlasts
        back.start()
        Engine(client, str(run_dir), wait_s=60.0).remove_run_objects(run)
        back.join()
        assert "the Docker engine answers again" in caplog.text, caplog.text
        assert_nothing_left(docker_client, run)
        docker_client.networks.create(f"troupe-{run}", labels={dl.LABEL_RUN: run})
        stop = subprocess.run([sys.executable, "-m", "distributed.cli", "stop", str(run_dir)],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert stop.returncode == 0, stop.stderr
        assert f"the network of run '{run}'" in stop.stdout, stop.stdout
        assert_nothing_left(docker_client, run)
    finally:
        for network in docker_client.networks.list(filters={"label": f"{dl.LABEL_RUN}={run}"}):
            network.remove()


def test_a_ctrl_c_while_the_engine_is_away_stops_the_run_in_order_once_it_answers(
    docker_client, proxy, tmp_path
):
    """`troupe run --launcher docker`, its engine reached through the proxy, gets SIGINT while
    the engine is gone. The launching process ended in a traceback (the signal to the
    controller broke), or, in its wait for the engine, gave up and left the controller running
    with nothing to stop it. Now it waits for the engine, then stops the run in order."""
    away, _ = proxy
    run_dir = tmp_path / "ctrl-c-away"
    proc = troupe_run_docker(
        tmp_path, run_dir, "stop.env_frames=100000000", env={"DOCKER_HOST": away.url}
    )
    try:
        wait_until_it_trains(proc, run_dir)
        away.cut()
        time.sleep(1.5)  # the launcher meets the absence in its wait for the controller
        proc.send_signal(signal.SIGINT)
        time.sleep(3)
        away.open()
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out[-3000:]
    assert "waiting up to 60s for it, to stop the run in order" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert read_json(run_dir / "summary.json")["stop_reason"] == "interrupted", out[-3000:]
    assert_nothing_left(docker_client, dl.run_name(run_dir))
