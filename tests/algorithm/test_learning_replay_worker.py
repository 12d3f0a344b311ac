"""Learning check of the replay worker role: ``troupe run pendulum-sac`` as a user runs it (actor,
policy, replay, trainer, evaluation and parameter-service processes over sockets) must reach a
greedy return above -250 within 20k environment frames. Run alone with ``pytest -m learning -s``.
"""

from __future__ import annotations

import json

import pytest
from e2e_support import finish, start

pytestmark = [pytest.mark.learning, pytest.mark.multiprocess]


def test_pendulum_sac_through_the_replay_worker_beats_minus_250_within_20k_frames(tmp_path):
    run_dir = tmp_path / "run"
    arguments = ["run", "pendulum-sac", "stop.env_frames=20000"]
    out = finish(start([*arguments, "--run-dir", str(run_dir), "--no-display"]), 900)
    summary = json.loads((run_dir / "summary.json").read_text())
    print(
        f"pendulum-sac: solved={summary['solved']} at {summary['frames_to_target']} frames, "
        f"eval {summary['eval_window_means']}, {summary['wall_s']:.0f}s",
        flush=True,
    )
    assert summary["solved"], out[-3000:]
    assert summary["frames_to_target"] <= 20_000
    workers = json.loads((run_dir / "workers.json").read_text())
    assert all(w["restarts"] == 0 for w in workers.values()), workers
