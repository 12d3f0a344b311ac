"""``troupe run --launcher docker`` in a real engine: every role in its own container.

Needs the worker image built from the code under test (``.ci/docker-setup``); skipped when no
engine answers or the image is absent. Each test waits on conditions read from the run folder or
the engine, with deadlines, and checks that no container or network of the run is left.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import zmq
from docker_support import (
    IMAGE,
    QUICK,
    BackgroundRun,
    assert_nothing_left,
    frames,
    read_json,
    the_container,
    troupe_run_docker,
    wait_until_it_trains,
)

from distributed.images import source
from distributed.launch import docker_run as dl
from distributed.launch.docker_engine import Engine
from distributed.launch.docker_keeper import Keeper
from distributed.launch.docker_output import LogPrinter
from system.streams import transport, wire
from system.streams.security import RunKeys

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def client(docker_client):
    return docker_client


def test_a_docker_run_writes_the_run_folder_and_leaves_nothing(client, tmp_path):
    run = BackgroundRun(client, tmp_path / "docker-complete", [*QUICK, "stop.env_frames=8000"])
    assert run.join() == 0, run.log()
    for name in ("config.json", "metrics.jsonl", "summary.json", "learning_curve.png"):
        assert (run.run_dir / name).exists(), run.log()
    assert list((run.run_dir / "checkpoints" / "default").glob("v*.ckpt"))
    summary = read_json(run.run_dir / "summary.json")
    assert summary["stop_reason"] == "env_frames" and summary["env_frames"] >= 8000
    roles = sorted(w["role"] for w in read_json(run.run_dir / "workers.json").values())
    assert roles == ["actor", "actor", "actor", "parameter_service", "policy", "trainer"]
    assert (run.run_dir / "metrics.jsonl").stat().st_uid == os.getuid()
    assert oct((run.run_dir / "keys").stat().st_mode & 0o777) == "0o600"
    assert "(final)" in run.log()  # the controller's lines reach the terminal
    assert_nothing_left(client, run.run)


def test_a_crashed_actor_container_is_restarted_and_the_run_completes(client, tmp_path):
    # Long enough (tens of seconds at today's frame rates) for Docker's restart and the new
    # process's hello to happen well before the run ends.
    run = BackgroundRun(client, tmp_path / "docker-crash", [*QUICK, "stop.env_frames=600000"])
    run.wait_for(lambda: frames(run.run_dir) > 3000, "3000 frames")
    victim = the_container(client, run.run, "actor/0")
    # A crash, not `docker kill`: Docker never restarts a container a user stopped or killed.
    os.kill(victim.attrs["State"]["Pid"], signal.SIGKILL)

    def restarted() -> bool:
        victim.reload()
        return victim.attrs["RestartCount"] >= 1 and victim.status == "running"

    run.wait_for(restarted, "actor/0 restarted by Docker")
    assert run.join() == 0, run.log()
    # Docker's die event, on the host: the controller inside saw only a worker gone silent
    assert "[actor/0] its container ended: exit code 137 (SIGKILL" in run.output.getvalue()
    assert read_json(run.run_dir / "summary.json")["stop_reason"] == "env_frames"
    # Only the restarted process can have said bye: the killed one never got the chance.
    assert read_json(run.run_dir / "workers.json")["actor/0"]["state"] == "stopped"
    assert_nothing_left(client, run.run)


def test_a_worker_container_stopped_killed_or_removed_by_hand_comes_back(client, tmp_path):
    """Docker never restarts a container a user stopped or killed, whatever its restart policy:
    such a worker was waited for until the restart grace ran out (the run failed), or until
    the run's end (exit 0, the worker missing from the summary). The launching process, the
    run's scheduler here, starts it again as a cluster's scheduler would, and makes a removed
    one again."""
    run = BackgroundRun(client, tmp_path / "docker-by-hand", [*QUICK, "stop.env_frames=900000"])
    run.wait_for(lambda: frames(run.run_dir) > 3000, "3000 frames")
    killed = the_container(client, run.run, "actor/0")
    stopped = the_container(client, run.run, "actor/1")
    removed = the_container(client, run.run, "eval/0")
    killed.kill()  # docker kill
    stopped.stop()  # docker stop: SIGTERM, then the worker's stop from its controller
    removed.remove(force=True)  # docker rm -f: Swarm and Kubernetes would make another

    def restarted(worker: str) -> bool:
        return read_json(run.run_dir / "workers.json").get(worker, {}).get("restarts", 0) >= 1

    for worker in ("actor/0", "actor/1", "eval/0"):
        run.wait_for(lambda w=worker: restarted(w), f"{worker} back and counted restarted")
    assert the_container(client, run.run, "eval/0").id != removed.id
    assert run.join() == 0, run.log()
    output = run.output.getvalue()
    for worker in ("actor/0", "actor/1"):
        assert f"[{worker}] Docker does not restart a container stopped by hand" in output
    assert "[eval/0] its container was removed (docker rm): creating it again" in output
    summary = read_json(run.run_dir / "summary.json")
    assert summary["stop_reason"] == "env_frames", summary
    assert set(summary["restarts"]) == {"actor/0", "actor/1", "eval/0"}, summary
    assert "unstopped" not in summary and "failure" not in summary, summary
    assert_nothing_left(client, run.run)


def test_a_sigterm_to_every_container_at_once_stops_the_run_and_starts_none_again(client, tmp_path):
    """A Docker engine's shutdown (an upgrade, a reboot) sends SIGTERM to every container at
    once. The run stopped in order, but each worker, signalled, left with 143: the launching
    process started them all again while the engine went down, and Docker's restart policy
    did once the engine was back, with no run left: six containers that waited a minute for a
    controller, failed, and were restarted, ten times over."""
    run = BackgroundRun(
        client, tmp_path / "docker-all-signalled", [*QUICK, "stop.env_frames=900000000"]
    )
    run.wait_for(lambda: frames(run.run_dir) > 3000, "3000 frames")
    for container in client.containers.list(filters={"label": f"{dl.LABEL_RUN}={run.run}"}):
        container.kill(signal="SIGTERM")  # as the engine's shutdown: at once, not one by one
    assert run.join() == 130, run.log()
    output = run.output.getvalue()
    assert "starting it again" not in output and "exit code 143" not in output, run.log()
    assert read_json(run.run_dir / "summary.json")["stop_reason"] == "interrupted", run.log()
    assert_nothing_left(client, run.run)


def test_a_run_says_when_its_image_holds_other_troupe_code(client, tmp_path, caplog):
    """After a change to Troupe (or an upgrade) without `troupe image build`, the containers
    ran the image's old code, and nothing said so."""
    run_dir = tmp_path / "stale"
    run_dir.mkdir()
    assert client.images.get(IMAGE).labels.get(source.LABEL) == source.source_digest()
    dockerfile = f"FROM {IMAGE}\nLABEL {source.LABEL}=code-of-another-day\n".encode()
    stale, _ = client.images.build(fileobj=io.BytesIO(dockerfile), tag="troupe-test:stale",
                                   network_mode="none", pull=False, rm=True)  # fmt: skip
    try:
        with caplog.at_level(logging.WARNING, logger="distributed.launch"):
            dl.check_can_run(client, IMAGE, run_dir)
            assert caplog.text == ""
            dl.check_can_run(client, "troupe-test:stale", run_dir)
        assert "image troupe-test:stale holds other Troupe code than this command runs" in (
            caplog.text
        )
    finally:
        client.images.remove(stale.id, force=True)


