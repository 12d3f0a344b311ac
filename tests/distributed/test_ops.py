"""distributed.ops: finding a run from its record, reading its folder, and each backend's
view and stop, against real processes and files (Kubernetes: a stand-in for its client's API
objects, as in test_k8s; Docker, Swarm and Slurm run for real in tests/docker and the slurm
tests)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from distributed.errors import OpsError
from distributed.ops import backends, folder, record
from distributed.ops.record import LaunchRecord


def run_folder_at(path: Path, workers: dict | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "workers.json").write_text(json.dumps(workers or {}))
    return path


# --------------------------------------------------------------------- records
def test_a_record_is_found_by_folder_and_by_name(tmp_path):
    run_dir = run_folder_at(tmp_path / "runs" / "r1")
    record.write(run_dir, record.for_process("local", run_dir, os.getpid()))
    by_folder = backends.resolve(str(run_dir), tmp_path / "elsewhere")
    by_name = backends.resolve("r1", tmp_path / "runs")
    assert by_folder == by_name
    assert by_name.launcher == "local" and by_name.run == "r1" and by_name.pid == os.getpid()
    assert by_name.running_here()  # this test's process, started when the record says


def test_a_folder_moved_elsewhere_is_still_its_own_run_folder(tmp_path):
    run_dir = run_folder_at(tmp_path / "a")
    record.write(run_dir, record.for_process("local", run_dir, os.getpid()))
    moved = tmp_path / "b"
    run_dir.rename(moved)
    assert record.read(moved).folder() == moved.resolve()


def test_a_copied_folder_is_a_run_of_its_own_name_and_not_the_original_s_process(tmp_path):
    """`cp -a runs/a runs/b`: `troupe ps` listed b under a's name, and `troupe stop b` would
    have signalled a's live controller."""
    original = run_folder_at(tmp_path / "runs" / "a")
    record.write(original, record.for_process("local", original, os.getpid()))
    copy = tmp_path / "runs" / "b"
    shutil.copytree(original, copy)
    found = record.read(copy)
    assert (found.run, found.folder(), found.pid) == ("b", copy.resolve(), None)
    assert not found.running_here()
    # nothing runs the copy: not "unknown from this machine", started "on the cluster"
    assert backends.LocalBackend().alive(found) is False
    assert found.host == record.read(original).host
    assert backends.resolve("b", tmp_path / "runs").run == "b"
    assert record.read(original).running_here()  # the original is still its process's


def test_a_pid_given_to_another_process_is_not_the_run(tmp_path):
    run_dir = run_folder_at(tmp_path / "r")
    mine = record.for_process("local", run_dir, os.getpid())
    reused = LaunchRecord(**{**mine.__dict__, "pid_start": (mine.pid_start or 0) + 1})
    assert not reused.running_here()
    assert "is not running" in backends.LocalBackend().stop(reused, now=False)  # no signal


def test_a_bad_record_and_a_folder_that_is_no_run_say_so(tmp_path, monkeypatch):
    run_dir = run_folder_at(tmp_path / "r")
    (run_dir / "launch.json").write_text('{"launcher": "nomad", "run": "r"}')
    with pytest.raises(OpsError, match="launcher 'nomad'"):
        record.read(run_dir)
    (tmp_path / "empty").mkdir()
    with pytest.raises(OpsError) as caught:  # absolute: the same folder under runs_dir
        backends.resolve(str(tmp_path / "empty"), tmp_path)
    assert str(caught.value).startswith(f"{tmp_path / 'empty'} is a folder but not a run folder")
    runs = tmp_path / "runs"
    record.write(run_folder_at(runs / "empty"), record.for_process("local", runs / "empty", 1))
    monkeypatch.chdir(tmp_path)
    found = backends.resolve("empty", runs)  # ./empty is no run: runs/empty is found
    assert found.folder() == (runs / "empty").resolve()
    with pytest.raises(OpsError, match="no run 'ghost'"):
        backends.resolve("ghost", tmp_path)


