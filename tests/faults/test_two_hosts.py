"""Two hosts, really: the controller, parameter service and policy worker in one network
namespace, the actors and the trainer in another, joined by a veth pair with real addresses,
every socket CURVE-encrypted, as a cluster's nodes would be. The run solves CartPole through that
link, and survives the link going down for 10 s mid-run: the actors stall (their policy worker
is across the link), then go on; nothing is lost (no worker restarted or failed, frames counted
before the cut are still counted after it).

Each process is started as a cluster's scheduler starts it (``troupe controller``, ``troupe
worker``), inside its namespace with ``ip netns exec``. Needs root (namespaces, veth): CI has it;
elsewhere the test is skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lifecycle_support import end_run

from api.resolve import load_experiment
from system.streams.security import ENV_KEYS_FILE, RunKeys

pytestmark = [
    pytest.mark.faults,
    pytest.mark.multiprocess,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None,
        reason="needs root and iproute2 (network namespaces and a veth pair)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
NS_A, NS_B = "troupe-t-a", "troupe-t-b"
ADDR_A, ADDR_B = "10.213.7.1", "10.213.7.2"
PORT = 15555
CUT_S = 10.0
IN_A = [("params", "parameter_service"), ("policy/default/0", "policy")]
IN_B = [("trainer/default/0", "trainer"), ("actor/0", "actor"), ("actor/1", "actor"),
        ("eval/0", "actor")]  # fmt: skip


def ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, text=True)


@pytest.fixture
def two_hosts():
    """Namespaces A and B, a veth pair between them (A: 10.213.7.1, B: 10.213.7.2)."""
    for ns in (NS_A, NS_B):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # a leftover
    try:
        ip("netns", "add", NS_A)
        ip("netns", "add", NS_B)
        ip("link", "add", "veth-ta", "type", "veth", "peer", "name", "veth-tb")
        ip("link", "set", "veth-ta", "netns", NS_A)
        ip("link", "set", "veth-tb", "netns", NS_B)
        for ns, dev, addr in ((NS_A, "veth-ta", ADDR_A), (NS_B, "veth-tb", ADDR_B)):
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield
    finally:
        for ns in (NS_A, NS_B):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def in_namespace(ns: str, argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "distributed.cli", *argv],
        cwd=ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def worker(ns: str, worker_id: str, role: str, address: str, env: dict, logs: Path):
    controller = f"tcp://{ADDR_A}:{PORT}"
    argv = ["worker", "--id", worker_id, "--role", role, "--controller", controller]
    argv += ["--bind-host", address, "--advertise-host", address]
    return in_namespace(ns, argv, env, logs / f"{worker_id.replace('/', '-')}.out")


def last_record(run_dir: Path) -> dict:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return {}
    for line in reversed(path.read_text().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return {}


def test_a_run_across_two_network_namespaces_survives_the_link_going_down(two_hosts, tmp_path):
    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    run_dir.mkdir()
    logs.mkdir()
    # the run must end on its target, its sign of a normal finish; the recipe's 500k-frame cap
    # once came first for a slow learner (CI, 2026-11-28: 500.0 first at 447k frames)
    config = load_experiment("cartpole-ppo", ["stop.wall_seconds=300", "stop.env_frames=2000000"])
    (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
    RunKeys.generate().save(run_dir / "keys")
    env = {**os.environ, ENV_KEYS_FILE: str(run_dir / "keys"), "PYTHONPATH": str(ROOT)}
    argv = ["controller", str(run_dir), "--bind", f"tcp://{ADDR_A}:{PORT}"]
    argv += ["--advertise-host", ADDR_A, "--no-display", "--restart-grace", "30"]
    controller = in_namespace(NS_A, argv, env, logs / "controller.out")
    workers = [worker(NS_A, w, r, ADDR_A, env, logs) for w, r in IN_A]
    workers += [worker(NS_B, w, r, ADDR_B, env, logs) for w, r in IN_B]
    try:
        deadline = time.monotonic() + 180
        while (last_record(run_dir).get("env_frames") or 0) < 3000:
            assert controller.poll() is None, (logs / "controller.out").read_text()[-3000:]
            assert time.monotonic() < deadline, "no frames through the link"
            time.sleep(0.5)
        endpoints = json.loads((run_dir / "endpoints.json").read_text())
        assert endpoints["controller"] == f"tcp://{ADDR_A}:{PORT}"
        assert any(ADDR_B in a for a in endpoints.values())  # B's workers advertise B's address

        before = last_record(run_dir)["env_frames"]
        ip("-n", NS_B, "link", "set", "veth-tb", "down")  # the link is cut
        cut, during = time.monotonic(), []
        while time.monotonic() - cut < CUT_S:
            during.append((time.monotonic() - cut, last_record(run_dir).get("env_frames")))
            time.sleep(0.25)
        ip("-n", NS_B, "link", "set", "veth-tb", "up")
        code = controller.wait(timeout=300)
    finally:
        end_run(controller, *workers)
    out = (logs / "controller.out").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert code == 0, out[-3000:]
    assert summary["solved"] and summary["stop_reason"] == "eval_return", summary
    stalled = {frames for t, frames in during if t > 3.0}  # the actors' counts cannot cross
    assert len(stalled) == 1, during  # the run stalled while the link was down...
    assert summary["env_frames"] > max(stalled) >= before  # ...and went on once it was back
    table = json.loads((run_dir / "workers.json").read_text())
    assert len(table) == 6 and all(w["restarts"] == 0 for w in table.values()), table
    assert all(w["state"] == "stopped" for w in table.values()), table
    for proc in workers:  # each left on the controller's stop message, none died
        assert proc.wait(timeout=30) == 0
