"""The ``troupe`` command run as a user runs it: the installed console script, in a fresh process.

Issue 10, item 9: ``troupe status``, ``logs`` and ``stop`` crashed on every call (``TypeError:
'str' object is not callable``: their positional ``run`` argument overwrote the handler argparse
kept under the same name) while the tests called the functions and never saw it. Every test here
runs the script next to the interpreter (``.venv/bin/troupe``), so argument parsing, dispatch and
error printing are all on the path.

Issue 10, item 5: ``troupe controller`` and ``troupe worker`` without CURVE keys refuse to start
unless ``--insecure`` is given, and then warn.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from api.config import make_experiment
from distributed.deploy.swarm import LABEL_RUN_DIR, service_name
from distributed.launch.docker_run import LABEL_RUN, LABEL_WORKER, run_name
from system.run import folder_lock

pytestmark = pytest.mark.multiprocess

TROUPE = Path(sys.executable).with_name("troupe")
ROOT = Path(__file__).resolve().parents[2]
KEYS_ENV = "TROUPE_CURVE_KEYS_FILE"
ORDINAL_ENV = ("TROUPE_ORDINAL", "TROUPE_SLOT")


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Wide output (one line per message); no CURVE keys or ordinal from the caller's
    environment."""
    env = {k: v for k, v in os.environ.items() if k not in (KEYS_ENV, *ORDINAL_ENV)}
    env.update({"COLUMNS": "200", **(extra or {})})
    return env