def test_a_slurm_controller_that_is_down_is_not_asked_for_a_run_by_name(tmp_path, monkeypatch):
    """With the Slurm client installed and its controller down, ``squeue`` retries for about
    9 s before it fails: every ``troupe status NAME`` of a name that is no run waited that long.
    ``scontrol ping`` answers at once. Here ``scontrol`` and ``squeue`` are stand-ins on PATH
    that answer as Slurm's do (the real ones are in tests/distributed/test_slurm.py's job)."""
    bin_dir, asked = tmp_path / "bin", tmp_path / "asked"
    bin_dir.mkdir()
    state = tmp_path / "state"
    (bin_dir / "scontrol").write_text(
        f'#!/bin/sh\necho "Slurmctld(primary) at vm is $(cat {state})"\n[ "$(cat {state})" = UP ]\n'
    )
    (bin_dir / "squeue").write_text(f'#!/bin/sh\necho "$@" >> {asked}\necho 4242\n')
    for tool in ("scontrol", "squeue"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    state.write_text("DOWN")
    assert backends.SlurmBackend.find("ghost") is None and not asked.exists()
    state.write_text("UP")
    found = backends.SlurmBackend.find("ghost")
    assert found is not None and found.job_id == "4242" and "troupe-ghost" in asked.read_text()


def test_a_deployment_leaves_its_record_under_runs_for_lookups_by_name(tmp_path, monkeypatch):
    """A Slurm job leaves squeue when it ends, and ``troupe status NAME`` then found no run: the
    deployment's record under ``runs/`` finds it. It never replaces another run's folder, and
    ``troupe ps`` lists it where no Slurm client can be asked."""
    from rich.console import Console

    from distributed.cli import build_parser
    from distributed.ops import commands

    runs, out = tmp_path / "runs", tmp_path / "deploy"
    run_dir = run_folder_at(out / "run")
    (run_dir / "summary.json").write_text('{"stop_reason": "env_frames"}')
    (run_dir / "metrics.jsonl").write_text('{"env_frames": 3000, "fps": 1500.0}\n')
    (run_dir / "launch.json").write_text('{"launcher": "slurm", "run": "s1", "job_id": "77"}')
    deployed = LaunchRecord("slurm", "s1", run_dir=str(run_dir))
    assert record.point(runs, deployed) == runs / "s1"
    assert record.point(runs, deployed) == runs / "s1"  # deployed again: the same record
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm"))  # no squeue: the job is not asked
    found = backends.resolve("s1", runs)
    assert (found.launcher, found.job_id, found.folder()) == ("slurm", "77", run_dir)
    console = Console(record=True, width=300, force_terminal=False)
    assert commands.run_ps(build_parser().parse_args(["ps", "--runs-dir", str(runs)]), console) == 0
    row = next(line for line in console.export_text().splitlines() if "s1" in line)
    assert row.split("│")[2:6] == [" slurm    ", " ended (env_frames) ", " 3000       ", " 1500.0 "]
    console = Console(record=True, width=300, force_terminal=False)
    args = build_parser().parse_args(["status", "s1", "--runs-dir", str(runs)])
    assert commands.run_status(args, console) == 0  # it failed: "squeue failed: [Errno 2] ..."
    said = console.export_text()
    assert "run s1 (slurm): ended (env_frames)" in said and "slurm view: not asked (squeue" in said
    # never over a folder of another run, nor one of something else, nor the run folder itself
    local = run_folder_at(runs / "l1")
    record.write(local, record.for_process("local", local, os.getpid()))
    (runs / "notes").mkdir()
    for name in ("l1", "notes"):
        assert record.point(runs, LaunchRecord("slurm", name, run_dir=str(run_dir))) is None
    assert record.read(local).launcher == "local" and not (runs / "notes" / "launch.json").exists()
    assert record.point(out, LaunchRecord("slurm", "run", run_dir=str(run_dir))) is None


def test_names_are_never_cut_on_an_80_column_terminal_or_in_a_pipe(tmp_path):
    """`troupe ps` showed `arrreward-v0-ppo-20…` and `troupe status` `trainer/default…` in 80
    columns (a pipe's width too): names a user goes on to type into `troupe logs`."""
    from rich.console import Console

    from distributed.cli import build_parser
    from distributed.ops import commands

    name = "arrreward-v0-ppo-20261206-170848"
    workers = {
        "trainer/default/0": {"role": "trainer", "state": "stopped", "restarts": 0,
                              "peak_rss_mb": 277.7, "version": 1234567},
        "params": {"role": "parameter_service", "state": "stopped"},
    }  # fmt: skip
    run_dir = run_folder_at(tmp_path / "runs" / name, workers)
    (run_dir / "summary.json").write_text('{"stop_reason": "eval_return", "solved": true}')
    (run_dir / "metrics.jsonl").write_text('{"env_frames": 123456789, "fps": 12345.6}\n')
    record.write(run_dir, record.for_process("local", run_dir, os.getpid()))
    runs = ["--runs-dir", str(tmp_path / "runs")]
    shown = {
        "ps": (commands.run_ps, ["ps", *runs], (name, "123456789", "12345.6")),
        "status": (commands.run_status, ["status", name, *runs],
                   ("trainer/default/0", "1234567", "277.7")),
    }  # fmt: skip
    for command, argv, whole in shown.values():
        console = Console(record=True, width=80, force_terminal=False)
        assert command(build_parser().parse_args(argv), console) == 0
        said = console.export_text()
        assert "…" not in said and all(w in said for w in whole), said


def test_a_folder_without_a_record_is_the_run_of_whoever_holds_its_lock(tmp_path):
    """Run folders written before launch records: the lock's holder is the run's process."""
    run_dir = run_folder_at(tmp_path / "old")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         f"f = open({str(run_dir / '.troupe.lock')!r}, 'a+')\n"
         "fcntl.flock(f.fileno(), fcntl.LOCK_EX)\n"
         "f.write(f'{os.getpid()}\\n'); f.flush(); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        held = record.read(run_dir)
        assert held.launcher == "local" and held.pid == holder.pid
    finally:
        holder.kill()
        holder.wait()
    assert record.read(run_dir).pid is None  # nobody holds it: the run has ended


# --------------------------------------------------------------------- the local backend
SIGINT_CHILD = """
import signal, sys, time
hits = []
def on_int(*_):
    hits.append(1)
    print("sigint", len(hits), flush=True)
    if len(hits) == 2:
        sys.exit(131)
signal.signal(signal.SIGINT, on_int)
print("ready", flush=True)
while True:
    if hits:
        time.sleep(1.0)  # an orderly stop takes a while; a second signal ends it at once
        sys.exit(130)
    time.sleep(0.05)
"""


@pytest.mark.parametrize("now", [False, True], ids=["in-order", "now"])
def test_stop_signals_the_runs_process(tmp_path, now):
    child = subprocess.Popen([sys.executable, "-c", SIGINT_CHILD], stdout=subprocess.PIPE,
                             text=True)  # fmt: skip
    assert child.stdout.readline().strip() == "ready"
    run_dir = run_folder_at(tmp_path / "r")
    rec = record.for_process("local", run_dir, child.pid)
    said = backends.LocalBackend().stop(rec, now=now)
    assert str(child.pid) in said
    assert child.wait(timeout=10) == (131 if now else 130)


def _stop_now(tmp_path, on_int: str) -> tuple[subprocess.Popen, str]:
    """``troupe stop --now`` of a stand-in for a controller: a process whose SIGINT handler is
    ``on_int`` (code that defines it), whatever it inherits (pytest run as a script's background
    job has SIGINT ignored, and so had the child, which ran on), signalled once it runs (a
    SIGINT between its fork and its exec went to the copy of pytest's handler, and was lost).
    The process and what the stop said."""
    code = f"import signal, sys, time\n{on_int}signal.signal(signal.SIGINT, on_int)\n"
    code += "print('ready', flush=True)\ntime.sleep(300)\n"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    rec = record.for_process("local", run_folder_at(tmp_path / "r"), child.pid)
    return child, backends.LocalBackend().stop(rec, now=True)


def test_stop_now_of_a_run_whose_stop_in_order_was_over_says_so(tmp_path, monkeypatch):
    """``--now`` said "two SIGINTs: the run stops at once" of a run that had stopped in order
    before the second signal was due (exit 130, a summary)."""
    monkeypatch.setattr(backends, "SECOND_SIGNAL_AFTER_S", 30.0)
    child, said = _stop_now(tmp_path, "on_int = signal.default_int_handler\n")  # it ends
    assert said == f"sent SIGINT to process {child.pid}: the run stopped in order within 30 s"
    child.wait(timeout=10)


def test_stop_now_of_a_run_still_stopping_sends_a_second_signal(tmp_path, monkeypatch):
    """A controller still stopping in order when the wait is over gets the second SIGINT, which
    it takes as "at once" (here: a process that exits on its second SIGINT)."""
    monkeypatch.setattr(backends, "SECOND_SIGNAL_AFTER_S", 0.3)
    seen = "seen = []\ndef on_int(*_):\n    seen.append(1)\n    if len(seen) == 2: sys.exit(131)\n"
    child, said = _stop_now(tmp_path, seen)
    assert said == f"sent two SIGINTs to process {child.pid}: the run stops at once"
    assert child.wait(timeout=30) == 131


def test_a_run_of_another_host_is_not_signalled_from_here(tmp_path):
    rec = LaunchRecord("local", "r", host="some-other-host", pid=os.getpid())
    assert backends.LocalBackend().alive(rec) is None
    with pytest.raises(OpsError, match="runs on some-other-host"):
        backends.LocalBackend().stop(rec, now=False)


# --------------------------------------------------------------------- the run folder
def test_tail_interleaves_workers_by_time_in_text_and_json(tmp_path):
    run_dir = run_folder_at(tmp_path / "r", {"actor/0": {}, "policy/default/0": {}})
    logs = run_dir / "logs"
    logs.mkdir()
    (logs / "actor-0.log").write_text(
        "2026-01-01 10:00:01,000 actor/0 INFO a: first\n"
        "2026-01-01 10:00:03,000 actor/0 INFO a: third\n"
    )
    (logs / "policy-default-0.log").write_text(
        json.dumps({"time": "2026-01-01T10:00:02.000Z", "message": "second"}) + "\n"
    )
    (logs / "eval-0.log").write_text("2026-01-01 10:00:04,000 eval/0 INFO e: fourth\n")
    files = folder.log_files(run_dir)
    assert set(files) == {"actor/0", "policy/default/0", "eval-0"}  # no owner: its file name
    lines = list(folder.tail(files, 10))
    assert [w for w, _ in lines] == ["actor/0", "policy/default/0", "actor/0", "eval-0"]
    assert list(folder.tail(folder.select(files, "actor"), 1)) == [
        ("actor/0", "2026-01-01 10:00:03,000 actor/0 INFO a: third")
    ]


def test_worker_takes_an_id_or_a_role_and_a_name_of_none_is_refused(tmp_path):
    """``--worker actor`` left out the evaluation actors (role actor, ids eval/N), and
    ``--worker trainr`` printed "no lines" and exited 0."""
    table = {"actor/0": {"role": "actor"}, "eval/0": {"role": "actor"},
             "trainer/default/0": {"role": "trainer"}}  # fmt: skip
    run_dir = run_folder_at(tmp_path / "r", table)
    logs = run_dir / "logs"
    logs.mkdir()
    for name in ("actor-0", "eval-0", "trainer-default-0"):
        (logs / f"{name}.log").write_text(f"2026-01-01 10:00:01,000 {name} INFO a: hi\n")
    files = folder.log_files(run_dir)
    assert set(folder.select(files, "actor", folder.workers(run_dir))) == {"actor/0", "eval/0"}
    assert set(folder.select(files, "eval", folder.workers(run_dir))) == {"eval/0"}
    assert set(folder.select(files, "trainer/default/0")) == {"trainer/default/0"}
    for known in ("trainer", "eval/0", "controller", "actor"):
        assert folder.unknown_worker(known, run_dir) is None
    assert folder.unknown_worker("trainr", run_dir) == (
        "no worker 'trainr' in this run: --worker takes an id (controller, actor/0, eval/0, "
        "trainer/default/0) or a role (actor, trainer)"
    )
    assert folder.unknown_worker("trainr", tmp_path) is None  # no table yet: not known


def test_follow_reads_new_lines_new_files_and_rotated_files_then_ends(tmp_path):
    run_dir = run_folder_at(tmp_path / "r", {"actor/0": {}, "actor/1": {}})
    logs = run_dir / "logs"
    logs.mkdir()
    first = logs / "actor-0.log"
    first.write_text("old line\n")
    ended = threading.Event()

    def write():
        time.sleep(0.3)
        with open(first, "a") as f:
            f.write("new line\nhalf")  # a line being written is not shown until it ends
        time.sleep(0.3)
        with open(first, "a") as f:
            f.write(" done\n")
        (logs / "actor-1.log").write_text("late worker\n")
        time.sleep(0.3)
        first.rename(logs / "actor-0.log.1")  # rotated
        first.write_text("after rotation\n")
        time.sleep(0.3)
        ended.set()

    threading.Thread(target=write, daemon=True).start()
    seen = list(
        folder.follow(lambda: folder.log_files(run_dir), ended.is_set, poll_s=0.05, quiet_s=0.3)
    )
    assert seen == [
        ("actor/0", "new line"),
        ("actor/0", "half done"),
        ("actor/1", "late worker"),
        ("actor/0", "after rotation"),
    ]


def test_last_metrics_reads_the_last_whole_line(tmp_path):
    run_dir = run_folder_at(tmp_path / "r")
    lines = [json.dumps({"env_frames": n, "fps": 10.25}) for n in range(2000)]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + '\n{"env_frames": 20')
    assert folder.headline(folder.last_metrics(run_dir))["env_frames"] == 1999