def test_only_a_client_with_the_run_keys_is_answered_by_the_controller(client, tmp_path):
    run = BackgroundRun(client, tmp_path / "docker-curve", [*QUICK, "stop.env_frames=100000000"])
    try:
        run.wait_for(lambda: len(read_json(run.run_dir / "endpoints.json")) >= 5, "endpoints")
        controller = the_container(client, run.run, dl.CONTROLLER_ID)
        ip = controller.attrs["NetworkSettings"]["Networks"][f"troupe-{run.run}"]["IPAddress"]
        address = f"tcp://{ip}:{dl.CONTROLLER_PORT}"
        keys = RunKeys.from_text((run.run_dir / "keys").read_text())
        assert ask_controller(address, None) is None
        assert ask_controller(address, RunKeys.generate()) is None  # another run's keys
        answer = ask_controller(address, keys)
        assert answer is not None and answer.kind == "refused"  # known key, not a worker
    finally:
        the_container(client, run.run, dl.CONTROLLER_ID).kill(signal="SIGINT")
    assert run.join() == 130, run.log()  # interrupted: the exit code says so, not 0
    assert read_json(run.run_dir / "summary.json")["stop_reason"] == "interrupted"
    assert_nothing_left(client, run.run)


def ask_controller(address: str, keys: RunKeys | None) -> wire.Message | None:
    """Send a lookup as the stranger ``probe``; the answer, or None after 3 s of silence."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, b"probe")
    if keys is not None:
        sock.curve_serverkey = keys.server_public
        sock.curve_publickey = keys.client_public
        sock.curve_secretkey = keys.client_secret
    try:
        sock.connect(address)
        transport.send(sock, "lookup", {"name": "params/request"})
        got = transport.recv(sock, timeout_ms=3000)
        return None if got is None else got[1]
    finally:
        sock.close()
        ctx.term()


def test_a_users_own_file_trains_in_containers_with_no_package(client, tmp_path):
    """Issue 12: the README's Corridor class, in a file of the user's registering it at top
    level, reaches every container through ``--import`` (the file's folder is mounted at the
    same path), as ``troupe run`` users type it."""
    corridor = Path(__file__).resolve().parents[1] / "distributed" / "user_code" / "corridor.py"
    module = tmp_path / "my_corridor.py"
    text = corridor.read_text().split('if __name__ == "__main__":')[0]
    module.write_text(text + '\nregister("Corridor-v0", Corridor, length=6)\n')
    run_dir = tmp_path / "runs" / "corridor"
    command = [
        sys.executable, "-m", "distributed.cli", "run", "--import", str(module), "Corridor-v0",
        "frames=3000", "stop.eval_return=None", "evaluation.workers=1", "--launcher", "docker",
        "--image", IMAGE, "--run-dir", str(run_dir), "--no-display",
    ]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200"}
    result = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env
    )
    log = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0, log
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "env_frames" and summary["env_frames"] >= 3000, log
    (registration,) = read_json(run_dir / "config.json")["code"]["registrations"]
    assert registration["source"] == str(module) and registration["kwargs"] == {"length": 6}
    workers = read_json(run_dir / "workers.json")
    assert sum(w["restarts"] for w in workers.values()) == 0, workers
    assert_nothing_left(client, dl.run_name(run_dir))


@pytest.mark.parametrize(
    ("command", "emulator"),
    [
        (["run", "pong-ppo", "stop.env_frames=2000", "evaluation.workers=1"], True),
        (["train", "pettingzoo:classic/rps_v2", "frames=2000", "stop.eval_return=None"], False),
    ],
)
def test_the_atari_and_pettingzoo_experiments_run_in_the_worker_image(
    client, tmp_path, command, emulator
):
    """The image held the core dependencies alone: `pong-ppo` in containers failed for want of
    ale-py, a PettingZoo game for want of PettingZoo. The image holds the extras the registered
    experiments need (`troupe image build --extras`); `troupe train` takes `--launcher`."""
    run_dir = tmp_path / "runs" / "extras"
    argv = [*command, "--launcher", "docker", "--image", IMAGE, "--run-dir", str(run_dir)]
    result = subprocess.run(
        [sys.executable, "-m", "distributed.cli", *argv, "--no-display"], cwd=tmp_path,
        capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    log = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0, log
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "env_frames" and summary["env_frames"] >= 2000, log
    assert ("emulator_frames" in summary) == emulator, summary
    assert_nothing_left(client, dl.run_name(run_dir))


def test_the_readme_corridor_script_trains_in_containers_from_python(client, tmp_path):
    """Issue 12: the README's script form (``register()`` under ``if __name__ == "__main__":``)
    with ``troupe.train(..., launcher="docker")``: the script's file reaches every container."""
    corridor = Path(__file__).resolve().parents[1] / "distributed" / "user_code" / "corridor.py"
    run_dir = tmp_path / "runs" / "corridor"
    text = corridor.read_text()
    call = 'troupe.train("Corridor-v0", ["target=1.0", "frames=100000"])'
    assert call in text
    script = tmp_path / "corridor.py"
    script.write_text(
        text.replace(
            call,
            'troupe.train("Corridor-v0", ["frames=3000", "stop.eval_return=None", '
            f'"evaluation.workers=1"], launcher="docker", image={IMAGE!r}, '
            f"run_dir={str(run_dir)!r})",
        )
    )
    env = {**os.environ, "COLUMNS": "200"}
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env=env,
    )  # fmt: skip
    log = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0, log
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "env_frames" and summary["env_frames"] >= 3000, log
    assert f"env_frames {summary['best_eval_return']} {run_dir}" in result.stdout, log
    (registration,) = read_json(run_dir / "config.json")["code"]["registrations"]
    assert registration["entry_point"] == "__main__:Corridor"
    assert registration["source"] == str(script.resolve())
    workers = read_json(run_dir / "workers.json")
    assert sum(w["restarts"] for w in workers.values()) == 0, workers
    assert_nothing_left(client, dl.run_name(run_dir))


