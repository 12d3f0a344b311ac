"""Issue 25: a run's results can be trusted. Each case of the issue's table, run as written.

- the parameter service SIGKILLed, then Ctrl+C at once: the service is brought back for the
  trainers' last words, every final checkpoint is written, and the trainer's last version is
  in the run folder;
- a controller starved of CPU (SIGSTOP for longer than the old 2.5 s silence limit) loses no
  worker: silence alone is no longer taken for death;
- two ``troupe run`` at the same instant on one new ``--run-dir``: exactly one runs, the other
  is refused at once naming the holder's pid;
- ``--resume`` with a changed network is refused in one line naming the key, a change that can
  be made is recorded; a run that crash-loops anyway (a config.json edited by hand) is given up
  on with its first error shown once, and exits non-zero;
- ``--resume --secure`` with an empty keys file refuses to start (no plain-text fallback);
- a run folder that cannot take the final checkpoints (its checkpoints mount read-only) exits
  non-zero with ``stop_reason: failed``;
- a long run keeps at most ``checkpoint.keep_last`` numbered checkpoints.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from lifecycle_support import (
    SMALL,
    all_alive,
    checkpointed_versions,
    finish,
    mount_tmpfs,
    read_json,
    start,
    wait_for,
    workers,
)

from system.parameters.store import TRAINER_FILE, load_checkpoint_file
from system.run.report import read_metrics

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess]

LONG = "stop.env_frames=100000000"
"""A run that only ends when the test ends it."""


def _version(run_dir, wid: str) -> int:
    return int(workers(run_dir)[wid].get("version") or 0)


def _started(run_dir, *extra: str):
    proc = start(["run", "cartpole-ppo", *SMALL, *extra, "--run-dir", str(run_dir), "--no-display"])
    wait_for(
        lambda: all_alive(run_dir) and _version(run_dir, "trainer/default/0") >= 3,
        proc, 300, "every worker alive and version 3 trained",
    )  # fmt: skip
    return proc


@pytest.mark.parametrize("victim", ["trainer/default/0", "params"])
def test_ctrl_c_right_after_a_saver_died_still_writes_the_final_checkpoints(tmp_path, victim):
    """The trainer or the parameter service SIGKILLed, then Ctrl+C before supervision has
    restarted it: the controller brings it back for its stop, so the final version and the
    trainer state are written, from the trainer's newest version."""
    run_dir = tmp_path / "run"
    proc = _started(run_dir, LONG)
    os.kill(workers(run_dir)[victim]["pid"], signal.SIGKILL)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)
    out = finish(proc)
    assert proc.returncode == 130, out[-3000:]
    assert "did not stop" not in out and "did not finish its stop" not in out, out[-3000:]
    final = checkpointed_versions(run_dir)[-1]
    assert final >= _version(run_dir, "trainer/default/0"), (checkpointed_versions(run_dir), out)
    folder = run_dir / "checkpoints" / "default"
    assert load_checkpoint_file(folder / TRAINER_FILE, field="trainer")["version"] == final
    assert read_json(run_dir / "summary.json")["stop_reason"] == "interrupted"


def test_a_controller_starved_for_seconds_is_not_taken_for_dead(tmp_path):
    run_dir = tmp_path / "run"
    proc = _started(run_dir, LONG)
    (controller,) = [int(p) for p in subprocess.run(
        ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()]  # fmt: skip
    pids = {wid: w["pid"] for wid, w in workers(run_dir).items()}
    os.kill(controller, signal.SIGSTOP)
    time.sleep(8.0)  # three times the silence that used to end every worker
    os.kill(controller, signal.SIGCONT)
    before = _version(run_dir, "trainer/default/0")
    wait_for(lambda: _version(run_dir, "trainer/default/0") > before + 2, proc, 120,
             "training to go on after the controller came back")  # fmt: skip
    assert {wid: w["pid"] for wid, w in workers(run_dir).items()} == pids  # nobody restarted
    os.killpg(proc.pid, signal.SIGINT)
    out = finish(proc)
    assert proc.returncode == 130, out[-3000:]
    assert "it is gone" not in out and "restarting it" not in out, out[-3000:]


def test_two_runs_on_one_new_folder_at_the_same_instant_one_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    args = ["run", "cartpole-ppo", *SMALL, "stop.env_frames=20000", "--run-dir", str(run_dir),
            "--no-display"]  # fmt: skip
    first, second = start(args), start(args)
    outs = [finish(first), finish(second)]
    codes = sorted([first.returncode, second.returncode])
    assert codes == [0, 1], outs
    refused = outs[[first.returncode, second.returncode].index(1)]
    assert f"run folder {run_dir} is in use by process" in " ".join(refused.split()), refused
    assert "Traceback" not in refused
    frames = [r["env_frames"] for r in read_metrics(run_dir)]
    assert frames == sorted(frames)  # one writer: frames never go backwards


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A short finished run, its keys made with --secure."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    proc = start(["run", "cartpole-ppo", *SMALL, "stop.env_frames=30000", "checkpoint.every=2",
                  "checkpoint.keep_last=3", "--secure", "--run-dir", str(run_dir),
                  "--no-display"])  # fmt: skip
    out = finish(proc)
    assert proc.returncode == 0, out[-3000:]
    return run_dir