def test_status_shows_emulator_frames_where_the_run_has_them():
    atari = folder.headline({"env_frames": 8143, "emulator_frames": 32572, "fps": 498.51})
    assert list(atari)[:3] == ["wall_s", "env_frames", "emulator_frames"]
    assert atari["emulator_frames"] == 32572 and atari["fps"] == 498.5
    assert "emulator_frames" not in folder.headline({"env_frames": 3110})


def test_status_of_an_ended_run_says_what_its_last_lines_said_of_its_workers(tmp_path):
    """The warnings of a run's end (restarts, a worker never ready, ...) were printed once, by
    the process that ran it; `troupe status` showed the folder's figures without them."""
    from rich.console import Console

    from distributed.cli import build_parser
    from distributed.ops import commands

    run_dir = run_folder_at(tmp_path / "r", {"eval/0": {"role": "actor", "state": "stopped"}})
    summary = {
        "stop_reason": "wall_seconds",
        "never_ready": ["eval/0"],
        "restarts": {"actor/0": {"restarts": 2, "last_cause": "exited with code 3"}},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))  # fmt: skip
    record.write(run_dir, record.for_process("local", run_dir, None))
    console = Console(record=True, width=400, force_terminal=False)
    assert commands.run_status(build_parser().parse_args(["status", str(run_dir)]), console) == 0
    said = console.export_text()
    assert "workers restarted during the run: actor/0 2 times (last: exited with code 3)" in said
    assert "never ready: eval/0 still starting when the run stopped, so it did nothing" in said


