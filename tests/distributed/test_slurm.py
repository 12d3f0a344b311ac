"""``troupe deploy slurm``: the sbatch script is valid bash, starts every planned worker with the
right id, and (through fake ``sbatch``/``srun``/``scontrol`` on PATH) runs a real local run.

The fakes record their arguments; the fake ``srun`` runs the wrapped command once per task with
``SLURM_PROCID`` set, as Slurm does, and the fake ``sbatch`` runs the script in the foreground as
the first node of a one-node job.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import socket
import stat
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from rich.console import Console

from api.config import make_experiment
from distributed.deploy import commands as deploy_commands
from distributed.deploy.commands import add_deploy_arguments, run_deploy
from distributed.deploy.slurm import time_seconds
from distributed.errors import DeployError
from distributed.ops import backends
from distributed.ops.commands import run_ps
from system.run.plan import plan_workers
from system.run.worker_record import PROGRESS_S

FAKE_SRUN = r"""#!/bin/bash
printf '%s\n' "$*" >> "$FAKE_SLURM_LOG"
ntasks=1
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --ntasks=*) ntasks=${1#--ntasks=} ;;
    --export=ALL,*) IFS=, read -ra pairs <<< "${1#--export=ALL,}"
                    for p in "${pairs[@]}"; do export "${p?}"; done ;;
  esac
  shift
done
pids=()
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM
for ((i = 0; i < ntasks; i++)); do SLURM_PROCID=$i "$@" & pids+=($!); done
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
exit $status
"""
FAKE_SCONTROL = r"""#!/bin/bash
printf 'scontrol %s\n' "$*" >> "$FAKE_SLURM_LOG"
if [ "$1 $2" = "show hostnames" ]; then echo localhost; else exit 2; fi
"""
FAKE_SBATCH = r"""#!/bin/bash
printf 'sbatch %s\n' "$*" >> "$FAKE_SLURM_LOG"
export SLURM_JOB_ID=4242 SLURM_JOB_NODELIST=localhost
exec bash "$1"
"""


@pytest.fixture(autouse=True)
def runs_dir(tmp_path, monkeypatch) -> Path:
    """Where a deployment leaves its record for name lookups: the test's, not the checkout's."""
    monkeypatch.setattr(deploy_commands, "DEFAULT_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path / "runs"


def deploy(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_deploy_arguments(parser)
    return run_deploy(parser.parse_args(["slurm", *argv]), Console(file=sys.stderr))


def script(out: Path) -> str:
    return (out / "troupe.sbatch").read_text()


@pytest.mark.parametrize(
    "source",
    [
        ["--image", "registry.example.com/troupe-worker:0.1"],
        ["--image", "/shared/troupe.sif", "--container-runtime", "singularity"],
        ["--image", "registry.example.com/troupe-worker:0.1", "--container-runtime", "enroot"],
        ["--code", ".", "--venv", sys.prefix],
    ],
)
def test_the_script_is_valid_bash(tmp_path, source):
    assert deploy("gather-2p-ppo", "--out", str(tmp_path), "--run-name", "g", *source) == 0
    checked = subprocess.run(["bash", "-n", str(tmp_path / "troupe.sbatch")], capture_output=True)
    assert checked.returncode == 0, checked.stderr
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o600
    assert (tmp_path / "keys").read_text() not in script(tmp_path)


def test_one_step_per_group_with_the_planned_ids_and_gpus_on_trainers(tmp_path):
    deploy(
        "gather-2p-ppo",
        "--out",
        str(tmp_path),
        "--run-name",
        "g",
        "--partition",
        "gpu",
        "--time",
        "1-00:00:00",
        "--gpus-per-trainer",
        "2",
        "--image",
        "registry.example.com/troupe-worker:0.1",
    )
    text = script(tmp_path)
    for line in (
        "#SBATCH --ntasks=9",
        "#SBATCH --gpus=4",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=1-00:00:00",
        "export RUN_DIR=" + str(tmp_path / "run"),
    ):
        assert line in text.splitlines()
    steps = [line for line in text.splitlines() if line.startswith("srun ")]
    tails = [line.split(" bash -c ")[1] for line in steps]
    assert tails[1:] == [
        "'worker_task \"$@\"' worker parameter_service params &",
        "'worker_task \"$@\"' worker trainer 'trainer/red/{ordinal}' &",
        "'worker_task \"$@\"' worker policy 'policy/red/{ordinal}' &",
        "'worker_task \"$@\"' worker trainer 'trainer/blue/{ordinal}' &",
        "'worker_task \"$@\"' worker policy 'policy/blue/{ordinal}' &",
        "'worker_task \"$@\"' worker actor 'actor/{ordinal}' &",
        "'worker_task \"$@\"' worker actor 'eval/{ordinal}' &",
    ]
    assert '--nodelist="$CONTROLLER_HOST"' in steps[0]
    assert [("--gpus-per-task=2" in s, "--gres=none" in s) for s in steps] == [
        (False, True),
        (False, True),
        (True, False),
        (False, True),
        (True, False),
        (False, True),
        (False, True),
        (False, True),
    ]
    assert "${TROUPE_GPU:+--nv}" in text and "apptainer pull" not in text
    submit = (tmp_path / "submit.sh").read_text()
    assert (
        f"apptainer pull {tmp_path}/troupe.sif docker://registry.example.com/troupe-worker:0.1"
        in (submit)
    )
    assert submit.endswith(f'exec sbatch "$@" {tmp_path}/troupe.sbatch\n')


def sbatch_options(text: str) -> dict[str, str]:
    """``#SBATCH --key=value`` as key: value (a flag such as ``--requeue``: key: "")."""
    options = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH --"):
            key, _, value = line.removeprefix("#SBATCH --").partition("=")
            options[key] = value
    return options