def test_a_long_run_keeps_only_keep_last_numbered_checkpoints(trained):
    versions = checkpointed_versions(trained)
    summary = read_json(trained / "summary.json")
    assert summary["policy_versions"]["default"] > 10  # many were written on the way
    assert len(versions) <= 3 + 1, versions  # keep_last, and the version evaluation tagged
    assert versions[-1] == summary["policy_versions"]["default"]


def _copy(run_dir, tmp_path):
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(run_dir), str(copy)], check=True)
    (copy / ".troupe.lock").unlink(missing_ok=True)
    return copy


def test_a_resume_that_changes_the_network_is_refused_naming_the_key(trained, tmp_path):
    run_dir = _copy(trained, tmp_path)
    before = (run_dir / "metrics.jsonl").read_bytes()
    proc = start(["run", "--resume", str(run_dir), "stop.env_frames=100000000",
                  "policies.default.policy.args.hidden_sizes=[32,32]"],
                 env={"COLUMNS": "400"})  # fmt: skip
    out = finish(proc)
    assert proc.returncode == 1, out
    assert "error: cannot resume" in out and "policies.default.policy.args.hidden_sizes" in out
    assert "Traceback" not in out and len(out.strip().splitlines()) <= 2, out
    assert (run_dir / "metrics.jsonl").read_bytes() == before  # nothing started


def test_a_resume_that_changes_what_can_change_goes_on_and_is_recorded(trained, tmp_path):
    run_dir = _copy(trained, tmp_path)
    frames = read_json(run_dir / "summary.json")["env_frames"]
    proc = start(["run", "--resume", str(run_dir), f"stop.env_frames={frames + 8000}",
                  "actors.workers=1", "--no-display"])  # fmt: skip
    out = finish(proc)
    assert proc.returncode == 0, out[-3000:]
    (record,) = [json.loads(line) for line in (run_dir / "resumes.jsonl").read_text().splitlines()]
    assert record["changed"]["actors.workers"] == [2, 1]
    assert record["changed"]["stop.env_frames"] == [30000, frames + 8000]


def test_a_crash_looping_worker_is_given_up_on_with_its_error_shown_once(trained, tmp_path):
    """What the pre-launch check now refuses, forced past it by editing config.json: the
    policy workers cannot load the saved weights, restart after restart."""
    run_dir = _copy(trained, tmp_path)
    config = read_json(run_dir / "config.json")
    config["policies"]["default"]["policy"]["args"]["hidden_sizes"] = [32, 32]
    config["stop"]["env_frames"] = 100_000_000
    (run_dir / "config.json").write_text(json.dumps(config))
    proc = start(["run", "--resume", str(run_dir), "--no-display"], env={"COLUMNS": "400"})
    out = finish(proc)
    assert proc.returncode == 1, out[-3000:]
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "failed", summary
    assert "restarts in a row, none of them running 60 s" in summary["failure"], summary
    assert out.count("Traceback") <= 2, out[-5000:]  # once per failing role, not per restart
    assert "failed again with the same error" in out, out[-5000:]


def test_resume_secure_with_an_empty_keys_file_refuses_to_start(trained, tmp_path):
    run_dir = _copy(trained, tmp_path)
    (run_dir / "keys").write_text("")
    before = (run_dir / "metrics.jsonl").read_bytes()
    proc = start(["run", "--resume", str(run_dir), "stop.env_frames=100000000", "--secure",
                  "--no-display"], env={"COLUMNS": "400"})  # fmt: skip
    out = finish(proc)
    assert proc.returncode == 1, out
    assert f"{run_dir / 'keys'}" in out and "empty" in out, out
    assert "Traceback" not in out and len(out.strip().splitlines()) <= 2, out
    assert (run_dir / "metrics.jsonl").read_bytes() == before


def test_checkpoints_that_cannot_be_written_end_the_run_non_zero(tmp_path):
    """The issue's full disk at the final ``trainer.ckpt``: here a read-only mount covers the
    run's checkpoints folder mid-run (so summary.json, beside it, can still be written)."""
    run_dir = tmp_path / "run"
    proc = start(["run", "cartpole-ppo", *SMALL, "stop.wall_seconds=40", "stop.env_frames=None",
                  "--run-dir", str(run_dir), "--no-display"], env={"COLUMNS": "400"})  # fmt: skip
    wait_for(lambda: (run_dir / "workers.json").exists() and
             _version(run_dir, "trainer/default/0") >= 3, proc, 300, "version 3")  # fmt: skip
    try:
        mount_tmpfs(run_dir / "checkpoints", "ro", "size=1m")
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    try:
        out = finish(proc)
    finally:
        subprocess.run(["umount", "-l", str(run_dir / "checkpoints")], check=False, timeout=30)
    assert proc.returncode == 1, out[-3000:]
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "failed", summary
    assert "checkpoints" in summary["failure"], summary
    assert "Traceback" not in out, out[-3000:]