def test_status_and_logs_read_the_folder_of_a_run_that_failed_before_it_started(tmp_path):
    """A run whose controller failed before writing config.json (its metrics port taken) was
    "not on this machine" to ``troupe status``, and ``troupe logs`` looked for a scheduler's
    output instead of its controller's log, which holds the error."""
    from rich.console import Console

    from distributed.cli import build_parser
    from distributed.ops import commands

    run_dir = tmp_path / "r"
    (run_dir / "logs").mkdir(parents=True)
    said_there = "controller ERROR distributed.launch.run: cannot serve metrics on port 9177"
    (run_dir / "logs" / "controller.log").write_text(f"2026-12-06 15:17:55,226 {said_there}\n")
    record.write(run_dir, record.for_process("local", run_dir, None))
    assert record.read(run_dir).folder() == run_dir.resolve()
    status = Console(record=True, width=400, force_terminal=False)
    assert commands.run_status(build_parser().parse_args(["status", str(run_dir)]), status) == 0
    assert "not on this machine" not in status.export_text()
    logs = Console(record=True, width=400, force_terminal=False)
    assert commands.run_logs(build_parser().parse_args(["logs", str(run_dir)]), logs) == 0
    assert said_there in logs.export_text()
    pointer = tmp_path / "pointer"  # what a deploy leaves: a launch record alone
    record.write(pointer, record.for_process("local", pointer, None))
    assert record.read(pointer).folder() is None