def step_options(text: str, job_name: str) -> dict[str, str]:
    [step] = [
        s for s in text.splitlines() if s.startswith("srun ") and f"--job-name={job_name} " in s
    ]
    return dict(
        w.removeprefix("--").split("=", 1) for w in step.split() if w.startswith("--") and "=" in w
    )


def test_64_actors_ask_for_the_cpus_and_memory_the_roles_need_and_no_more(tmp_path):
    """Every worker is one process that keeps at most one CPU busy; its memory is the measured
    peak (actor 53, controller 208, params 52, policy 241, trainer 323 MiB) plus 25 %.
    64 actors, four policy workers (one per 16 actors: one alone let the policy lag reach 176
    versions), params, trainer, eval and the controller: 72 CPUs."""
    deploy(
        "cartpole-ppo",
        "actors.workers=64",
        "--out",
        str(tmp_path),
        "--code",
        ".",
        "--run-name",
        "c",
    )
    text = script(tmp_path)
    options = sbatch_options(text)
    assert (options["ntasks"], options["cpus-per-task"]) == ("72", "1")
    peaks = {"controller": 208, "params": 52, "trainer/default": 323, "policy/default": 241,
             "actor": 53, "eval": 53}  # fmt: skip
    replicas = {"actor": 64, "policy/default": 4}
    assert step_options(text, "policy/default")["ntasks"] == "4"
    needed = sum(peak * 1.25 * replicas.get(name, 1) for name, peak in peaks.items())
    asked = 72 * int(options["mem-per-cpu"].removesuffix("M"))
    assert needed <= asked <= needed + 72 + 16 * 72  # rounding: 16 MiB per task, 1 MiB per CPU
    for name, peak in peaks.items():
        step = step_options(text, name)
        assert step["cpus-per-task"] == "1", name
        assert peak * 1.25 <= int(step["mem-per-cpu"].removesuffix("M")) < peak * 1.25 + 16, name
    assert "gpus" not in options and "gres" not in " ".join(options)


@pytest.mark.parametrize("experiment", ["cartpole-dqn", "pendulum-sac"])
def test_an_off_policy_run_gets_a_replay_step_sized_as_its_role(tmp_path, experiment):
    assert deploy(experiment, "--out", str(tmp_path), "--code", ".", "--run-name", "o") == 0
    text = script(tmp_path)
    checked = subprocess.run(["bash", "-n", str(tmp_path / "troupe.sbatch")], capture_output=True)
    assert checked.returncode == 0, checked.stderr
    tails = [line.split(" bash -c ")[1] for line in text.splitlines() if line.startswith("srun ")]
    assert "'worker_task \"$@\"' worker replay replay/default &" in tails
    step = step_options(text, "replay/default")
    assert (step["ntasks"], step["cpus-per-task"], step["mem-per-cpu"]) == ("1", "1", "80M")
    workers = len(plan_workers(make_experiment(experiment, [])))
    assert sbatch_options(text)["ntasks"] == str(1 + workers)  # a CPU each, the controller's too
    deploy(experiment, "--out", str(tmp_path), "--code", ".", "--memory", "replay=2000",
           "--cpus", "replay=2")  # fmt: skip
    step = step_options(script(tmp_path), "replay/default")
    assert (step["cpus-per-task"], step["mem-per-cpu"]) == ("2", "1256M")  # 2000 x 1.25 -> 2512


