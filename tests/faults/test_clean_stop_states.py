"""Issue 10, item 8: after a clean stop ``workers.json`` says every worker ``stopped``.

Before the fix a run with 16 actors that ended on its frame budget left 12 of 20 workers shown as
``alive``: the controller wrote the table before it had heard each worker's goodbye. Here a real
``troupe run`` with sixteen actors (the issue's count; at 572747a this test saw 13 of 19 alive)
ends on its budget and every row of the table must be stopped.
"""

from __future__ import annotations

import pytest
from lifecycle_support import finish, read_json, start

pytestmark = pytest.mark.faults

ACTORS = 16


def test_every_worker_is_stopped_in_workers_json_after_a_clean_stop(tmp_path):
    run_dir = tmp_path / "run"
    proc = start([
        "run", "cartpole-ppo", "--run-dir", str(run_dir), "--no-display",
        f"actors.workers={ACTORS}", "actors.envs_per_worker=2", "evaluation.workers=0",
        "stop.eval_return=None", "stop.env_frames=4000",
    ])  # fmt: skip
    out = finish(proc, timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert read_json(run_dir / "summary.json")["stop_reason"] != "failed", out[-3000:]
    table = read_json(run_dir / "workers.json")
    assert len(table) == ACTORS + 3, sorted(table)  # params, trainer, policy worker, actors
    states = {wid: w["state"] for wid, w in table.items()}
    assert set(states.values()) == {"stopped"}, states
