"""``troupe deploy slurm``: the sbatch script is valid bash, starts every planned worker with the
right id, and (through fake ``sbatch``/``srun``/``scontrol`` on PATH) runs a real local run.

The fakes record their arguments; the fake ``srun`` runs the wrapped command once per task with
``SLURM_PROCID`` set, as Slurm does, and the fake ``sbatch`` runs the script in the foreground as
the first node of a one-node job.
"""

from __future__ import annotations

import argparse
import json
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from distributed.deploy.commands import add_deploy_arguments, run_deploy
from distributed.deploy.manifests import DeployError

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
    assert "apptainer pull" in text and "${TROUPE_GPU:+--nv}" in text


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