def test_measured_figures_and_overrides_size_the_steps(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    workers = {
        "params": {"role": "parameter_service", "peak_rss_mb": 100.0},
        "trainer/default/0": {"role": "trainer", "peak_rss_mb": 3000.0},
        "actor/0": {"role": "actor", "peak_rss_mb": 80.0},
        "actor/1": {"role": "actor", "peak_rss_mb": 96.0},
        "eval/0": {"role": "actor", "peak_rss_mb": 90.0},
    }
    (run / "workers.json").write_text(json.dumps(workers))
    out = tmp_path / "deploy"
    deploy("cartpole-ppo", "--out", str(out), "--code", ".", "--measured", str(run),
           "--cpus", "trainer=4", "--memory", "policy=1000", "--gpus-per-trainer", "1")  # fmt: skip
    text = script(out)
    assert step_options(text, "actor")["mem-per-cpu"] == "128M"  # 96 x 1.25 = 120 -> 128
    assert step_options(text, "eval")["mem-per-cpu"] == "128M"  # 90 x 1.25 = 112.5 -> 128
    trainer = step_options(text, "trainer/default")
    assert (trainer["cpus-per-task"], trainer["mem-per-cpu"]) == ("4", "940M")  # 3760 / 4
    assert trainer["gpus-per-task"] == "1" and sbatch_options(text)["gpus"] == "1"
    assert step_options(text, "policy/default")["mem-per-cpu"] == "1264M"
    assert step_options(text, "controller")["mem-per-cpu"] == "272M"  # not measured: built-in
    assert sbatch_options(text)["ntasks"] == "10"  # 4 for the trainer, 1 for each of 6 others


def test_bad_sizing_options_name_the_flag(tmp_path):
    with pytest.raises(DeployError) as caught:
        deploy("cartpole-ppo", "--out", str(tmp_path), "--code", ".", "--cpus", "learner=2",
               "--cpus", "actor=0")  # fmt: skip
    assert str(caught.value) == (
        "--cpus 'learner=2': write COMPONENT=NUMBER with COMPONENT one of controller, params, "
        "trainer, policy, actor, replay, eval\n--cpus 'actor=0': must be more than 0"
    )
    with pytest.raises(DeployError, match="holds no peak_rss_mb figure"):
        (tmp_path / "w.json").write_text("{}")
        deploy("cartpole-ppo", "--out", str(tmp_path), "--code", ".", "--measured",
               str(tmp_path / "w.json"))  # fmt: skip


def test_workers_advertise_the_address_of_the_named_interface(tmp_path):
    deploy("cartpole-ppo", "--out", str(tmp_path), "--code", ".", "--interface", "ib0")
    text = script(tmp_path)
    assert 'CONTROLLER_ADDRESS="$(address_on ib0)"' in text
    assert '  address="$(address_on ib0)"' in text
    deploy("cartpole-ppo", "--out", str(tmp_path), "--code", ".")
    assert '  address="$(route_to "$CONTROLLER_ADDRESS")"' in script(tmp_path)
    address_on = next(
        line for line in script(tmp_path).splitlines() if line.startswith("address_on")
    )
    done = subprocess.run(
        ["bash", "-c", f"{address_on}\naddress_on lo"], capture_output=True, text=True
    )
    assert done.stdout.strip() == "127.0.0.1"


def test_option_errors_are_listed_together(tmp_path):
    with pytest.raises(DeployError) as caught:
        deploy(
            "cartpole-ppo",
            "--out",
            str(tmp_path),
            "--image",
            "x.sif",
            "--container-runtime",
            "none",
            "--time",
            "4h",
        )
    assert str(caught.value) == (
        "cannot write the sbatch script:\n"
        "  - --container-runtime none runs checked-out code: pass --code DIR\n"
        "  - --time 4h: write HH:MM:SS or D-HH:MM:SS"
    )


def test_a_time_limit_within_the_stop_warning_is_refused(tmp_path):
    """``--time 00:02:00`` with the default 180 s warning: the job's run was told to stop as it
    started (0 frames, exit 130), with nothing saying why."""
    with pytest.raises(DeployError, match=r"--time 00:02:00 \(120 s\) is within --stop-warning"):
        deploy("cartpole-ppo", "--out", str(tmp_path), "--image", "x.sif", "--time", "00:02:00")
    assert time_seconds("1-02:03:04") == 93784
    deploy("cartpole-ppo", "--out", str(tmp_path / "ok"), "--image", "x.sif",
           "--time", "00:02:00", "--stop-warning", "60")  # fmt: skip


def free_port() -> int:
    """A port free now, outside the kernel's ephemeral range: the controller binds it only
    later, and srun's own I/O sockets take ephemeral ports meanwhile (one took the port the
    kernel had offered here: the controller could not bind it, and the workers' ZeroMQ
    greetings reached srun as "Insane message length")."""
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    candidates = [p for p in range(20_000, 30_000) if not low <= p <= high] or [0]
    for port in random.Random().sample(candidates, min(len(candidates), 200)):
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port outside the ephemeral range")


@pytest.mark.multiprocess
def test_the_script_runs_cartpole_through_fake_slurm(tmp_path):
    bin_dir, out = tmp_path / "bin", tmp_path / "deploy"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("sbatch", FAKE_SBATCH)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    repo = Path(__file__).resolve().parents[2]
    assert (
        deploy(
            "cartpole-ppo",
            "stop.eval_return=None",
            "stop.env_frames=3000",
            "--out",
            str(out),
            "--run-name",
            "cp",
            "--code",
            str(repo),
            "--venv",
            sys.prefix,
        )
        == 0
    )
    log = tmp_path / "slurm.log"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "FAKE_SLURM_LOG": str(log),
        "TROUPE_CONTROLLER_PORT": str(free_port()),
        "HOME": str(tmp_path),
    }
    done = subprocess.run(
        ["sbatch", str(out / "troupe.sbatch")], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = out / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "env_frames"
    workers = json.loads((run / "workers.json").read_text())
    assert sorted(workers) == sorted(
        ["params", "trainer/default/0", "policy/default/0", "actor/0", "actor/1", "eval/0"]
    )
    assert all(w["state"] == "stopped" and w["restarts"] == 0 for w in workers.values())
    assert stat.S_IMODE((run / "keys").stat().st_mode) == 0o600
    calls = log.read_text().splitlines()
    assert calls[:2] == [f"sbatch {out / 'troupe.sbatch'}", "scontrol show hostnames localhost"]
    started = sorted(c.rsplit(" worker ", 1)[1] for c in calls if "worker_task" in c)
    assert started == [
        "actor actor/{ordinal}",
        "actor eval/{ordinal}",
        "parameter_service params",
        "policy policy/default/{ordinal}",
        "trainer trainer/default/{ordinal}",
    ]


# --------------------------------------------------------------------- a real Slurm
def slurm_answers() -> bool:
    try:
        done = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and "UP" in done.stdout


needs_slurm = pytest.mark.skipif(
    not slurm_answers(), reason="no Slurm controller answers: run .ci/slurm-setup as root"
)


@pytest.fixture(scope="session")
def no_jobs_of_earlier_sessions(left_by_earlier_sessions):
    """Cancel the jobs an earlier, killed pytest session left in the queue: one still running
    holds the node's CPUs, and this session's jobs would wait behind it. Only jobs whose script
    lies in an earlier session's temporary folder are cancelled."""
    queued = subprocess.run(
        ["squeue", "--noheader", "--format=%i %o"], capture_output=True, text=True, timeout=20
    )
    for line in queued.stdout.splitlines():
        job, _, command = line.partition(" ")
        if command and left_by_earlier_sessions(command.split()[0]):
            warnings.warn(
                f"cancelling Slurm job {job}, left by an earlier test session", stacklevel=2
            )
            subprocess.run(["scancel", job], check=False, timeout=20)


def submit(out: Path, *sbatch_args: str, env: dict | None = None) -> str:
    done = subprocess.run(
        [str(out / "submit.sh"), "--parsable", *sbatch_args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def job_fields(job_id: str) -> dict[str, str]:
    shown = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True
    )
    return dict(f.split("=", 1) for f in shown.stdout.split() if "=" in f)


@pytest.mark.slurm
@needs_slurm
@pytest.mark.usefixtures("no_jobs_of_earlier_sessions")
def test_slurm_itself_reads_the_64_actor_request_as_72_cpus_and_the_measured_memory(tmp_path):
    deploy(
        "cartpole-ppo",
        "actors.workers=64",
        "--out",
        str(tmp_path),
        "--code",
        ".",
        "--run-name",
        "c",
    )
    job = submit(tmp_path, "--hold")
    try:
        fields = job_fields(job)
    finally:
        subprocess.run(["scancel", job], check=False)
    assert fields["NumCPUs"] == "72" and fields["CPUs/Task"] == "1"
    tres = dict(item.split("=") for item in fields["TRES"].split(","))
    mem_per_cpu = int(sbatch_options(script(tmp_path))["mem-per-cpu"].removesuffix("M"))
    assert (tres["cpu"], tres["mem"]) == ("72", f"{72 * mem_per_cpu}M")
    assert "gres/gpu" not in tres


@pytest.mark.slurm
@pytest.mark.multiprocess
@needs_slurm
@pytest.mark.usefixtures("no_jobs_of_earlier_sessions")
def test_cartpole_runs_as_a_real_slurm_job(tmp_path, runs_dir):
    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "deploy"
    overrides = ("stop.eval_return=None", "stop.env_frames=3000")
    options = ("--run-name", "cp", "--code", str(repo), "--venv", sys.prefix, "--time", "00:10:00")
    deploy("cartpole-ppo", *overrides, "--out", str(out), *options)
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "TROUPE_CONTROLLER_PORT": str(free_port())}
    job = submit(out, env=env)
    try:
        for _ in range(300):  # COMPLETING: its script has ended, Slurm is cleaning up after it
            if job_fields(job).get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING",
                                                       "COMPLETING"):  # fmt: skip
                break
            time.sleep(1)
        fields = job_fields(job)
    finally:
        subprocess.run(["scancel", job], check=False)
    log = next(out.glob("slurm-*.out")).read_text()
    assert fields["JobState"] == "COMPLETED", log[-3000:]
    summary = json.loads((out / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "env_frames"
    workers = json.loads((out / "run" / "workers.json").read_text())
    assert len(workers) == 6 and all(w["state"] == "stopped" for w in workers.values())
    endpoints = json.loads((out / "run" / "endpoints.json").read_text())
    assert endpoints["controller"].startswith("tcp://127.0.0.1:")  # vm's address, not its name
    # found by its name once the job has left squeue (it was not: "no run 'cp'")
    assert not subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout
    found = backends.resolve("cp", runs_dir)
    assert (found.launcher, found.job_id, found.folder()) == ("slurm", job, out / "run")
    listed = Console(record=True, width=300)
    assert run_ps(argparse.Namespace(run=None, runs_dir=str(runs_dir)), listed) == 0
    said = listed.export_text()
    assert re.search(r"│ cp +│ slurm +│ ended \(env_frames\) +│", said), said


@pytest.mark.slurm
@pytest.mark.multiprocess
@needs_slurm
@pytest.mark.usefixtures("no_jobs_of_earlier_sessions")
def test_status_logs_and_stop_of_a_real_slurm_job(tmp_path):
    """The operations commands on a Slurm run, named by its deploy folder: the job writes its id
    into the run folder's launch record; stop signals the controller step, which stops the run
    in order and ends the job."""
    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "deploy"
    overrides = ("stop.eval_return=None", "stop.env_frames=100000000")
    options = ("--run-name", "ops", "--code", str(repo), "--venv", sys.prefix, "--time", "00:10:00")
    deploy("cartpole-ppo", *overrides, "--out", str(out), *options)
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "TROUPE_CONTROLLER_PORT": str(free_port())}
    job = submit(out, env=env)
    troupe = [sys.executable, "-m", "distributed.cli"]

    def ops(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([*troupe, *argv], capture_output=True, text=True, timeout=300,
                              cwd=repo, env={**os.environ, "COLUMNS": "200"})  # fmt: skip

    try:
        workers = out / "run" / "workers.json"
        for _ in range(300):
            table = json.loads(workers.read_text()) if workers.exists() else {}
            if len(table) == 6 and all(w["state"] == "alive" for w in table.values()):
                break
            assert job_fields(job).get("JobState") in ("PENDING", "RUNNING", "CONFIGURING")
            time.sleep(1)
        status = ops("status", str(out))
        assert status.returncode == 0, status.stderr
        assert "run ops (slurm): running" in status.stdout, status.stdout
        assert f"job {job}" in status.stdout and "controller" in status.stdout, status.stdout
        steps = [line.split() for line in status.stdout.splitlines() if "step " in line]
        assert steps and all("RUNNING" in row for row in steps), status.stdout  # not "%T"
        # by its name alone: squeue finds the job (once scontrol ping says the controller is up)
        by_name = ops("ps", "ops")
        assert by_name.returncode == 0 and f"job {job}" in by_name.stdout, by_name.stdout
        logs = ops("logs", str(out), "--worker", "actor/0")
        assert "actor/0 ready" in logs.stdout, logs.stdout + logs.stderr
        stop = ops("stop", str(out))
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert f"sent SIGINT to step {job}." in stop.stdout, stop.stdout
        assert "run 'ops' ended: interrupted" in stop.stdout, stop.stdout
    finally:
        subprocess.run(["scancel", job], check=False)
    assert json.loads((out / "run" / "summary.json").read_text())["stop_reason"] == "interrupted"


def test_policy_workers_scale_with_actors_unless_the_user_sets_them(tmp_path):
    deploy("cartpole-ppo", "actors.workers=40", "--out", str(tmp_path / "a"), "--code", ".")
    assert step_options(script(tmp_path / "a"), "policy/default")["ntasks"] == "3"
    deploy("cartpole-ppo", "actors.workers=40", "policies.default.policy_workers=1", "--out",
           str(tmp_path / "b"), "--code", ".")  # fmt: skip
    assert step_options(script(tmp_path / "b"), "policy/default")["ntasks"] == "1"


def test_the_script_asks_for_requeue_and_an_orderly_stop_before_the_time_limit(tmp_path):
    deploy("cartpole-ppo", "--out", str(tmp_path), "--code", ".", "--run-name", "c")
    options = sbatch_options(script(tmp_path))
    assert "requeue" in options and options["signal"] == "INT@180"
    assert options["open-mode"] == "append"
    deploy("cartpole-ppo", "--out", str(tmp_path / "b"), "--code", ".", "--run-name", "c",
           "--no-requeue", "--stop-warning", "0")  # fmt: skip
    options = sbatch_options(script(tmp_path / "b"))
    assert "no-requeue" in options and "signal" not in options


def release_at_once(job: str) -> None:
    """Slurm holds a requeued job until a begin time 121 s on (measured here): make it eligible
    now, as an administrator can, so the check waits on Troupe's resume and not on the hold."""
    for _ in range(120):
        if job_fields(job).get("JobState") == "PENDING":
            break
        time.sleep(0.5)
    subprocess.run(
        ["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, capture_output=True
    )


@pytest.mark.slurm
@pytest.mark.multiprocess
@needs_slurm
@pytest.mark.usefixtures("no_jobs_of_earlier_sessions")
def test_a_requeued_job_resumes_its_run_from_the_last_version(tmp_path):
    """What a preemption does to a job (`scontrol requeue`: every step ended, the job queued
    again): the requeued job's controller resumes the run from its folder, so frames and
    versions go on from where they were, and the run still ends at its stopping rule."""
    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "deploy"
    overrides = ("stop.eval_return=None", "stop.env_frames=60000")
    options = ("--run-name", "rq", "--code", str(repo), "--venv", sys.prefix, "--time", "00:10:00")
    deploy("cartpole-ppo", *overrides, "--out", str(out), *options)
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "TROUPE_CONTROLLER_PORT": str(free_port())}
    job = submit(out, env=env)
    run = out / "run"
    try:
        for _ in range(300):
            metrics = run / "metrics.jsonl"
            lines = metrics.read_text().splitlines() if metrics.exists() else []
            if lines and json.loads(lines[-1]).get("env_frames", 0) > 15000:
                break
            assert job_fields(job).get("JobState") in ("PENDING", "RUNNING", "CONFIGURING")
            time.sleep(0.5)
        subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True)
        release_at_once(job)
        for _ in range(600):
            if job_fields(job).get("JobState") == "COMPLETED":
                break
            time.sleep(1)
        fields = job_fields(job)
    finally:
        subprocess.run(["scancel", job], check=False)
    log = next(out.glob("slurm-*.out")).read_text()
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", log[-3000:]
    assert "resuming it from its last persisted version" in log
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "env_frames" and summary["env_frames"] >= 60000
    frames = [json.loads(line).get("env_frames") or 0 for line in
              (run / "metrics.jsonl").read_text().splitlines()]  # fmt: skip
    assert frames == sorted(frames), "frames went back: the run started over"
    versions = sorted(int(p.stem[1:]) for p in (run / "checkpoints" / "default").glob("v*.ckpt"))
    assert summary["policy_versions"]["default"] >= versions[-1] > 0


def worker_task_script(tmp_path, worker: str, *, procid=1, max_restarts=2, progress_s=60) -> str:
    """The script's own ``worker_task`` loop, to be run by bash, around a stand-in worker:
    ``troupe_run`` runs ``worker``, bash lines where ``$calls`` is the number of its call."""
    deploy("cartpole-ppo", "--out", str(tmp_path), "--run-name", "k",
           "--image", "registry.example.com/troupe-worker:0.1")  # fmt: skip
    text = script(tmp_path)
    functions = text[text.index("ended_by() {") : text.index("export -f troupe_run")]
    count = tmp_path / "calls"
    return f"""
set -euo pipefail
route_to() {{ echo 127.0.0.1; }}
troupe_run() {{
  echo x >> {count}
  local calls
  calls="$(wc -l < {count})"
{worker}
}}
export SLURM_PROCID={procid} SLURM_JOB_ID=42 MAX_RESTARTS={max_restarts} PROGRESS_S={progress_s}
export CONTROLLER=tcp://x:1 CONTROLLER_ADDRESS=x
{functions}
worker_task actor 'actor/{{ordinal}}'
"""


def run_bash(text: str, *prefix: str) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, "bash", "-c", text], capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def worker_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("worker ")]


