"""A user's own file reaches every worker: a script's registrations, ``--import``, and a worker
that cannot find the user's code failing the run at once with the real cause; ``troupe.train``'s
launcher checked before anything is made."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from system.run.report import read_metrics

HERE = Path(__file__).resolve().parent
CORRIDOR = HERE / "user_code" / "corridor.py"
A2C = HERE / "user_code" / "a2c.py"
ROOT = HERE.parents[1]


def _run(
    args: list[str], cwd: Path, timeout: float = 300, stdin: str | None = None, env=None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, input=stdin
    )


def _only_run(cwd: Path) -> Path:
    (run_dir,) = (cwd / "runs").iterdir()
    return run_dir


def test_readme_shows_the_corridor_script_as_tested():
    readme = (ROOT / "README.md").read_text()
    assert CORRIDOR.read_text().strip() in readme


@pytest.mark.multiprocess
def test_a_script_registered_in_its_main_block_trains_in_worker_processes(tmp_path):
    """The README example: register() under ``if __name__ == "__main__":``, then troupe.train."""
    script = tmp_path / "corridor.py"
    script.write_text(
        CORRIDOR.read_text().replace('"frames=100000"', '"frames=4000", "stop.eval_return=None"')
    )
    result = _run([sys.executable, str(script)], cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    run_dir = _only_run(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "env_frames", summary
    assert summary["target_source"] == "given: stop.eval_return=None", summary  # not the recipe's
    config = json.loads((run_dir / "config.json").read_text())
    (registration,) = config["code"]["registrations"]
    assert registration["entry_point"] == "__main__:Corridor"
    assert registration["source"] == str(script.resolve())
    assert registration["kwargs"] == {"length": 6}
    workers = json.loads((run_dir / "workers.json").read_text())
    assert all(w["restarts"] == 0 for w in workers.values()), workers
    # the env's info at episode end reaches the metrics
    assert any("episode_info/steps_to_exit" in r for r in read_metrics(run_dir))


def test_readme_shows_the_a2c_trainer_script_as_tested():
    readme = (ROOT / "README.md").read_text()
    assert A2C.read_text().strip() in readme


@pytest.mark.multiprocess
def test_the_readme_trainer_passes_the_pipeline_trains_and_resumes_with_its_state(tmp_path):
    """The README's own trainer: test_pipeline, a run, then ``troupe run --resume`` from the
    command line, whose workers import the script again and restore the optimiser and the
    step count from what its get_checkpoint saved."""
    script = tmp_path / "a2c.py"
    script.write_text(
        A2C.read_text().replace(
            '"stop.env_frames=300000"', '"stop.env_frames=6000", "stop.eval_return=None"'
        )
    )
    result = _run([sys.executable, str(script)], cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "policy 'default' (a2c): 3 trainer steps, versions [1, 2, 3]" in result.stdout
    run_dir = _only_run(tmp_path)
    first = json.loads((run_dir / "summary.json").read_text())
    assert first["stop_reason"] == "env_frames" and first["trainer_steps"] > 0, first
    troupe = str(Path(sys.executable).parent / "troupe")
    # twice what it made, not a fixed 12000: the stop counts frames stepped while the actors
    # were told to stop, and on a loaded machine a 6000-frame run ended at 12113
    more = f"stop.env_frames={2 * first['env_frames']}"
    resumed = _run([troupe, "run", "--resume", str(run_dir), "--no-display", more], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    log = (run_dir / "logs" / "trainer-default-0.log").read_text()
    # the final version persists every step taken, the summary's count maybe one less (a step
    # taken during the stop, after the controller's last record); A2C steps once a version
    restored = re.search(r"trainer state of version (\d+) restored at step (\d+)", log)
    assert restored, log[-2000:]
    version, step = map(int, restored.groups())
    assert step == version >= first["trainer_steps"], (restored.group(0), first)
    second = json.loads((run_dir / "summary.json").read_text())
    assert second["trainer_steps"] > step, (step, second)


GYM_SCRIPT = """
import gymnasium as gym
import numpy as np

import troupe
from api import registry

registry.environments.names()  # Troupe lists gymnasium's ids before this file adds its own


class Coin(gym.Env):
    observation_space = gym.spaces.Box(0, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), float(action), self.t >= 10, False, {}


gym.register("ScriptCoin-v0", entry_point=Coin)