def test_status_shows_the_run_s_last_second_where_the_file_is_thinned(tmp_path):
    run_dir = run_folder_at(tmp_path / "r")
    (run_dir / "metrics.jsonl").write_text(json.dumps({"wall_s": 86400.0, "env_frames": 9}) + "\n")
    (run_dir / "latest.json").write_text(json.dumps({"wall_s": 86459.0, "env_frames": 15}))
    assert folder.headline(folder.last_metrics(run_dir))["env_frames"] == 15


def test_status_and_ps_say_which_workers_a_killed_controller_left_alive_in_workers_json(
    tmp_path, monkeypatch
):
    """A controller killed with SIGKILL leaves workers.json as it last wrote it: status showed
    every worker ``alive`` after all of them had gone (ps said ``alive (process gone)``)."""
    from rich.console import Console

    from distributed.cli import build_parser
    from distributed.ops import commands

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    workers = {
        "actor/0": {"role": "actor", "state": "alive", "pid": gone.pid},
        "policy/default/0": {"role": "policy", "state": "alive", "pid": os.getpid()},
        "trainer/default/0": {"role": "trainer", "state": "failed", "pid": gone.pid},
    }
    run_dir = run_folder_at(tmp_path / "r", workers)
    killed = record.for_process("local", run_dir, gone.pid)  # the controller's pid: gone too
    record.write(run_dir, killed)
    console = Console(record=True, width=400, force_terminal=False)
    assert commands.run_status(build_parser().parse_args(["status", str(run_dir)]), console) == 0
    rows = {line.split()[1]: line for line in console.export_text().splitlines() if "│" in line}
    assert "gone (was alive)" in rows["actor/0"]
    assert "alive, no controller" in rows["policy/default/0"]  # outlived it (this pid is alive)
    assert "failed" in rows["trainer/default/0"] and "was" not in rows["trainer/default/0"]
    states = {p.worker: p.state for p in backends.LocalBackend().processes(killed)}
    assert states["actor/0"] == "gone (was alive)" and states["controller"] == "ended"
    # a run that goes on: a worker's state as written, unless its process has gone
    live = record.for_process("local", run_dir, os.getpid())
    assert backends.worker_state(live, workers["policy/default/0"], True) == "alive"
    assert backends.worker_state(live, workers["actor/0"], True) == "gone (was alive)"
    # another launcher's pids are not this machine's: a run not running has no live workers
    swarm = LaunchRecord("swarm", "r", run_dir=str(run_dir))
    assert backends.worker_state(swarm, workers["policy/default/0"], False) == "was alive"
    assert backends.worker_state(swarm, workers["policy/default/0"], None) == "alive"