def test_a_worker_task_says_how_its_worker_ended_before_restarting_it(tmp_path):
    """The script's own restart loop, run by bash with a worker that is SIGKILLed, then exits 1,
    then runs to its stop: it said only "failed" (the controller sees a worker gone silent). A
    worker whose controller is gone (exit 3) is not restarted: each waited for a controller that
    no longer was, until the job cancelled its steps a minute later."""
    stand_in = worker_task_script(tmp_path, """  case "$calls" in  # killed, exit 1, its stop
    1) sh -c 'kill -KILL $$' ;;
    2) sh -c 'exit 1' ;;
    *) return 0 ;;
  esac""")  # fmt: skip
    count = tmp_path / "calls"
    done = run_bash(stand_in)
    assert done.returncode == 0, done.stderr
    assert worker_lines(done) == [  # (bash's own "Killed" notice aside)
        "worker actor/1 (task 1) was killed by SIGKILL (exit code 137; out of memory? sacct -j "
        "42 says OUT_OF_MEMORY if so); restart 1 of 2",
        "worker actor/1 (task 1) exited with code 1; restart 2 of 2",
    ]
    count.write_text("x\n")  # from the second run on: exit 1 every time
    done = run_bash(stand_in.replace("*) return 0 ;;", "*) sh -c 'exit 1' ;;"))
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "worker actor/1 (task 1) exited with code 1; not restarted: it failed 3 times in a row"
    )
    count.write_text("x\n")  # exit 3 from the second run on: orphaned
    orphaned = stand_in.replace("*) return 0 ;;", "*) sh -c 'exit 3' ;;")
    done = run_bash(orphaned.replace("2) sh -c 'exit 1' ;;", "2) sh -c 'exit 3' ;;"))
    assert done.returncode == 3
    assert done.stderr.splitlines()[-1] == (
        "worker actor/1 (task 1) left: its controller is gone; not restarted"
    )


