"""Helpers for fault tests that run the real ``troupe`` command and kill parts of it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import e2e_support
import pytest
from e2e_support import frames, read_json

TROUPE = [sys.executable, "-m", "distributed.cli"]
ROOT = Path(__file__).resolve().parents[2]
# Small and steady: two actors, evaluation off, a run that only ends on its frame budget.
SMALL = ["stop.eval_return=None", "evaluation.workers=0", "actors.envs_per_worker=4"]


def start(args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [*TROUPE, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: every process of the run is in it
        env={**os.environ, **(env or {})},
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    """:func:`e2e_support.finish` with room for a run that is killed and restarted."""
    return e2e_support.finish(proc, timeout)


def end_run(*procs: subprocess.Popen) -> None:
    """Kill what is left of runs a test started, each whole process group (the command and
    every worker it started), and reap them: a failed check must not leave a run behind."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def wait_for(condition, proc: subprocess.Popen | None, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"troupe exited ({proc.returncode}) before {what}:\n{proc.stdout.read()}")
        time.sleep(0.1)
    if proc is not None:
        os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail(f"timed out ({timeout}s) waiting for {what}")


def group(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group."""
    out = subprocess.run(["ps", "-o", "pid=,pgid=,stat=", "-e"], capture_output=True, text=True)
    rows = [line.split() for line in out.stdout.splitlines()]
    return [int(r[0]) for r in rows if r[1] == str(pgid) and not r[2].startswith("Z")]


def describe(pids: list[int]) -> str:
    out = subprocess.run(["ps", "-o", "pid,ppid,stat,args", "-p", ",".join(map(str, pids)) or "0"],
                         capture_output=True, text=True)  # fmt: skip
    return "\n".join(line[:160] for line in out.stdout.splitlines())


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def workers(run_dir: Path) -> dict:
    return read_json(run_dir / "workers.json")


def all_alive(run_dir: Path) -> bool:
    table = workers(run_dir)
    return bool(table) and all(w["state"] == "alive" for w in table.values())


def latest_version(run_dir: Path, policy: str = "default") -> int | None:
    """The version in the run folder's ``latest.ckpt`` (what a restarted service starts from)."""
    from system.parameters.store import LATEST_FILE, load_checkpoint_file

    path = run_dir / "checkpoints" / policy / LATEST_FILE
    try:
        return int(load_checkpoint_file(path)["version"])
    except (OSError, ValueError, KeyError):
        return None


def leftovers(run_dir: Path) -> list[Path]:
    """Temporary files a write left behind."""
    return [p for p in run_dir.rglob("*") if ".tmp" in p.name]


def checkpointed_versions(run_dir: Path, policy: str = "default") -> list[int]:
    """The versions of the numbered checkpoints (``v00000042.ckpt``) in the run folder."""
    folder = run_dir / "checkpoints" / policy
    return sorted(int(p.stem[1:]) for p in folder.glob("v*.ckpt"))


def assert_no_version_lost(run_dir: Path, final: int | None, recorded: list[int]) -> None:
    """The run ended with ``final`` (its ``latest.ckpt``), no older than any version it
    recorded along the way (``recorded``: metrics, ``latest.ckpt`` read mid-run, workers'
    reports) or checkpointed."""
    everything = [*recorded, *checkpointed_versions(run_dir)]
    assert final is not None, "no latest.ckpt at the end of the run"
    lost = sorted({v for v in everything if v > final})
    assert not lost, f"versions announced but not in the final checkpoint {final}: {lost}"


def mount_tmpfs(target: Path, *options: str) -> None:
    """A tmpfs at ``target`` (``options`` as ``mount -o`` takes them, e.g. ``size=8m``, ``ro``,
    ``remount``); skips the test with the reason where this process may not mount (not root)."""
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(target)],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", "") or e
        pytest.skip(f"cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN): {detail}")


# --------------------------------------------------------------------- a scheduler's run
SCHEDULED_ENV = {k: v for k, v in os.environ.items() if k != "TROUPE_CURVE_KEYS_FILE"}
SCHEDULED_ENV["COLUMNS"] = "400"


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            [*TROUPE, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=SCHEDULED_ENV,
            start_new_session=True,  # each its own group: a test signals exactly one of them
        )


def start_scheduled(
    run_dir: Path, config, controller_args: list[str]
) -> tuple[subprocess.Popen, dict[str, subprocess.Popen]]:
    """What a scheduler (Docker, Swarm, Kubernetes, Slurm) runs for a run: the real ``troupe
    controller`` (an ``ExternalLauncher``: it starts nothing), then one real ``troupe worker``
    process per planned worker. Worker logs go to ``run_dir/../logs``. The caller ends them
    all (:func:`end_run`), whatever happens."""
    from system.run.plan import plan_workers

    run_dir.mkdir(exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
    logs = run_dir.parent / "logs"
    logs.mkdir(exist_ok=True)
    controller = _spawn(
        ["controller", str(run_dir), "--insecure", "--no-display", "--bind", "tcp://127.0.0.1:*",
         *controller_args],
        run_dir / "controller.log",
    )  # fmt: skip
    workers: dict[str, subprocess.Popen] = {}
    try:
        wait_for(lambda: "controller" in read_json(run_dir / "endpoints.json"), controller, 120,
                 "the controller to write endpoints.json")  # fmt: skip
        address = read_json(run_dir / "endpoints.json")["controller"]
        for plan in plan_workers(config):
            wid, role = plan.worker_id, plan.role.value
            workers[wid] = _spawn(
                ["worker", "--id", wid, "--role", role, "--controller", address, "--insecure",
                 "--bind-host", "127.0.0.1", "--advertise-host", "127.0.0.1"],
                logs / f"{wid.replace('/', '_')}.log",
            )  # fmt: skip
    except BaseException:
        end_run(controller, *workers.values())
        raise
    return controller, workers


def scheduled_running(run_dir: Path, controller: subprocess.Popen, count: int) -> bool:
    """Every one of ``count`` workers alive, and frames counted (the controller still up)."""
    if controller.poll() is not None:
        pytest.fail(f"controller exited:\n{(run_dir / 'controller.log').read_text()}")
    table = read_json(run_dir / "workers.json")
    alive = len(table) == count and all(w["state"] == "alive" for w in table.values())
    return alive and frames(run_dir) > 0


def ended(proc: subprocess.Popen, run_dir: Path, timeout: float) -> None:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log = (run_dir / "controller.log").read_text()
        pytest.fail(f"the controller did not end {timeout:.0f}s after the signal:\n{log[-3000:]}")