def test_a_missing_image_fails_from_python_before_any_process_starts(client, tmp_path):
    import troupe
    from distributed.errors import DockerRunError

    run_dir = tmp_path / "runs" / "no-image"
    with pytest.raises(DockerRunError, match="image troupe-no-such:image is not on this Docker"):
        troupe.train(
            "cartpole-ppo", run_dir=run_dir, launcher="docker", image="troupe-no-such:image"
        )
    assert not (run_dir / "config.json").exists()
    assert_nothing_left(client, dl.run_name(run_dir))


def test_a_background_docker_run_from_python_stops_in_order(client, tmp_path):
    import troupe

    run_dir = tmp_path / "runs" / "background"
    run = troupe.train(
        "cartpole-ppo", [*QUICK, "stop.env_frames=100000000"], run_dir=run_dir,
        launcher="docker", image=IMAGE, background=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while frames(run_dir) == 0 and time.monotonic() < deadline and run.running:
            time.sleep(0.2)
        assert frames(run_dir) > 0 and run.running
    finally:
        run.stop()  # SIGINT, as Ctrl+C: the controller stops the run in order
    assert run.exit_code == 130, run.exit_code  # as `troupe run --launcher docker` on Ctrl+C
    assert run.summary["stop_reason"] == "interrupted"
    assert_nothing_left(client, dl.run_name(run_dir))


def _once_it_trains(cwd, run_dir, act) -> tuple[subprocess.Popen, str]:
    """A docker run with no end of its own: ``act(process)`` once it has counted frames, then
    the run's process once it has ended, and its output."""
    proc = troupe_run_docker(cwd, run_dir, "stop.env_frames=100000000")
    try:
        wait_until_it_trains(proc, run_dir)
        act(proc)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc, out


def test_a_signal_to_the_troupe_process_stops_a_docker_run_in_order(client, tmp_path):
    """A SIGTERM to `troupe run --launcher docker` alone (a supervisor's stop, not a terminal's
    Ctrl+C to the whole group): it was swallowed by the launching process, and the run went
    on to its wall-clock limit and exited 0."""
    run_dir = tmp_path / "runs" / "signalled"
    proc, out = _once_it_trains(tmp_path, run_dir, lambda proc: os.kill(proc.pid, signal.SIGTERM))
    assert proc.returncode == 130, out[-3000:]
    assert read_json(run_dir / "summary.json")["stop_reason"] == "interrupted", out[-3000:]
    # the summary once, this process's (the controller's container printed one too, shorter)
    assert out.count("'stop_reason': 'interrupted'") == 1 and "'fps'" in out, out[-3000:]
    assert " INFO " not in out, out[-3000:]  # the controller's console is NOTICE and up
    assert_nothing_left(client, dl.run_name(run_dir))


def test_a_stop_while_a_docker_run_starts_stops_it_in_order(client, tmp_path):
    """`troupe stop` a moment after `troupe run --launcher docker`: the process starting the
    containers ended at once, exit 130 with no summary and nothing said of why; now the stop
    waits for the controller's container, which stops the run in order."""
    run_dir = tmp_path / "runs" / "early"
    proc = troupe_run_docker(tmp_path, run_dir)
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / "launch.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(read_json(run_dir / "launch.json")["pid"], signal.SIGINT)  # as troupe stop
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert read_json(run_dir / "summary.json")["stop_reason"] == "interrupted", out[-3000:]
    assert_nothing_left(client, dl.run_name(run_dir))


def test_a_killed_controller_container_is_said_and_gives_128_plus_its_signal(client, tmp_path):
    """`docker kill` of the controller's container (or the out-of-memory killer): `troupe run
    --launcher docker` exited 137 and said nothing of it; a local controller killed so says so
    and gives the same code."""
    run_dir = tmp_path / "runs" / "killed"

    def kill_controller(_) -> None:
        the_container(client, dl.run_name(run_dir), "controller").kill()

    proc, out = _once_it_trains(tmp_path, run_dir, kill_controller)
    assert proc.returncode == 137, out[-3000:]
    said = " ".join(out.split())
    assert (
        "the controller's container was killed (signal 9: docker kill, or out of memory); every "
        f"container of the run was removed. Continue with: troupe run --resume {run_dir} "
        "--launcher docker"
    ) in said, out[-3000:]
    assert_nothing_left(client, dl.run_name(run_dir))


def test_status_ps_logs_and_stop_of_a_docker_run(client, tmp_path):
    """The operations commands on `troupe run --launcher docker`: they once knew Swarm only and
    answered "This node is not a swarm manager". Named by the run's name under runs/."""
    run_dir = tmp_path / "runs" / "ops-docker"
    command = [
        sys.executable, "-m", "distributed.cli", "run", "cartpole-ppo", *QUICK,
        "stop.env_frames=100000000", "--launcher", "docker", "--image", IMAGE,
        "--run-dir", str(run_dir), "--no-display", "--metrics-port", "0",
    ]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200"}

    def troupe(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "distributed.cli", *argv], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, env=env)  # fmt: skip

    proc = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while frames(run_dir) == 0 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert frames(run_dir) > 0, proc.stdout.read() if proc.poll() is not None else ""
        status = troupe("status", "ops-docker")
        assert status.returncode == 0, status.stderr
        assert "run ops-docker (docker): running" in status.stdout, status.stdout
        ps = troupe("ps", "ops-docker")
        assert ps.returncode == 0, ps.stderr
        assert "troupe-ops-docker-controller" in ps.stdout and "running" in ps.stdout, ps.stdout
        logs = troupe("logs", "ops-docker", "--worker", "actor/0")  # the run folder's INFO log
        assert "[actor/0] " in logs.stdout and "actor/0 ready" in logs.stdout, logs.stdout
        actor = the_container(client, "ops-docker", "actor/0").attrs
        host = actor["HostConfig"]
        assert (host["NanoCpus"], host["MemoryReservation"]) == (10**9, 80 * 2**20)
        assert host["Init"] and host["RestartPolicy"]["Name"] == "on-failure"
        assert actor["Config"]["StopTimeout"] == 120  # `docker stop`: as long as a cluster's
        controller = the_container(client, "ops-docker", "controller")
        host_port = controller.ports["9400/tcp"][0]["HostPort"]  # --metrics-port 0: any free
        with urllib.request.urlopen(f"http://127.0.0.1:{host_port}/metrics", timeout=30) as r:
            metrics = r.read().decode()
        assert 'troupe_run_running{run="ops-docker"} 1' in metrics, metrics[:2000]
        native = troupe("logs", "ops-docker", "--worker", "controller", "--source", "scheduler")
        assert native.returncode == 0 and "[controller] " in native.stdout, native.stdout
        stop = troupe("stop", "ops-docker")
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert "run 'ops-docker' ended: interrupted" in stop.stdout, stop.stdout
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out[-3000:]
    assert_nothing_left(client, dl.run_name(run_dir))


def test_a_stop_for_a_controller_that_has_ended_gives_its_exit_code(client):
    """The SIGINT for the stop in order, to a controller's container that ended meanwhile: the
    engine refuses it (not running), which ended the runner in a traceback."""
    container = client.containers.run(IMAGE, entrypoint=["sh", "-c", "exit 7"], detach=True)
    try:
        container.wait(timeout=60)
        keeper = Keeper(client, LogPrinter(io.StringIO()))
        assert dl._stop_in_order(container, keeper, Engine(client, "/runs/r")) == 7
        assert keeper.stopping.is_set()  # nothing of the run is started again once it stops
    finally:
        container.remove(force=True)