def test_a_worker_task_waits_ten_minutes_for_a_controller_that_comes_late(tmp_path):
    """No one restarts a worker that gave up on its controller (exit 3): one that waited its
    default minute while a controller started again waited up to 3 minutes for the run
    folder's lock was lost for the whole job."""
    said = tmp_path / "args"
    done = run_bash(worker_task_script(tmp_path, f'  echo "$@" > {said}; return 0'))
    assert done.returncode == 0, done.stderr
    args = said.read_text().split()
    assert args[args.index("--controller-wait") + 1] == "600", args
    assert args[:2] == ["worker", "--role"]


def test_a_worker_task_counts_failures_in_a_row_not_in_the_whole_job(tmp_path):
    """A worker that fails now and then, running a while in between (a flaky simulator, a node's
    hiccup), was given up on at its fourth failure of a days-long job: the task counted every
    failure. It now counts, as the controller does, those in a row without running PROGRESS_S
    (here 2 s): the worker that ran 2.2 s before each of its five failures is restarted each
    time; one that fails at once is still given up on."""
    worker = """  if [ "$calls" -gt 5 ]; then return 0; fi  # 2.2 s, then exit 1, five times
  sleep 2.2; sh -c 'exit 1'"""
    stand_in = worker_task_script(tmp_path, worker, procid=0, progress_s=2)
    assert f"\nexport PROGRESS_S={PROGRESS_S:.0f}  #" in script(tmp_path)  # the controller's
    done = run_bash(stand_in)
    assert done.returncode == 0, done.stderr
    assert worker_lines(done) == ["worker actor/0 (task 0) exited with code 1; restart 1 of 2"] * 5
    (tmp_path / "calls").unlink()
    done = run_bash(stand_in.replace("sleep 2.2; ", ""))
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].endswith("not restarted: it failed 3 times in a row")