if __name__ == "__main__":
    result = troupe.train("ScriptCoin-v0", ["frames=3000", "stop.eval_return=None"])
    raise SystemExit(result.exit_code)
"""


@pytest.mark.multiprocess
def test_a_script_that_registers_a_gymnasium_env_trains_it(tmp_path):
    """``gym.register`` in a script, then ``troupe.train`` on the id: the controller knew the
    id but every worker failed ("unknown environment 'ScriptCoin-v0'"), the run exiting 1."""
    script = tmp_path / "coin.py"
    script.write_text(GYM_SCRIPT)
    result = _run([sys.executable, str(script)], cwd=tmp_path)
    out = result.stdout[-2000:] + result.stderr[-3000:]
    assert result.returncode == 0, out
    assert "Overriding environment" not in out  # no process ran the script's top level twice
    summary = json.loads((_only_run(tmp_path) / "summary.json").read_text())
    assert summary["stop_reason"] == "env_frames", summary
    config = json.loads((_only_run(tmp_path) / "config.json").read_text())
    (registration,) = config["code"]["registrations"]
    assert registration["name"] == "ScriptCoin-v0"
    assert registration["requires"] == [str(script.resolve())]


@pytest.mark.multiprocess
def test_a_script_without_its_main_guard_fails_at_once_saying_so(tmp_path):
    """``troupe.train`` at a script's top level, no ``if __name__ == "__main__":``: every
    worker that imported the script started a run of its own, nested, each waiting for its
    own, printing nothing; the command never ended."""
    script = tmp_path / "noguard.py"
    corridor = CORRIDOR.read_text().split('if __name__ == "__main__":')[0]
    script.write_text(corridor + 'register("Corridor-v0", Corridor, length=4)\n'
                      'result = troupe.train("Corridor-v0", ["frames=2000"])\n'
                      "raise SystemExit(result.exit_code)\n")  # fmt: skip
    result = _run([sys.executable, str(script)], cwd=tmp_path, timeout=120)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    summary = json.loads((_only_run(tmp_path) / "summary.json").read_text())  # only one run
    assert summary["stop_reason"] == "failed"
    assert (f"troupe.train() was called while Troupe imported {script.resolve()} to load your "
            "components") in summary["failure"]  # fmt: skip
    assert 'put the call under if __name__ == "__main__":' in summary["failure"]


INTERACTIVE = """
from api.errors import UserError

register("CellCorridor-v0", Corridor, length=4)
for name in ("ScriptCoin-v0", "CellCorridor-v0"):
    try:
        troupe.train(name, ["frames=2000"])
    except UserError as e:
        print("REFUSED", e)
    print(troupe.test_pipeline(name, trainer_steps=1))


class Evals:
    def on_evaluation(self, mean_return, episodes):
        return {"cell_eval": mean_return}


troupe.register_callback("cell-evals", Evals)
for where in ("callbacks", "actor_callbacks"):  # the controller's too: another process
    try:
        troupe.train("CartPole-v1", ["frames=3000", where + '=[{"type": "cell-evals"}]'])
    except UserError as e:
        print("REFUSED", e)
