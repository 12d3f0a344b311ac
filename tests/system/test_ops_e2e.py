"""``troupe status|logs|stop|ps`` on a real local run, as an operator types them in another
shell while ``troupe run`` goes on in its own."""

from __future__ import annotations

import os
import subprocess

from e2e_support import ROOT, TROUPE, finish, frames, read_json, start, wait_for


def ops(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*TROUPE, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},  # rich tables: no wrapped cells
    )


def test_status_ps_logs_and_stop_of_a_local_run(tmp_path):
    runs = tmp_path / "runs"
    run_dir = runs / "ops-local"
    proc = start(["run", "cartpole-ppo", "stop.eval_return=None", "stop.env_frames=100000000",
                  "--run-dir", str(run_dir), "--no-display"])  # fmt: skip
    follow = None
    try:
        wait_for(lambda: frames(run_dir) > 3000, proc, what="3000 frames")
        status = ops("status", "ops-local", "--runs-dir", str(runs))  # by its name
        assert status.returncode == 0, status.stderr
        assert "run ops-local (local): running" in status.stdout, status.stdout
        assert "trainer/default/0" in status.stdout and "alive" in status.stdout
        assert "env_frames" in status.stdout

        ps = ops("ps", str(run_dir))  # by its folder
        assert ps.returncode == 0, ps.stderr
        pids = [w["pid"] for w in read_json(run_dir / "workers.json").values()]
        for pid in pids:
            assert f"pid {pid}" in ps.stdout, ps.stdout
        listing = ops("ps", "--runs-dir", str(runs))
        assert "ops-local" in listing.stdout and "running" in listing.stdout, listing.stdout

        logs = ops("logs", str(run_dir), "--worker", "actor")  # a role: every actor
        assert logs.returncode == 0, logs.stderr
        assert "[actor/0] " in logs.stdout and "[actor/1] " in logs.stdout, logs.stdout
        assert "actor/0 ready" in logs.stdout
        assert "[trainer/default/0]" not in logs.stdout

        follow = subprocess.Popen(
            # --tail 20: a follower that starts (imports) after the stop has ended the run
            # still shows its last lines; one that starts before follows them as they come
            [*TROUPE, "logs", str(run_dir), "--worker", "controller", "--tail", "20", "-f"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        stop = ops("stop", "ops-local", "--runs-dir", str(runs))
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert "the run stops in order" in stop.stdout
        assert "run 'ops-local' ended: interrupted" in stop.stdout, stop.stdout
    finally:
        out = finish(proc, timeout=90)
    assert proc.returncode == 130, out  # the run's own exit code says it was interrupted
    assert read_json(run_dir / "summary.json")["stop_reason"] == "interrupted"
    followed, _ = follow.communicate(timeout=30)  # it ends by itself once the run has ended
    assert follow.returncode == 0, followed
    assert "[controller] " in followed and "run ended: interrupted" in followed, followed

    after = ops("status", str(run_dir))
    assert "run ops-local (local): ended (interrupted)" in after.stdout, after.stdout
    again = ops("stop", str(run_dir))
    assert again.returncode == 0 and "is not running" in again.stdout, again.stdout


def test_an_unknown_run_is_one_line_naming_where_it_was_looked_for(tmp_path):
    result = ops("status", "no-such-run", "--runs-dir", str(tmp_path))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "no run 'no-such-run'" in result.stderr and str(tmp_path) in result.stderr