def test_a_worker_task_restarts_a_worker_sent_sigterm_alone(tmp_path):
    """A SIGTERM to the whole step (the job's end, ``scancel``) reaches the task's bash too,
    which ends there and restarts nothing. One that reaches the worker alone (``kill PID`` on
    its node) leaves the job running and the controller waiting for the worker: it was not
    restarted, and the run failed 60 s later (seen on the real Slurm here)."""
    # stopped alone by its controller after a SIGTERM (exit 143), then its stop
    worker = """  if [ "$calls" -eq 1 ]; then sh -c 'exit 143'; else return 0; fi"""
    stand_in = worker_task_script(tmp_path, worker, procid=0, max_restarts=3)
    done = run_bash(stand_in)
    assert done.returncode == 0, done.stderr
    assert worker_lines(done) == [
        "worker actor/0 (task 0) left on a SIGTERM sent to it alone (one to its step would have "
        "ended this loop too); restart 1 of 3"
    ]
    # the whole step signalled: bash ends with its worker, and nothing restarts it
    (tmp_path / "calls").unlink()
    step = run_bash(stand_in.replace("sh -c 'exit 143'", "kill -TERM 0; sleep 5"), "setsid")
    assert step.returncode == -signal.SIGTERM, step.stderr
    assert (tmp_path / "calls").read_text() == "x\n" and "restart" not in step.stderr