"""


@pytest.mark.parametrize("how", ["stdin", "-c"])
def test_code_of_an_interactive_session_is_refused_before_a_run_starts(tmp_path, how):
    """A notebook's classes (here code piped to ``python -``, whose ``__main__`` file is
    ``<stdin>``, and ``python -c``, with none, as a notebook's) exist in its process only. A run
    of them failed once started: every worker "unknown environment" (a gymnasium id) or a
    traceback importing ``<stdin>`` in the launcher itself. Now ``train`` refuses both before
    a run folder is made, and ``troupe.test_pipeline`` checks them in that process. So are
    callbacks, the controller's too (a fork, its ``__main__`` emptied of the session's)."""
    corridor = CORRIDOR.read_text().split('if __name__ == "__main__":')[0]
    code = GYM_SCRIPT.split('if __name__ == "__main__":')[0] + corridor + INTERACTIVE
    if how == "stdin":
        result = _run([sys.executable, "-"], cwd=tmp_path, stdin=code)
    else:
        result = _run([sys.executable, "-c", code], cwd=tmp_path)
    out = result.stdout + result.stderr[-3000:]
    assert result.returncode == 0, out
    refusals = [line for line in result.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(refusals) == 4, out
    for line, what in zip(
        refusals,
        ["environment 'ScriptCoin-v0'", "environment 'CellCorridor-v0'"]
        + ["callback 'cell-evals'"] * 2,
    ):
        assert f"{what}: defined in this interactive session" in line, line
    assert result.stdout.count("pipeline ok") == 2, out
    assert not (tmp_path / "runs").exists()


@pytest.mark.multiprocess
def test_troupe_run_import_registers_a_file_in_every_worker(tmp_path):
    module = tmp_path / "my_corridor.py"
    text = CORRIDOR.read_text().split('if __name__ == "__main__":')[0]
    module.write_text(text + '\nregister("Corridor-v0", Corridor, length=6)\n')
    result = _run(
        [sys.executable, "-m", "distributed.cli", "run", "--import", str(module), "Corridor-v0",
         "frames=3000", "stop.eval_return=None", "--no-display"],
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    summary = json.loads((_only_run(tmp_path) / "summary.json").read_text())
    assert summary["stop_reason"] == "env_frames"
    # the same file for the checks before a run (test-env took no --import before)
    for check, said in ((["test-env", "--import", str(module), "Corridor-v0", "length=4"],
                         "Corridor-v0: passed"),
                        (["test-pipeline", "--import", str(module), "Corridor-v0"],
                         "pipeline ok")):  # fmt: skip
        result = _run([sys.executable, "-m", "distributed.cli", *check], cwd=tmp_path)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        assert said in result.stdout, result.stdout


@pytest.mark.multiprocess
def test_a_run_whose_code_has_moved_is_evaluated_and_resumed_with_its_new_place(tmp_path):
    """A run folder kept while its user file moved (another checkout, another machine) could
    be neither evaluated (`troupe eval` took no --import) nor resumed (the recorded path was
    imported first, and failed): the file of its name given with --import stands for it."""
    old, new = tmp_path / "old" / "my_corridor.py", tmp_path / "new" / "my_corridor.py"
    old.parent.mkdir()
    text = CORRIDOR.read_text().split('if __name__ == "__main__":')[0]
    old.write_text(text + '\nregister("Corridor-v0", Corridor, length=6)\n')
    cli = [sys.executable, "-m", "distributed.cli"]
    run_dir = tmp_path / "run"
    result = _run([*cli, "run", "--import", str(old), "Corridor-v0", "frames=3000",
                   "stop.eval_return=None", "--run-dir", str(run_dir), "--no-display"],
                  cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    new.parent.mkdir()
    old.rename(new)
    result = _run([*cli, "eval", str(run_dir), "--episodes", "2"], cwd=tmp_path)
    assert result.returncode == 1
    assert f"name it: --import NEW/PATH/{new.name}" in " ".join(result.stderr.split())
    result = _run([*cli, "eval", str(run_dir), "--episodes", "2", "--import", str(new)],
                  cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "2 greedy episodes" in result.stdout
    load = (
        f"import troupe; print(troupe.load_policy({str(run_dir)!r}, imports=[{str(new)!r}]).name)"
    )
    result = _run([sys.executable, "-c", load], cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.split()[-1] == "default", result.stderr
    result = _run([*cli, "run", "--resume", str(run_dir), "frames=6000", "--import", str(new),
                   "--no-display"], cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["env_frames"] >= 6000
    code = json.loads((run_dir / "config.json").read_text())["code"]
    assert code["imports"] == [str(new)]  # its workers, and the next resume, look there
    assert {r["source"] for r in code["registrations"]} == {str(new)}


def test_troupe_deploy_import_records_the_file_for_the_clusters_workers(tmp_path):
    """``troupe deploy k8s|slurm --import my_corridor.py Corridor-v0``, as ``troupe run
    --import`` takes it: deploy had no --import, so a file's environment could not be deployed
    (only an experiment file naming it in ``code.imports`` could). The workers read the run's
    config.json: it holds the file (found in the image's /opt/troupe/user on a node where its
    path is not: ``troupe image build --add``). Swarm: ``tests/docker/test_swarm.py``."""
    module = tmp_path / "my_corridor.py"
    text = CORRIDOR.read_text().split('if __name__ == "__main__":')[0]
    module.write_text(text + '\nregister("Corridor-v0", Corridor, length=6)\n')
    deploy = [sys.executable, "-m", "distributed.cli", "deploy"]
    code = ["--import", str(module), "Corridor-v0", "stop.env_frames=3000"]
    # no Docker engine here: the image is not pinned nor checked for the file (as on a machine
    # without one; tests/docker/test_k8s_pods.py checks an image this engine holds)
    no_engine = {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    k8s = _run([*deploy, "k8s", *code, "--out", "k8s"], cwd=tmp_path, env=no_engine)
    assert k8s.returncode == 0, k8s.stderr[-3000:]
    (config_map,) = (tmp_path / "k8s" / "base").glob("*-configmap-*-config.yaml")
    assert str(module) in config_map.read_text()
    slurm = _run([*deploy, "slurm", *code, "--image", "w.sif", "--out", "slurm"], cwd=tmp_path)
    assert slurm.returncode == 0, slurm.stderr[-3000:]
    config = json.loads((tmp_path / "slurm" / "config.json").read_text())
    assert config["code"]["imports"] == [str(module)]
    assert config["environment"]["type"] == "Corridor-v0"
    (registration,) = config["code"]["registrations"]
    assert registration["entry_point"] == "my_corridor:Corridor"
    assert registration["source"] == str(module)


@pytest.mark.multiprocess
def test_troupe_imports_a_package_of_the_folder_it_runs_in(tmp_path):
    """``my_envs/`` beside the user, not installed, registering by dotted name as the docs
    show: the ``troupe`` command (not ``python -m``, which has the folder on its path anyway)
    imports ``--import my_envs.corridor`` from there, and its workers and a later ``troupe
    eval`` from another folder find it by the file config.json records beside the name."""
    package = tmp_path / "my_envs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    text = CORRIDOR.read_text().split('if __name__ == "__main__":')[0]
    (package / "corridor.py").write_text(
        text + '\nregister("Corridor-v0", "my_envs.corridor:Corridor", length=4)\n'
    )
    troupe = str(Path(sys.executable).with_name("troupe"))
    args = ["--import", "my_envs.corridor", "Corridor-v0"]
    result = _run([troupe, "test-pipeline", *args], cwd=tmp_path)
    assert result.returncode == 0 and "pipeline ok" in result.stdout, result.stderr[-3000:]
    run = [troupe, "run", *args, "frames=2000", "stop.eval_return=None", "--run-dir", "r"]
    result = _run([*run, "--no-display"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["code"]["imports"] == ["my_envs.corridor"]
    assert config["code"]["sources"] == {"my_envs.corridor": str(package / "corridor.py")}
    result = _run([troupe, "eval", str(tmp_path / "r"), "--episodes", "2"], cwd=ROOT)
    assert result.returncode == 0 and "2 greedy episodes" in result.stdout, result.stderr[-3000:]


@pytest.mark.multiprocess
def test_a_worker_that_cannot_load_user_code_fails_the_run_at_once(tmp_path):
    """The file is gone by the time workers start: the run ends on the first worker's error,
    naming the file, with no restart."""
    module = tmp_path / "vanishing.py"
    module.write_text(
        CORRIDOR.read_text().split('if __name__ == "__main__":')[0]
        + '\nregister("Corridor-v0", Corridor)\n'
    )
    launcher = tmp_path / "launch.py"
    launcher.write_text(
        "import os, sys\n"
        "sys.path.insert(0, os.path.dirname(__file__))\n"
        "import troupe, vanishing\n"
        "from api.resolve import load_experiment\n"
        "config = load_experiment('Corridor-v0', ['frames=3000', 'stop.eval_return=None'])\n"
        "os.rename(vanishing.__file__, vanishing.__file__ + '.moved')\n"
        "result = troupe.train(config)\n"
        "print('EXIT', result.exit_code)\n"
    )
    result = _run([sys.executable, str(launcher)], cwd=tmp_path, timeout=200)
    assert "EXIT 1" in result.stdout, result.stdout[-2000:] + result.stderr[-3000:]
    run_dir = _only_run(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "RegistryError" in summary["failure"] and "vanishing.py" in summary["failure"]
    assert "troupe image build --add" in summary["failure"]
    workers = json.loads((run_dir / "workers.json").read_text())
    assert sum(w["restarts"] for w in workers.values()) == 0


def test_an_unknown_launcher_fails_before_a_run_folder_is_made(tmp_path, monkeypatch):
    import troupe
    from api.errors import UserError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="unknown launcher 'slurm'; launchers are local, docker"):
        troupe.train("cartpole-ppo", launcher="slurm")
    assert not (tmp_path / "runs").exists()
