"""``troupe train`` on an MPE game made from mpe2, as a user runs it: MPE's predator-prey game,
whose three chasers share one policy and whose runner has its own, trains both in real worker
processes; the shared policy's trainer takes a batch for each of its agents."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("mpe2", reason="needs the 'mpe' extra")


@pytest.mark.multiprocess
def test_troupe_train_plays_mpe_predator_and_prey_with_a_policy_for_each(tmp_path):
    run_dir = tmp_path / "tag"
    command = [sys.executable, "-m", "distributed.cli", "train", "pettingzoo:mpe/simple_tag_v3",
               "frames=4000", "--run-dir", str(run_dir), "--no-display"]  # fmt: skip
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["agent_policies"] == ["adversary"] * 3 + ["agent"]
    segments = {name: p["batch_segments"] for name, p in config["policies"].items()}
    assert segments == {"adversary": 3 * 16, "agent": 16}  # 1,024 transitions an agent
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "env_frames" and summary["env_frames"] >= 4000
    assert min(summary["policy_versions"].values()) >= 2, summary  # both trained