# --------------------------------------------------------------------- kubernetes
class FakeCore:
    """The calls K8sBackend makes of the client's CoreV1Api, answered from a list of pods."""

    def __init__(self, pods):
        self.pods, self.calls = pods, []

    def list_namespaced_pod(self, namespace, label_selector, _request_timeout=None):
        assert _request_timeout  # an API server that does not answer must not hang the command
        self.calls.append(("list pods", namespace, label_selector))
        return SimpleNamespace(items=self.pods)

    def delete_namespaced_pod(self, name, namespace, grace_period_seconds):
        self.calls.append(("delete pod", name, grace_period_seconds))

    def read_namespaced_pod_log(self, name, namespace, tail_lines):
        return f"{name} line 1\n{name} line 2\n"

    def __getattr__(self, name):  # list/delete of the other kinds
        if name.startswith("list_namespaced_"):
            kind = name.removeprefix("list_namespaced_")
            item = SimpleNamespace(metadata=SimpleNamespace(name=f"r-{kind}"))
            return lambda namespace, label_selector: SimpleNamespace(items=[item])
        if name.startswith("delete_namespaced_"):
            return lambda item, namespace, **kw: self.calls.append(("delete", item, kw))
        raise AttributeError(name)


def pod(name: str, component: str, phase: str = "Running"):
    return SimpleNamespace(
        metadata=SimpleNamespace(name=name, labels={"app.kubernetes.io/component": component}),
        status=SimpleNamespace(phase=phase, container_statuses=[SimpleNamespace(restart_count=1)]),
        spec=SimpleNamespace(node_name="node-a"),
    )


def test_k8s_status_logs_and_stop_go_through_the_api():
    core = FakeCore([pod("r-controller-x", "controller"), pod("r-actor-0", "actor")])
    apis = {name: core for name in ("CoreV1Api", "BatchV1Api", "PolicyV1Api", "NetworkingV1Api")}
    be = backends.K8sBackend(apis)
    rec = LaunchRecord("k8s", "r", namespace="rl")
    assert be.alive(rec) is True
    rows = be.processes(rec)
    assert [(r.name, r.worker, r.state, r.where) for r in rows] == [
        ("r-actor-0", "actor", "Running", "node-a"),
        ("r-controller-x", "controller", "Running", "node-a"),
    ]
    assert ("list pods", "rl", "troupe.run=r") in core.calls
    lines = list(be.logs(rec, "actor", tail=5, follow=False))
    assert lines == [("r-actor-0", "r-actor-0 line 1"), ("r-actor-0", "r-actor-0 line 2")]
    said = be.remove(rec)
    deleted = [c[1] for c in core.calls if c[0] == "delete"]
    assert "r-job" in deleted and "r-secret" in deleted and "r-config_map" in deleted
    assert not any("persistent_volume_claim" in d for d in deleted)  # the run folder stays
    assert "volume claim is kept" in said


class JobController:
    """The controller's Job as Kubernetes's documentation describes the Job controller, for the
    calls `troupe stop` makes (no cluster runs here). A pod that is deleted terminates and is
    replaced at once (``podReplacementPolicy: TerminatingOrFailed``, the default) until the
    Job's ``backoffLimit``; suspending the Job terminates its pods (SIGTERM; a pending one is
    removed) and starts none. A terminating pod ends by the next listing (an orderly stop)."""

    def __init__(self, phase: str):
        self.suspended, self.failures, self.made = False, 0, 0
        self.pods: list = []
        self.terminating: set[str] = set()
        self.calls: list = []
        self._make(phase)

    def _make(self, phase: str = "Pending") -> None:
        self.made += 1
        self.pods.append(pod(f"r-controller-{self.made}", "controller", phase))

    def _terminate(self, p) -> None:
        if p.status.phase == "Pending":  # never ran: removed at once
            self.pods.remove(p)
        else:
            self.terminating.add(p.metadata.name)

    # CoreV1Api
    def list_namespaced_pod(self, namespace, label_selector, _request_timeout=None):
        listed = list(self.pods)
        self.pods = [p for p in self.pods if p.metadata.name not in self.terminating]
        return SimpleNamespace(items=listed)

    def delete_namespaced_pod(self, name, namespace, grace_period_seconds, _request_timeout=None):
        assert _request_timeout
        self.calls.append(("delete pod", name, grace_period_seconds))
        self._terminate(next(p for p in self.pods if p.metadata.name == name))
        if not self.suspended and self.failures < 2:  # backoffLimit: 2
            self.failures += 1
            self._make()

    # BatchV1Api
    def list_namespaced_job(self, namespace, label_selector, _request_timeout=None):
        assert _request_timeout and "app.kubernetes.io/component=controller" in label_selector
        job = SimpleNamespace(metadata=SimpleNamespace(name="r-controller"))
        return SimpleNamespace(items=[job])

    def patch_namespaced_job(self, name, namespace, body, _request_timeout=None):
        assert _request_timeout
        self.calls.append(("patch job", name, body))
        if body == {"spec": {"suspend": True}}:
            self.suspended = True
            for p in list(self.pods):
                self._terminate(p)


def _stopped(phase: str, now: bool = False) -> tuple[JobController, str, bool]:
    cluster = JobController(phase)
    be = backends.K8sBackend({"CoreV1Api": cluster, "BatchV1Api": cluster})
    rec = LaunchRecord("k8s", "r", namespace="rl")
    said = be.stop(rec, now=now)
    return cluster, said, backends.wait_until_ended(be, rec, wait_s=3)


