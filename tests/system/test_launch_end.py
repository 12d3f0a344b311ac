"""A task Swarm starts again after its run ended by itself (an engine's restart) exits 0 at once,
and only for the end of its own launch; after an interrupted end, the controller started again
resumes the run and its workers wait for it (``system/run/launch_end.py``).

The controller side is a real ``troupe run`` given a launch id and a real ``troupe controller``;
the worker side is a real worker process started as a container starts it, with no controller
to answer it (tests/docker/test_swarm.py kills a real Swarm controller).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from e2e_support import ROOT, TROUPE, finish, read_json, start

from api.config import make_experiment
from system.run import launch_end


def _env(launch: str | None, folder) -> dict[str, str]:
    env = {launch_end.RUN_FOLDER_ENV: str(folder)}
    if launch is not None:
        env[launch_end.LAUNCH_ID_ENV] = launch
    return env


def test_only_a_summary_of_the_same_launch_is_an_end(tmp_path):
    assert launch_end.ended_summary(_env("a1", tmp_path)) is None  # no summary yet
    (tmp_path / "summary.json").write_text(json.dumps({"stop_reason": "interrupted"}))
    assert launch_end.ended_summary(_env("a1", tmp_path)) is None  # a launch that kept no id
    summary = {"stop_reason": "interrupted", "launch_id": "a1"}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert launch_end.ended_summary(_env("a1", tmp_path)) == summary
    assert launch_end.ended_summary(_env("b2", tmp_path)) is None  # deployed again: --resume
    assert launch_end.ended_summary(_env(None, tmp_path)) is None  # a launcher without ids
    assert launch_end.ended_summary({launch_end.LAUNCH_ID_ENV: "a1"}) is None  # nor a folder
    (tmp_path / "summary.json").write_text('{"stop_reason": "interr')  # half written
    assert launch_end.ended_summary(_env("a1", tmp_path)) is None


def _write_summary(folder, stop_reason: str, launch: str = "a1") -> None:
    (folder / "summary.json").write_text(
        json.dumps({"stop_reason": stop_reason, "launch_id": launch})
    )


def test_an_interrupted_run_is_no_end_for_good(tmp_path):
    """Swarm starts an interrupted run's controller again, which resumes it; a run that ended
    by itself (solved, its budget spent, failed) has nothing to resume."""
    _write_summary(tmp_path, "interrupted")
    assert launch_end.ended_summary(_env("a1", tmp_path)) is not None
    assert launch_end.ended_summary(_env("a1", tmp_path), for_good=True) is None
    stopped = {"stop_reason": "interrupted", "launch_id": "a1", "stopped_by": "troupe stop"}
    (tmp_path / "summary.json").write_text(json.dumps(stopped))  # by its user: not resumed
    assert launch_end.ended_summary(_env("a1", tmp_path), for_good=True) == stopped
    for reason in ("env_frames", "eval_return", "failed"):
        _write_summary(tmp_path, reason)
        assert (
            launch_end.ended_summary(_env("a1", tmp_path), for_good=True)["stop_reason"] == reason
        )


def test_a_summary_a_worker_saw_as_its_controller_answered_is_an_earlier_parts(tmp_path):
    """A worker of a resumed run (its controller started again) starts with the interrupted
    summary of the part before. When that controller goes too, the old summary is no end: the
    worker exits as orphaned and Swarm starts it again for the next controller. One written
    since is the end; and a worker no controller ever answered takes any end of its launch."""
    env = _env("a1", tmp_path)
    _write_summary(tmp_path, "interrupted")
    launch = launch_end.WorkerLaunch("actor/0", env)
    assert not launch.ended_before_start()  # its controller is to come again
    assert not launch.ended_while_waiting(heard=True)
    assert launch.ended_while_waiting(heard=False)  # none came: its restarts were spent
    _write_summary(tmp_path, "interrupted")  # this part's own end, written after the hello
    assert launch.ended_while_waiting(heard=True)
    assert "actor/0: its run has ended" in (tmp_path / "logs" / "actor-0.log").read_text()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    launch = launch_end.WorkerLaunch("actor/1", _env("a1", fresh))  # no summary as it started
    assert not launch.ended_while_waiting(heard=True)
    _write_summary(fresh, "env_frames")
    assert launch.ended_while_waiting(heard=True)


def test_a_launchs_controller_starts_are_counted_and_a_worker_leaves_when_all_are_made(tmp_path):
    """A controller killed before it wrote a summary, with no restart left (Swarm makes three
    starts): its workers looked for it for a minute, exited as orphaned and were started
    again, for as long as the services stood. Each start that bound its sockets counts itself;
    a worker no controller answers once every start was made leaves with 0."""
    env = {**_env("a1", tmp_path), launch_end.CONTROLLER_STARTS_ENV: "3"}
    launch = launch_end.WorkerLaunch("actor/0", env)
    for n in (1, 2):
        assert launch_end.count_controller_start(tmp_path, env) == n
        assert not launch.controller_spent(heard=False)  # Swarm starts it again: wait for it
    assert launch_end.count_controller_start(tmp_path, env) == 3
    assert not launch.controller_spent(heard=True)  # its restart looks for the next one first
    assert launch.controller_spent(heard=False)
    said = (tmp_path / "logs" / "actor-0.log").read_text()
    assert "has started the run's controller 3 times, all it starts" in said, said
    later = {**env, launch_end.LAUNCH_ID_ENV: "b2"}  # deployed again with --resume: from 0
    assert not launch_end.WorkerLaunch("actor/0", later).controller_spent(heard=False)
    assert launch_end.count_controller_start(tmp_path, later) == 1
    unbounded = _env("b2", tmp_path)  # a launcher that gives no bound: workers wait on
    for n in (2, 3, 4):
        assert launch_end.count_controller_start(tmp_path, unbounded) == n
    assert not launch_end.WorkerLaunch("actor/0", unbounded).controller_spent(heard=False)
    assert launch_end.count_controller_start(tmp_path, _env(None, tmp_path)) is None
    assert launch_end.controller_starts(tmp_path, "b2") == 4


@pytest.mark.multiprocess
def test_a_worker_whose_controllers_starts_are_spent_exits_0_when_none_answers(tmp_path):
    """A real worker, as Swarm starts it again after its controller's last start was killed:
    it waits for a controller (the last start may be alive and slow; a minute by default, 5 s
    here), then leaves
    with 0, which Swarm's on-failure policy does not restart. One whose controller has a
    start left exits as orphaned (3), to be started again for it."""
    (tmp_path / "controller_starts.json").write_text(json.dumps({"launch_id": "a1", "starts": 3}))
    spent = _worker(tmp_path, "a1", starts=3)
    left = _worker(tmp_path, "a1", starts=4)
    try:
        out, _ = spent.communicate(timeout=120)
        assert spent.returncode == 0, out
        assert "all it starts (killed each time, with no summary written)" in out, out
        out, _ = left.communicate(timeout=30)
        assert left.returncode == 3, out
        assert "no controller answered at tcp://127.0.0.1:9 in 5s" in out, out
    finally:
        for proc in (spent, left):
            proc.kill()
            proc.communicate()


def _worker(tmp_path, launch: str, starts: int | None = None) -> subprocess.Popen:
    """An actor as a Swarm task starts it, pointed at a controller address nobody serves (in
    plain text: this run has no keys)."""
    command = [
        sys.executable, "-m", "system.run.worker_process", "--id", "actor/0", "--role",
        "actor", "--controller", "tcp://127.0.0.1:9", "--insecure",
        "--bind-host", "127.0.0.1", "--advertise-host", "127.0.0.1", "--controller-wait", "5",
    ]  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **_env(launch, tmp_path)}
    if starts is not None:
        env[launch_end.CONTROLLER_STARTS_ENV] = str(starts)
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.mark.multiprocess
@pytest.mark.parametrize("reason", ["env_frames", "failed"])
def test_a_worker_restarted_after_its_run_ended_by_itself_exits_0_without_waiting(tmp_path, reason):
    _write_summary(tmp_path, reason)
    ended = _worker(tmp_path, "a1")
    waiting = _worker(tmp_path, "b2")  # a later launch's worker: its controller may come yet
    try:
        out, _ = ended.communicate(timeout=60)
        assert ended.returncode == 0, out
        assert f"actor/0: its run has ended (summary.json: {reason})" in out, out
        time.sleep(2)
        assert waiting.poll() is None, waiting.stdout.read()
    finally:
        for proc in (ended, waiting):
            proc.kill()
            proc.communicate()


@pytest.mark.multiprocess
def test_a_worker_restarted_after_its_run_was_interrupted_waits_for_its_controller(tmp_path):
    """The controller is started again too, and resumes the run: the worker must be there."""
    _write_summary(tmp_path, "interrupted")
    _assert_still_running(_worker(tmp_path, "a1"), after_s=4)


def _assert_still_running(proc: subprocess.Popen, after_s: float) -> None:
    """``proc`` has not exited ``after_s`` from now (it waits, as it should); then kill it."""
    try:
        time.sleep(after_s)
        assert proc.poll() is None, proc.stdout.read()
    finally:
        proc.kill()
        proc.communicate()


def _controller(run_dir, launch: str) -> subprocess.Popen:
    env = {**os.environ, **_env(launch, run_dir)}
    command = [*TROUPE, "controller", str(run_dir), "--insecure", "--no-display"]
    command += ["--bind", "tcp://127.0.0.1:0"]
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.mark.multiprocess
def test_a_controller_started_again_after_its_run_ended_by_itself_exits_0(tmp_path):
    """Swarm starts a controller again after any exit but 0: after its run failed (exit 1), or
    after an engine's restart. It has nothing to resume and says so; one of an interrupted run
    goes on, to resume it."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = make_experiment("cartpole-ppo", ["evaluation.workers=0", "stop.eval_return=None"])
    (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
    _write_summary(run_dir, "failed")
    again = _controller(run_dir, "a1")
    out, _ = again.communicate(timeout=60)
    assert again.returncode == 0, out
    said = (run_dir / "logs" / "controller.log").read_text()
    assert "its run had ended (summary.json: failed) when this controller was started" in said
    assert "nothing to resume" in " ".join(out.split())  # the console wraps its lines
    _write_summary(run_dir, "interrupted")
    assert launch_end.controller_starts(run_dir, "a1") == 0  # the one that exited at once
    _assert_still_running(_controller(run_dir, "a1"), after_s=5)
    assert launch_end.controller_starts(run_dir, "a1") == 1  # it bound its sockets


@pytest.mark.multiprocess
def test_a_controller_that_cannot_load_its_run_fails_it_once_for_every_start(tmp_path):
    """The run's code is missing where the controller runs (an image built without ``--add``,
    or an older one whose Troupe does not know a key): a restart finds it missing again. Swarm
    started the controller three times over, each failing alike, while the workers looked for
    it. The first start writes the failed summary; a start again says there is nothing to
    resume and exits 0, and ``deploy --wait`` still gives the summary's exit code, 1."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = make_experiment("cartpole-ppo", ["evaluation.workers=0", "stop.eval_return=None"])
    config.code.imports = [str(tmp_path / "gone" / "my_envs.py")]
    (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
    first = _controller(run_dir, "a1")
    out, _ = first.communicate(timeout=60)
    assert first.returncode == 1, out
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "failed" and summary["launch_id"] == "a1", summary
    assert summary["failure"].startswith("controller: cannot import"), summary
    assert "my_envs.py" in summary["failure"], summary
    again = _controller(run_dir, "a1")
    out, _ = again.communicate(timeout=60)
    assert again.returncode == 0, out
    assert "nothing to resume" in " ".join(out.split())
    assert launch_end.controller_starts(run_dir, "a1") == 0  # neither ever answered a worker


@pytest.mark.multiprocess
def test_the_controller_writes_its_launch_id_into_the_summary(tmp_path, monkeypatch):
    monkeypatch.setenv(launch_end.LAUNCH_ID_ENV, "c3")
    run_dir = tmp_path / "run"
    args = ["stop.eval_return=None", "stop.env_frames=2000", "evaluation.workers=0"]
    out = finish(start(["run", "cartpole-ppo", *args, "--run-dir", str(run_dir), "--no-display"]))
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "env_frames", out
    assert summary["launch_id"] == "c3"


@pytest.mark.multiprocess
def test_a_controller_started_again_waits_for_the_folder_lock_and_then_runs(tmp_path):
    """Its lost predecessor's lock, held on by an NFS server until the lease expires: the
    controller started again waits for it instead of being refused (a restart spent)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = make_experiment("cartpole-ppo", ["evaluation.workers=0", "stop.eval_return=None"])
    (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
    _write_summary(run_dir, "interrupted")
    hold = "import sys; from pathlib import Path; from system.run import folder_lock\n"
    hold += "folder_lock.acquire(Path(sys.argv[1])); print('held', flush=True); sys.stdin.read()"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(run_dir)], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        controller = _controller(run_dir, "a1")
        said = ""
        while "waiting up to 180s" not in " ".join(said.split()):  # on its console
            line = controller.stdout.readline()
            assert line, said
            said += line
        assert launch_end.controller_starts(run_dir, "a1") == 0  # not started yet
        deadline = time.monotonic() + 60
        holder.stdin.close()  # the lease expired
        while launch_end.controller_starts(run_dir, "a1") != 1:
            assert controller.poll() is None, controller.stdout.read()
            assert time.monotonic() < deadline, "the controller did not take the lock"
            time.sleep(0.2)
        _assert_still_running(controller, after_s=1)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