def ops_command(repo: Path, *argv: str) -> subprocess.CompletedProcess:
    """``troupe ARGV`` as an operator runs it, in its own process."""
    return subprocess.run([sys.executable, "-m", "distributed.cli", *argv], capture_output=True,
                          text=True, timeout=300, cwd=repo,
                          env={**os.environ, "COLUMNS": "200"})  # fmt: skip


@pytest.mark.slurm
@needs_slurm
@pytest.mark.usefixtures("no_jobs_of_earlier_sessions")
def test_a_stop_while_the_job_waits_in_the_queue_cancels_it(tmp_path):
    """`troupe stop` of a job that has not left the queue: said "no controller step running"
    and did nothing, and the job started later and ran on as if never stopped."""
    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "deploy"
    deploy("cartpole-ppo", "stop.eval_return=None", "--out", str(out), "--run-name", "held",
           "--code", str(repo), "--venv", sys.prefix, "--time", "00:10:00")  # fmt: skip
    job = submit(out, "--hold")  # pending until released: it cannot start under the test
    try:
        stop = ops_command(repo, "stop", str(out), "--wait", "60")
        state = job_fields(job).get("JobState")
    finally:
        subprocess.run(["scancel", job], check=False)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert f"job {job} was still waiting in the queue (JobHeldUser): cancelled it" in stop.stdout
    assert state == "CANCELLED", stop.stdout