def test_k8s_stop_ends_the_run_and_no_controller_pod_takes_its_place():
    """Deleting the controller's pod let its Job start another at once, which resumed the run:
    `troupe stop` never ended a Kubernetes run. It now suspends the Job."""
    cluster, said, ended = _stopped("Running")
    assert ended and cluster.made == 1, cluster.pods
    assert ("patch job", "r-controller", {"spec": {"suspend": True}}) in cluster.calls
    assert "SIGTERM" in said and "in order" in said
    cluster, said, ended = _stopped("Running", now=True)  # --now: no grace, still none after it
    assert ended and cluster.made == 1
    assert ("delete pod", "r-controller-1", 0) in cluster.calls and "at once" in said


def test_the_k8s_stop_calls_real_kubernetes_client_methods():
    client = pytest.importorskip("kubernetes.client")
    calls = [
        ("BatchV1Api", "list_namespaced_job"),
        ("BatchV1Api", "patch_namespaced_job"),
        ("CoreV1Api", "delete_namespaced_pod"),
    ]
    for api, method in calls:
        assert callable(getattr(getattr(client, api), method, None)), method


def test_k8s_stop_before_the_controller_pod_runs_ends_the_run_unstarted():
    cluster, said, ended = _stopped("Pending")
    assert ended and cluster.made == 1 and not cluster.pods
    assert "before its pod ran" in said and "without starting" in said


def test_k8s_ps_says_how_a_restarted_container_last_ended():
    """The kubelet's record of a container's last end (OOMKilled, an exit code): the controller
    inside sees only a worker gone silent, and `troupe ps` said only "restarts 1"."""

    def status(reason, code, restarts):  # the fields of the client's V1ContainerStatus
        ended = SimpleNamespace(exit_code=code, reason=reason) if code else None
        return SimpleNamespace(restart_count=restarts, last_state=SimpleNamespace(terminated=ended))

    killed = pod("r-actor-0", "actor")
    killed.status.container_statuses = [status("OOMKilled", 137, 1)]
    failed = pod("r-actor-1", "actor")
    failed.status.container_statuses = [status("Error", 3, 2)]
    fine = pod("r-params-0", "params")
    fine.status.container_statuses = [status(None, None, 0)]
    core = FakeCore([killed, failed, fine])
    be = backends.K8sBackend({"CoreV1Api": core})
    notes = [r.detail for r in be.processes(LaunchRecord("k8s", "r", namespace="rl"))]
    assert notes == [
        "restarts 1; last ended: OOMKilled, exit code 137 (SIGKILL)",
        "restarts 2; last ended: Error, exit code 3",
        "restarts 0",
    ]


def test_a_record_names_no_launcher_the_backends_do_not_know():
    assert set(backends.BACKENDS) == set(record.LAUNCHERS)


def test_stop_waits_and_reports_a_run_that_will_not_end(tmp_path, monkeypatch):
    """troupe stop exits 1 when the run still runs after --wait (a stuck controller)."""
    from rich.console import Console

    from distributed.cli import build_parser
    from distributed.ops import commands

    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, time\n"
         "signal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('ready', flush=True)\n"
         "time.sleep(60)"], stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert stubborn.stdout.readline().strip() == "ready"
        run_dir = run_folder_at(tmp_path / "r")
        record.write(run_dir, record.for_process("local", run_dir, stubborn.pid))
        args = build_parser().parse_args(["stop", str(run_dir), "--wait", "1"])
        console = Console(record=True, width=200)
        assert commands.run_stop(args, console) == 1
        assert "still runs after 1s" in console.export_text()
    finally:
        stubborn.send_signal(signal.SIGKILL)
        stubborn.wait()


def test_a_followed_stream_gives_whole_lines_whatever_its_chunks():
    chunks = [b"first li", b"ne\nsecond line\nthi", b"rd", b" line\nlast"]
    assert list(backends._whole_lines(iter(chunks))) == [
        "first line",
        "second line",
        "third line",
        "last",
    ]


def test_a_scheduler_with_no_lines_from_a_worker_says_where_its_info_lines_are(monkeypatch):
    """Workers print NOTICE and above to their console: an actor's container, service or pod
    says nothing in a quiet run, and "no lines" alone reads as a broken worker."""
    from rich.console import Console

    from distributed.cli import build_parser
    from distributed.ops import commands

    class Silent:
        def logs(self, record, worker, tail, follow):
            return iter(())

    rec = LaunchRecord("swarm", "quiet")
    monkeypatch.setattr(commands, "resolve", lambda name, runs_dir: rec)
    monkeypatch.setattr(commands.backends, "backend", lambda record: Silent())
    console = Console(record=True, width=400, force_terminal=False)
    argv = ["logs", "quiet", "--worker", "actor", "--source", "scheduler"]
    args = build_parser().parse_args(argv)
    assert commands.run_logs(args, console) == 0
    said = console.export_text()
    assert "no lines from worker 'actor' of run 'quiet'" in said
    assert "TROUPE_LOG_LEVEL=INFO" in said and "run folder's logs" in said


