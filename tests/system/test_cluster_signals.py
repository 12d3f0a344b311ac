"""What a cluster's scheduler does to stop a run: Kubernetes deletes the controller's pod (the
kubelet sends SIGTERM, what ``troupe stop`` on a Kubernetes run asks for), Swarm and Slurm send
SIGINT. ``troupe controller`` stops the run in order on either and exits 130; its workers, each
``troupe worker`` as a scheduler starts them, leave on its stop message with exit code 0."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from api.resolve import load_experiment

ROOT = Path(__file__).resolve().parents[2]
WORKERS = [("params", "parameter_service"), ("trainer/default/0", "trainer"),
           ("policy/default/0", "policy"), ("actor/0", "actor"), ("actor/1", "actor")]  # fmt: skip

pytestmark = pytest.mark.multiprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def troupe(argv: list[str], log: Path, sigint_ignored: bool = False) -> subprocess.Popen:
    """``sigint_ignored``: start it as a shell starts a background job (``nohup troupe ... &``
    in a script), with SIGINT ignored, which Python keeps unless the program says otherwise."""
    return subprocess.Popen(
        [sys.executable, "-m", "distributed.cli", *argv],
        cwd=ROOT,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=_ignore_sigint if sigint_ignored else None,
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_cluster_controller_stops_the_run_in_order_on_its_schedulers_signal(tmp_path, sig):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    overrides = ["stop.eval_return=None", "stop.env_frames=100000000", "evaluation.workers=0"]
    config = load_experiment("cartpole-ppo", overrides)
    (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
    address = f"tcp://127.0.0.1:{free_port()}"
    argv = ["controller", str(run_dir), "--bind", address, "--advertise-host", "127.0.0.1"]
    # Started with SIGINT ignored, as from a script's background job: the scheduler's SIGINT
    # must stop it all the same (how it was started decided that before, and the test hung when
    # pytest itself ran in the background).
    controller = troupe(
        [*argv, "--no-display", "--insecure"], tmp_path / "controller.out", sigint_ignored=True
    )
    place = ["--controller", address, "--bind-host", "127.0.0.1", "--advertise-host", "127.0.0.1"]
    workers = [
        troupe(["worker", "--id", w, "--role", r, *place, "--insecure"],
               tmp_path / f"{w.replace('/', '-')}.out")
        for w, r in WORKERS
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            metrics = run_dir / "metrics.jsonl"
            lines = metrics.read_text().splitlines() if metrics.exists() else []
            if lines and (json.loads(lines[-1]).get("env_frames") or 0) > 2000:
                break
            assert controller.poll() is None, (tmp_path / "controller.out").read_text()[-3000:]
            assert time.monotonic() < deadline, "no frames"
            time.sleep(0.5)
        os.kill(controller.pid, sig)
        code = controller.wait(timeout=120)
        codes = [w.wait(timeout=60) for w in workers]
    finally:
        for proc in [controller, *workers]:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert code == 130, (tmp_path / "controller.out").read_text()[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["stop_reason"] == "interrupted"
    assert codes == [0] * len(WORKERS)
    table = json.loads((run_dir / "workers.json").read_text())
    assert all(w["state"] == "stopped" for w in table.values()), table


def test_a_cluster_controller_stopped_while_it_starts_stops_before_any_worker(tmp_path):
    """A scheduler's stop while ``troupe controller`` is still being built (a job cancelled as
    it starts): the signal raised in the middle of its imports, a traceback and exit 1 with no
    summary. It is held back now, and the run stops in order before any worker is started."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = load_experiment("cartpole-ppo", ["stop.eval_return=None", "evaluation.workers=0"])
    (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
    argv = ["controller", str(run_dir), "--bind", f"tcp://127.0.0.1:{free_port()}",
            "--advertise-host", "127.0.0.1", "--no-display", "--insecure"]  # fmt: skip
    controller = troupe(argv, tmp_path / "controller.out")
    log = run_dir / "logs" / "controller.log"
    deadline = time.monotonic() + 60
    while not log.exists() and time.monotonic() < deadline:  # run_controller has begun
        time.sleep(0.01)
    controller.send_signal(signal.SIGTERM)
    try:
        code = controller.wait(timeout=120)
    finally:
        if controller.poll() is None:
            controller.kill()
    out = (tmp_path / "controller.out").read_text()
    assert code == 130 and "Traceback" not in out, out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["env_frames"] == 0, summary