def hold_the_controller(out: Path, where: str) -> None:
    """Make the job's controller wait for ``out/go`` before it starts: ``before`` its step
    (the job runs, no controller step yet), or ``inside`` it (the step runs, the controller's
    process has not started), the moments a stop right after the submit meets."""
    text = script(out)
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("srun --nodes=1 --ntasks=1"))
    wait = 'until [ -f "$RUN_DIR/../go" ]; do sleep 0.2; done'
    if where == "before":
        lines.insert(at, wait)
    else:
        start = "bash -c 'troupe_run controller"
        lines[at] = lines[at].replace(start, start.replace("'", f"'{wait}; "))
    assert "\n".join(lines) != text
    (out / "troupe.sbatch").write_text("\n".join(lines) + "\n")


@pytest.mark.slurm
@pytest.mark.multiprocess
@needs_slurm
@pytest.mark.usefixtures("no_jobs_of_earlier_sessions")
@pytest.mark.parametrize("where", ["before", "inside"])
def test_a_stop_before_the_controller_starts_stops_the_run_in_order(tmp_path, where):
    """`troupe stop` after the job started, before its controller did: the stop was lost (no
    controller step: nothing sent, the run went on) or killed the controller as it started (a
    SIGINT to a step whose controller was still importing: a traceback, no summary, workers
    left running). Now it is written into the run folder, and the controller, as it starts,
    starts no worker, writes its summary (interrupted) and exits 130, as a stopped run does."""
    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "deploy"
    overrides = ("stop.eval_return=None", "stop.env_frames=100000000")
    options = ("--run-name", f"early-{where}", "--code", str(repo), "--venv", sys.prefix,
               "--time", "00:10:00")  # fmt: skip
    deploy("cartpole-ppo", *overrides, "--out", str(out), *options)
    hold_the_controller(out, where)
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "TROUPE_CONTROLLER_PORT": str(free_port())}
    job = submit(out, env=env)
    run = out / "run"
    try:
        for _ in range(300):  # the job runs, and the controller waits for out/go
            steps = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%j"],
                                   capture_output=True, text=True).stdout.split()  # fmt: skip
            if (run / "launch.json").exists() and ("controller" in steps or where == "before"):
                break
            assert job_fields(job).get("JobState") in ("PENDING", "RUNNING", "CONFIGURING")
            time.sleep(0.5)
        stop = ops_command(repo, "stop", str(out), "--wait", "0")
        (out / "go").touch()
        for _ in range(300):
            if job_fields(job).get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING"):
                break
            workers = run / "workers.json"
            table = json.loads(workers.read_text() or "{}") if workers.exists() else {}
            assert not any(w.get("state") == "alive" for w in table.values()), "it ran on"
            time.sleep(1)
        fields = job_fields(job)
    finally:
        subprocess.run(["scancel", job], check=False)
    log = next(out.glob("slurm-*.out")).read_text()
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert f"job {job} has not started its controller yet" in stop.stdout, stop.stdout
    assert fields["JobState"] != "RUNNING", log[-3000:]
    assert "controller exited with 130" in log, log[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["env_frames"] == 0
    assert not (run / "stop-request.json").exists()  # taken: a resume of the folder runs
