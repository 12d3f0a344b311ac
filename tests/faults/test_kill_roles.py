"""SIGKILL of each role in turn mid-run: actor, policy worker, trainer, parameter service.

The run goes on after each kill and finishes by itself (its frame budget), exit 0; versions never
go backwards (per process, in the metrics, in ``latest.ckpt``); the parameter service comes back
from the run folder with every version it had announced (its ``latest.ckpt`` is written before a
version is pushed), and the run ends with a version no older than any the run folder recorded;
no process outlives the run.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from lifecycle_support import (
    SMALL,
    all_alive,
    assert_no_version_lost,
    finish,
    group,
    latest_version,
    leftovers,
    read_json,
    start,
    wait_for,
    workers,
)

from system.run.report import read_metrics

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess]

ROLES = ["actor/0", "policy/default/0", "trainer/default/0", "params"]
FRAME_BUDGET = 120_000
"""The run's stopping rule: room for the four kills and restarts (every role was back, serving
new versions, by 34k frames on a shared 2-core machine), then the run ends by itself. Should a
much slower machine use it up before the last kill, the wait for that kill says so."""


class Versions:
    """Versions each worker process reported (workers.json), checked as they come."""

    def __init__(self):
        self.by_process: dict[tuple[str, int], int] = {}
        self.served = 0  # the newest version any policy worker served
        self.trained = 0  # the newest version a trainer published

    def read(self, run_dir) -> None:
        for wid, w in workers(run_dir).items():
            if w.get("version") is None or w.get("pid") is None or w["state"] != "alive":
                continue
            key, version = (wid, w["pid"]), int(w["version"])
            assert version >= self.by_process.get(key, -1), f"{wid} went back to {version}"
            self.by_process[key] = version
            if w["role"] == "policy":
                self.served = max(self.served, version)
            if w["role"] == "trainer":
                self.trained = max(self.trained, version)


def test_each_role_killed_in_turn_the_run_finishes_and_loses_no_version(tmp_path):
    run_dir = tmp_path / "run"
    budget = f"stop.env_frames={FRAME_BUDGET}"
    args = ["run", "cartpole-ppo", *SMALL, budget, "--run-dir", str(run_dir)]
    proc = start([*args, "--no-display"])
    seen = Versions()
    announced: list[int] = []  # latest.ckpt, read before and after each kill

    def progressing(after: int):
        def check():
            seen.read(run_dir)
            return all_alive(run_dir) and min(seen.served, seen.trained) > after

        return check

    wait_for(progressing(2), proc, 300, "every worker alive, version 3 served")
    for wid in ROLES:
        before = workers(run_dir)[wid]
        served = max(seen.served, seen.trained, latest_version(run_dir) or 0)
        announced.append(latest_version(run_dir) or 0)
        os.kill(before["pid"], signal.SIGKILL)
        if wid == "params":  # announced means on disk: nothing a policy worker had is lost
            # (not the trainer's newest: it publishes without waiting for the answer, so the
            # service may be killed before it took that version; CI met 24 on disk, trainer 25)
            assert (latest_version(run_dir) or -1) >= seen.served

        def restarted(wid=wid, before=before):
            w = workers(run_dir)[wid]
            return w["restarts"] == before["restarts"] + 1 and w["pid"] != before["pid"]

        killed_at = time.monotonic()
        wait_for(restarted, proc, 120, f"{wid} restarted")
        wait_for(progressing(served), proc, 180, f"new versions served after killing {wid}")
        print(f"{wid}: new versions served {time.monotonic() - killed_at:.1f}s after the kill")
        announced.append(latest_version(run_dir) or 0)

    out = finish(proc)  # the run ends by itself, on its frame budget
    assert proc.returncode == 0, out
    # Peers followed each restart from the controller's notice, never by waiting out a timeout.
    assert "did not answer 'publish'" not in out, out[-5000:]
    summary = read_json(run_dir / "summary.json")
    assert summary["stop_reason"] == "env_frames", summary
    table = workers(run_dir)
    assert {w: table[w]["restarts"] for w in ROLES} == dict.fromkeys(ROLES, 1)
    # the summary and the run's last lines say who was restarted, and how each had ended
    assert set(summary["restarts"]) == set(ROLES), summary
    assert all("killed by SIGKILL" in r["last_cause"] for r in summary["restarts"].values())
    assert "workers restarted during the run: " in out and "actor/0 1 time (last: was " in out
    assert {w: s["state"] for w, s in table.items() if s["state"] != "stopped"} == {}, out
    versions = [r["policy/default/version"] for r in read_metrics(run_dir)
                if r.get("policy/default/version") is not None]  # fmt: skip
    assert versions == sorted(versions), "a version went backwards in metrics.jsonl"
    assert announced == sorted(announced), f"latest.ckpt went backwards: {announced}"
    final = latest_version(run_dir)
    assert (run_dir / "checkpoints" / "default" / f"v{final:08d}.ckpt").exists()
    assert_no_version_lost(run_dir, final, [*versions, *announced, *seen.by_process.values()])
    assert summary["policy_versions"]["default"] <= final
    # the forkserver and the resource tracker leave once the controller has gone: give them
    # a moment (the run's own workers were waited for by the controller)
    wait_for(lambda: not group(proc.pid), None, 10, "every process of the run to end")
    assert not leftovers(run_dir)