def test_a_local_run_asked_for_its_scheduler_s_output_says_it_has_none(monkeypatch, tmp_path):
    """``--source scheduler`` of a local run said "no lines" and that workers print NOTICE and
    above only, while its troupe run's console had shown their warnings."""
    from rich.console import Console

    from distributed.cli import build_parser
    from distributed.ops import commands

    rec = LaunchRecord("local", "r", run_dir=str(run_folder_at(tmp_path / "r")))
    monkeypatch.setattr(commands, "resolve", lambda name, runs_dir: rec)
    console = Console(record=True, width=400, force_terminal=False)
    args = build_parser().parse_args(["logs", "r", "--source", "scheduler"])
    assert commands.run_logs(args, console) == 1
    said = console.export_text()
    assert said.startswith("error: a local run has no scheduler's output: its workers print to")
    assert "(--source folder)" in said


class _Service:
    """A Swarm service as the engine reports it: its tasks' states; scale() stops them."""

    def __init__(self, *states: tuple[str, str]):
        self.states = list(states)
        self.scaled = None

    def tasks(self):
        return [{"Status": {"State": s, "Err": err, "ContainerStatus": {"ExitCode": 137}}}
                for s, err in self.states]  # fmt: skip

    def scale(self, replicas):
        self.scaled = replicas
        self.states = [("complete", "")]


class _Client:
    def __init__(self, service):
        self.services = type("Services", (), {"get": lambda _self, name: service})()


@pytest.mark.parametrize(
    ("states", "said"),
    [
        ([("failed", "task: non-zero exit (137)")], "already ended (exit code 137)"),
        ([("pending", "No such image: troupe-worker:nosuch")],
         "not running (pending: No such image: troupe-worker:nosuch)"),
        ([("running", "")], "Swarm sent it SIGINT and it stopped in order"),
    ],
)  # fmt: skip
def test_swarm_stop_says_what_became_of_the_controller(states, said):
    """``troupe stop`` said "it stopped in order" of a controller that had been killed, or that
    never started (its image missing), and no summary was written."""
    from distributed.deploy import swarm

    service = _Service(*states)
    told = swarm.stop_controller(_Client(service), "run", timeout_s=5)
    assert said in told, told
    assert (service.scaled == 0) == (states[0][0] == "running")  # only a running one is asked


def test_status_of_an_ended_run_names_the_workers_that_still_run(monkeypatch, tmp_path):
    """After its engine's restart, Swarm starts a run's worker tasks again with no controller
    (it is not restarted): status said `ended (interrupted)` over a table of running tasks."""
    from rich.console import Console

    from distributed.cli import build_parser
    from distributed.ops import commands

    run_dir = run_folder_at(tmp_path / "r")
    (run_dir / "summary.json").write_text('{"stop_reason": "interrupted"}')

    class Restarted:
        running = 2

        def alive(self, record):
            return False

        def processes(self, record):
            return [
                backends.Process("troupe-r-controller", "controller", "0/1 running"),
                backends.Process(
                    "troupe-r-actor", "actor/{ordinal}", "2/2 running", running=self.running
                ),
            ]

    be = Restarted()
    monkeypatch.setattr(commands, "resolve", lambda name, runs_dir: rec)
    monkeypatch.setattr(commands.backends, "backend", lambda record: be)
    rec = LaunchRecord("swarm", "r", run_dir=str(run_dir))
    args = build_parser().parse_args(["status", "r"])
    for running, said in ((2, True), (0, False)):
        be.running = running
        console = Console(record=True, width=400, force_terminal=False)
        assert commands.run_status(args, console) == 0
        text = console.export_text()
        assert "run r (swarm): ended (interrupted)" in text
        assert ("workers of it still run (troupe-r-actor)" in text) is said, text
        assert ("`troupe stop r` removes them" in text) is said, text


def test_ps_with_no_runs_says_so_and_where_to_look(tmp_path):
    """`troupe ps` in a folder whose runs were given --run-dir printed an empty table, its
    header alone, as if the listing had failed."""
    from rich.console import Console

    from distributed.cli import build_parser
    from distributed.ops import commands

    (tmp_path / "empty").mkdir()
    for runs, where in ((tmp_path / "nowhere", "no such folder"), (tmp_path / "empty", "none")):
        console = Console(record=True, width=300, force_terminal=False)
        args = build_parser().parse_args(["ps", "--runs-dir", str(runs)])
        assert commands.run_ps(args, console) == 0
        said = console.export_text()
        assert said.startswith(f"no runs under {runs}/ ({where}") and "troupe status" in said
        assert "┃ run" not in said