def troupe(
    *args: str, timeout: float = 180, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    if not TROUPE.exists():
        pytest.skip(f"no console script at {TROUPE}: install the package (pip install -e .)")
    return subprocess.run(
        [str(TROUPE), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(env),
    )


def assert_one_line_error(result: subprocess.CompletedProcess) -> str:
    """Exit 1, no traceback, and the error is one ``error: ...`` line on stderr."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


# --------------------------------------------------------------------- status, logs, stop
@pytest.mark.parametrize("command", ["status", "logs", "stop"])
def test_swarm_commands_on_an_unknown_run_print_one_line_and_exit_1(command):
    """On a machine that is no Swarm manager (or without docker) the answer is one line saying
    so; before the fix every call died with ``TypeError: 'str' object is not callable``."""
    result = troupe(command, "no-such-run-t10")
    line = assert_one_line_error(result)
    assert "not callable" not in result.stderr
    assert "no-such-run-t10" in line or "docker" in line.lower() or "swarm" in line.lower(), line


# --------------------------------------------------------------------- list, help, show-config
def test_list_prints_every_kind():
    result = troupe("list")
    assert result.returncode == 0, result.stderr
    headings = ("Environments (", "Policies (", "Trainers (", "Policy mappings (", "Callbacks (",
                "Experiments (")  # fmt: skip
    for heading in headings:
        assert heading in result.stdout
    assert "cartpole-ppo" in result.stdout and "self-play" in result.stdout
    assert "pettingzoo:<family>/<game>" in result.stdout


def test_run_help_names_its_options():
    result = troupe("run", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: troupe run"), result.stdout[:200]
    assert "--run-dir" in result.stdout and "--resume" in result.stdout


def test_show_config_prints_the_resolved_keys():
    result = troupe("show-config", "cartpole-ppo")
    assert result.returncode == 0, result.stderr
    for key in ("actors.workers", "stop.env_frames", "stop.eval_return"):
        assert key in result.stdout, key


def test_show_config_of_a_misspelled_experiment_is_one_line():
    line = assert_one_line_error(troupe("show-config", "cartpole-ppp"))
    assert "cartpole-ppp" in line


# --------------------------------------------------------------------- run, then eval --json
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A tiny real run (a few thousand frames), made with the command a user types."""
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    result = troupe(
        "run",
        "cartpole-ppo",
        "stop.env_frames=2000",
        "stop.eval_return=None",
        "--run-dir",
        str(run_dir),
        "--no-display",
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (run_dir / "summary.json").exists()
    return run_dir


def test_eval_json_of_a_finished_run_prints_one_json_object(finished_run):
    result = troupe("eval", str(finished_run), "--json", "--episodes", "3", "--envs", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    report = json.loads(last)
    assert report["episodes"] == 3
    assert 1.0 <= report["mean_return"] <= 500.0  # CartPole returns: one per step survived
    assert report["min_return"] <= report["mean_return"] <= report["max_return"]


def test_eval_of_a_folder_without_checkpoints_is_one_line(tmp_path):
    line = assert_one_line_error(troupe("eval", str(tmp_path), "--json"))
    assert str(tmp_path) in line or "checkpoint" in line


# --------------------------------------------------------------------- error paths (issue 25)
def _damaged_copy(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    (copy / ".troupe.lock").unlink(missing_ok=True)
    return copy


def _zero_middle(path: Path, size: int = 4096) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + size] = bytes(min(size, len(data) - middle))
    path.write_bytes(bytes(data))


def _assert_short_error(result: subprocess.CompletedProcess, culprit: str) -> None:
    """Exit 1, no traceback, an ``error:`` line and at most one more, naming ``culprit``
    (a config error lists its one problem on the second line)."""
    assert result.returncode == 1, (result.args, result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and lines[0].startswith("error:") and len(lines) <= 2, (result.args, lines)
    assert culprit in " ".join(lines), (result.args, lines)


def test_every_cli_error_path_is_one_line_naming_the_culprit(finished_run, tmp_path):
    """A user's mistake with a file, path, key or environment variable: exit 1, one line
    that names the thing at fault, no traceback (each of these used to print 30-80 lines)."""
    copy = _damaged_copy(finished_run, tmp_path)
    numbered = sorted((copy / "checkpoints" / "default").glob("v*.ckpt"))[-1]
    _zero_middle(numbered)
    result = troupe("eval", str(copy), "--episodes", "2", "--envs", "2")
    assert result.returncode == 0, result.stderr  # the same version from latest.ckpt
    assert f"{numbered.name} is damaged" in " ".join(result.stderr.split()), result.stderr
    _zero_middle(copy / "checkpoints" / "default" / "latest.ckpt")  # no good copy of it left
    truncated = _damaged_copy(finished_run, tmp_path / "t")
    text = (truncated / "config.json").read_text()
    (truncated / "config.json").write_text(text[: len(text) // 2])
    missing_keys = {KEYS_ENV: str(tmp_path / "no-such-keys")}
    cases = [
        (("eval", str(numbered)), numbered.name),
        (("eval", str(truncated)), "config.json"),
        (("run", "--resume", str(truncated)), "config.json"),
        (("run", "--resume", str(tmp_path / "nowhere")), "nowhere"),
        (("eval", str(tmp_path / "nowhere.ckpt")), "nowhere.ckpt"),
        (
            ("run", "cartpole-ppo", "stop.no_such_key=3", "--run-dir", str(tmp_path / "r1")),
            "no_such_key",
        ),
        (("run", str(tmp_path / "missing.yaml")), "missing.yaml"),
        (("run", "cartpole-ppo", "--run-dir", str(finished_run)), "not empty"),
        (("show-config", "cartpole-ppo", "seed=-1"), "seed"),
    ]
    for args, culprit in cases:
        _assert_short_error(troupe(*args), culprit)
    run_dir = tmp_path / "r2"
    result = subprocess.run(  # troupe() drops the variable: this case needs it set
        [str(TROUPE), "run", "cartpole-ppo", "--run-dir", str(run_dir), "--no-display"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
        env={**os.environ, "COLUMNS": "200", **missing_keys},
    )  # fmt: skip
    _assert_short_error(result, "no-such-keys")
    assert KEYS_ENV in result.stderr
    assert not (run_dir / "metrics.jsonl").exists()  # refused before anything ran


# --------------------------------------------------------------------- status, logs, stop: working
FAKE_ENGINE = Path(__file__).with_name("fake_engine")


def swarm_state(run_dir: Path, path: Path) -> dict[str, str]:
    """A Swarm manager's view of ``run_dir`` deployed (services, their tasks and log lines, its
    secret and network) for the fake SDK in ``fake_engine``; returns the environment that
    points ``troupe`` at it. ``troupe status/logs/stop`` support Swarm runs only, and the tests
    may not turn the shared engine of this machine into a swarm: the fake stands in for it."""
    run = run_name(run_dir)
    labels = {LABEL_RUN: run, LABEL_RUN_DIR: str(run_dir)}
    services = [
        {
            "name": service_name(run, wid),
            "labels": {**labels, LABEL_WORKER: wid},
            "replicas": 1,
            "tasks": [{"ID": f"task{i}", "Slot": 1, "Status": {"State": "running"}}],
            "logs": [f"{wid} line {n}" for n in range(3)],
        }
        for i, wid in enumerate(["controller", "actor/0", "trainer/default/0"])
    ]
    objects = [{"name": f"troupe-{run}", "labels": labels}]
    state = {"services": services, "secrets": objects, "networks": objects}
    path.write_text(json.dumps(state))
    return {"FAKE_SWARM_STATE": str(path), "PYTHONPATH": f"{FAKE_ENGINE}:{ROOT}"}


def test_status_logs_and_stop_of_a_deployed_run(finished_run, tmp_path):
    """The working path of each command, as a user types it, against a fake Swarm manager whose
    run folder is a real finished run with the launch record ``troupe deploy swarm`` writes:
    status shows the run's state, the folder's workers and last metrics and the services; logs
    the folder's INFO lines of one worker, or the services' own lines; stop stops the controller
    first, removes everything of the run from the swarm and keeps the run folder."""
    run_dir = tmp_path / "swarm-run"
    shutil.copytree(finished_run, run_dir)
    (run_dir / "launch.json").write_text(
        json.dumps({"launcher": "swarm", "run": "swarm-run", "run_dir": str(run_dir)})
    )
    state = tmp_path / "swarm.json"
    env = swarm_state(run_dir, state)

    for target in (str(run_dir), "swarm-run"):  # by its folder, and by its name alone
        status = troupe("status", target, env=env)
        assert status.returncode == 0, status.stderr
        assert "run swarm-run (swarm): running" in status.stdout, status.stdout
        assert "trainer/default/0" in status.stdout and "1/1 running" in status.stdout
        frames = json.loads((run_dir / "summary.json").read_text())["env_frames"]
        assert f"env_frames {frames}" in status.stdout, status.stdout

    logs = troupe("logs", "swarm-run", "--worker", "actor/0", "--tail", "2", "--source",
                  "scheduler", env=env)  # fmt: skip
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.splitlines() == ["[actor/0] actor/0 line 1", "[actor/0] actor/0 line 2"]
    info = troupe("logs", "swarm-run", "--worker", "actor/0", env=env)  # the run folder's
    assert info.returncode == 0 and "[actor/0]" in info.stdout and " ready" in info.stdout
    typo = troupe("logs", "swarm-run", "--worker", "actor/9", env=env)  # no such worker
    assert typo.returncode == 1 and "no worker 'actor/9' in this run" in typo.stdout

    # its controller, running, holds the run folder (a stop request is for one that does not)
    folder_lock.acquire(run_dir)
    try:
        stop = troupe("stop", "swarm-run", env=env)
    finally:
        folder_lock.release(run_dir)
    assert stop.returncode == 0, stop.stderr
    assert "removed run 'swarm-run' from the swarm" in stop.stdout, stop.stdout
    left = json.loads(state.read_text())
    assert (left["services"], left["secrets"], left["networks"]) == ([], [], [])
    assert left["calls"][0] == "scale troupe-swarm-run-controller 0", left["calls"]
    assert (run_dir / "summary.json").exists()


# --------------------------------------------------------------------- CURVE fails closed
def _config_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = make_experiment("cartpole-ppo", ["evaluation.workers=0", "stop.eval_return=None"])
    (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
    return run_dir


WORKER_ARGS = ["--id", "actor/0", "--role", "actor", "--controller", "tcp://127.0.0.1:9",
               "--bind-host", "127.0.0.1", "--advertise-host", "127.0.0.1"]  # fmt: skip
"""Port 9 (discard) on loopback: nothing answers; the worker only has to get past the check."""
SPELLINGS = ["troupe worker", "python -m system.run.worker_process"]


def worker(spelling: str, *args: str, env=None) -> subprocess.CompletedProcess:
    """One worker started as a scheduler starts it: ``troupe worker`` or, in an image whose
    entrypoint is replaced, ``python -m system.run.worker_process`` (the same arguments)."""
    if spelling == "troupe worker":
        return troupe("worker", *WORKER_ARGS, *args, env=env)
    return subprocess.run(
        [sys.executable, "-m", "system.run.worker_process", *WORKER_ARGS, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=180, env=_env(env),
    )  # fmt: skip


def test_a_configuration_its_environment_refutes_ends_the_run_from_the_controller(tmp_path):
    """``troupe run gather-2p-ppo environment.args.n_agents=3``: the controller, which makes
    one environment for the run's shape, knew the error before any worker started, and left it
    to the workers: each failed on it (five "failed with the same error" lines), and one
    still starting was said to be "sent SIGTERM, not from the controller". The controller ends
    the run with it; every worker is told to stop, none fails."""
    run = tmp_path / "run"
    result = troupe(
        "run", "gather-2p-ppo", "environment.args.n_agents=3", "--run-dir", str(run),
        "--no-display",
    )  # fmt: skip
    said = result.stdout + result.stderr
    assert result.returncode == 1, said
    assert "agent_policies: lists 2 policies but environment 'GridGather-v0' has 3 agents" in said
    for never in ("failed: ConfigError", "same error", "not from the controller", "killing it"):
        assert never not in said, said
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "failed"
    assert summary["failure"].startswith("invalid experiment configuration (1 error):")
    states = {w: v["state"] for w, v in json.loads((run / "workers.json").read_text()).items()}
    assert set(states.values()) == {"stopped"}, states


def test_controller_without_keys_refuses_to_start(tmp_path):
    run_dir = _config_dir(tmp_path)
    line = assert_one_line_error(troupe("controller", str(run_dir), "--bind", "tcp://127.0.0.1:0"))
    assert "CURVE" in line and KEYS_ENV in line and "--insecure" in line, line
    assert not (run_dir / "endpoints.json").exists()  # it bound nothing


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_worker_without_keys_refuses_to_start(spelling):
    """``python -m system.run.worker_process`` once had a parser of its own: without keys it
    ran in plain text, and it took no ``--insecure`` to say that was meant."""
    line = assert_one_line_error(worker(spelling, "--controller-wait", "30"))
    assert "CURVE" in line and "--insecure" in line and "actor/0" in line, line


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_worker_waits_as_long_as_told_for_a_controller_then_says_so(spelling):
    """``--controller-wait``: Kubernetes and Slurm workers wait ten minutes for a controller
    that may come late; a wait spent still ends in the orphan's exit (3), naming the address."""
    done = worker(spelling, "--insecure", "--controller-wait", "3")
    assert done.returncode == 3, (done.stdout, done.stderr)
    said = " ".join((done.stdout + done.stderr).split())
    assert "INSECURE: worker actor/0 runs without CURVE keys" in said, said
    assert "no controller answered at tcp://127.0.0.1:9 in 3s" in said, said
    line = assert_one_line_error(worker(spelling, "--insecure", "--controller-wait", "0"))
    assert "--controller-wait must be > 0 seconds, got 0" in line, line


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_replicated_worker_takes_its_ordinal_from_the_scheduler(spelling):
    """One service, many tasks: ``actor/{ordinal}`` becomes ``actor/2`` from ``TROUPE_ORDINAL``
    (or Swarm's slot, or a pod name's ``-N``); without any, one line says what to set."""
    args = ["--id", "actor/{ordinal}", "--insecure", "--controller-wait", "1"]
    done = worker(spelling, *args, env={"TROUPE_ORDINAL": "2"})
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert "INSECURE: worker actor/2 runs" in " ".join((done.stdout + done.stderr).split())
    if re.search(r"-\d+$", socket.gethostname()):
        return  # this host's name gives an ordinal, as a pod's does
    line = assert_one_line_error(worker(spelling, *args))
    assert "needs an ordinal: set TROUPE_ORDINAL or TROUPE_SLOT" in line, line


def _starts_with_warning(
    args: list[str],
    log: Path,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    until: Callable[[], bool] | None = None,
) -> str:
    """Start ``troupe ARGS``, wait until it logs its INSECURE warning (and ``until`` holds),
    then stop it. Returns the output so far. It would run on (waiting for workers or its
    controller); the test only needs to see that it got past the key check and said so."""
    if not TROUPE.exists():
        pytest.skip(f"no console script at {TROUPE}")
    with log.open("w") as out_file:
        proc = subprocess.Popen(
            [str(TROUPE), *args],
            cwd=ROOT,
            stdout=out_file,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(env),
            start_new_session=True,  # its own group: the kill below takes any child with it
        )
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if "INSECURE" in log.read_text() and (until is None or until()):
                break
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    out = log.read_text()
    assert "INSECURE" in out, f"no warning within {timeout}s (exit {proc.returncode}):\n{out}"
    assert "refuses" not in out, out
    return out


def test_controller_with_insecure_starts_and_warns(tmp_path):
    run_dir = _config_dir(tmp_path)
    args = ["controller", str(run_dir), "--insecure", "--no-display", "--bind", "tcp://127.0.0.1:0"]
    out = _starts_with_warning(args, tmp_path / "out.log")
    assert "troupe controller" in out and "plain text" in out, out


def test_a_cluster_controller_logs_to_its_console_as_every_process_does(tmp_path):
    """TROUPE_LOG_FORMAT=json and the NOTICE console level held for every worker and for a
    local run's controller, not for ``troupe controller`` (Swarm's, Kubernetes', Slurm's and
    the Docker launcher's): it logged every INFO line in rich's format, which a log shipper
    cannot parse and which buried a Docker run's progress lines."""
    run_dir = _config_dir(tmp_path)
    file_log = run_dir / "logs" / "controller.log"

    def bound() -> bool:  # logged to the console first: the file has it, the console said it
        return file_log.exists() and "workers to start" in file_log.read_text()

    args = ["controller", str(run_dir), "--insecure", "--no-display", "--bind", "tcp://127.0.0.1:0"]
    out = _starts_with_warning(args, tmp_path / "out.log", env={"TROUPE_LOG_FORMAT": "json"},
                               until=bound)  # fmt: skip
    logged = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    insecure = [e for e in logged if "INSECURE" in e["message"]]
    assert insecure and insecure[0]["level"] == "WARNING", out
    assert insecure[0]["worker"] == "controller", out
    assert "workers to start" not in out, out  # INFO: the file's, not the console's


def test_worker_with_insecure_starts_and_warns(tmp_path):
    out = _starts_with_warning(["worker", *WORKER_ARGS, "--insecure"], tmp_path / "out.log")
    assert "actor/0" in out and "plain text" in out, out


def test_show_config_in_80_columns_is_a_block_per_key():
    """Issue 28: in 80 columns the five-column table wrapped every word; a block per key
    keeps each key, its value, type and default on one line, its doc below."""
    result = troupe("show-config", "cartpole-ppo", env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    (workers,) = [line for line in lines if line.startswith("actors.workers = ")]
    assert "(int; default 2)" in workers
