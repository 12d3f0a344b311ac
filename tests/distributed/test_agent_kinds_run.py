"""``troupe train`` on an environment of one's own whose agents differ, as a user runs it: a
chaser with discrete moves and a runner with continuous ones each get a policy, both train in
one run, and ``troupe eval`` reports who beat whom."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHASE = """\
import gymnasium as gym
import numpy as np

from api.environment import Environment, StepResult, register

MOVES = np.array([[0, 0], [1, 0], [-1, 0], [0, 1], [0, -1]], float) * 0.3


class Chase(Environment):
    \"\"\"Agent 0 chases (5 moves; sees 4 numbers), agent 1 runs (a 2-d push; sees 6).\"\"\"

    def __init__(self, steps=20):
        self.steps, self.rng = steps, np.random.default_rng(0)

    agent_count = 2

    @property
    def observation_spaces(self):
        return [gym.spaces.Box(-10, 10, (4,), np.float32),
                gym.spaces.Box(-10, 10, (6,), np.float32)]

    @property
    def action_spaces(self):
        return [gym.spaces.Discrete(5), gym.spaces.Box(-1, 1, (2,), np.float32)]

    def seed(self, seed):
        self.rng = np.random.default_rng(seed)

    def _observe(self):
        d = self.runner - self.chaser
        return [np.concatenate([self.chaser, d]).astype(np.float32),
                np.concatenate([self.runner, -d, [self.t / self.steps, 1.0]]).astype(np.float32)]

    def reset(self):
        self.t = 0
        self.chaser, self.runner = self.rng.uniform(-3, 3, 2), self.rng.uniform(-3, 3, 2)
        return [StepResult(o) for o in self._observe()]

    def step(self, actions):
        self.chaser = np.clip(self.chaser + MOVES[int(actions[0])], -5, 5)
        self.runner = np.clip(self.runner + 0.2 * np.clip(actions[1], -1, 1), -5, 5)
        self.t += 1
        distance = float(np.linalg.norm(self.runner - self.chaser))
        caught = distance < 0.5
        cut = self.t >= self.steps and not caught
        chaser, runner = self._observe()
        return [StepResult(chaser, -distance / 10, caught, cut),
                StepResult(runner, distance / 10, caught, cut)]


register("Chase-v0", Chase)
"""


def troupe(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "distributed.cli", *args],
        capture_output=True, text=True, timeout=300, cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


@pytest.mark.multiprocess
def test_troupe_train_trains_a_policy_per_kind_of_agent(tmp_path):
    (tmp_path / "chase.py").write_text(CHASE)
    run = tmp_path / "run"
    result = troupe(
        "train", "--import", "chase.py", "Chase-v0", "frames=6000", "--run-dir", str(run),
        "--no-display", cwd=tmp_path,
    )  # fmt: skip
    said = result.stdout + result.stderr
    assert result.returncode == 0, said[-3000:]
    assert "policies: agent0 plays agent 0, agent1 plays agent 1" in result.stdout
    config = json.loads((run / "config.json").read_text())
    assert config["agent_policies"] == ["agent0", "agent1"]
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    for policy in ("agent0", "agent1"):
        assert max(r.get(f"trainer/{policy}/steps") or 0 for r in records) >= 1, policy
        assert any(r.get(f"policy/{policy}/episode_return") is not None for r in records)
    evaluated = troupe("eval", str(run), "--episodes", "4", "--json", cwd=tmp_path)
    assert evaluated.returncode == 0, (evaluated.stdout + evaluated.stderr)[-3000:]
    result = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert set(result["results"]) == {"agent0_vs_agent1", "agent1_vs_agent0"}


TWO_REACH = """\
import gymnasium as gym
import numpy as np

from api.environment import Environment, StepResult, register


class TwoReach(Environment):
    \"\"\"Two agents with the same spaces push their points towards the origin.\"\"\"

    agent_count = 2

    def __init__(self):
        self.rng = np.random.default_rng(0)

    @property
    def observation_spaces(self):
        return [gym.spaces.Box(-10, 10, (2,), np.float32)] * 2

    @property
    def action_spaces(self):
        return [gym.spaces.Box(-1, 1, (2,), np.float32)] * 2

    def seed(self, seed):
        self.rng = np.random.default_rng(seed)

    def reset(self):
        self.t, self.points = 0, self.rng.uniform(-3, 3, (2, 2))
        return [StepResult(p.astype(np.float32)) for p in self.points]

    def step(self, actions):
        self.t += 1
        self.points = np.clip(self.points + 0.2 * np.asarray(actions), -5, 5)
        return [StepResult(p.astype(np.float32), -float(np.linalg.norm(p)), False, self.t >= 30)
                for p in self.points]


register("TwoReach-v0", TwoReach)
"""


@pytest.mark.multiprocess
def test_sac_on_two_agents_sharing_a_policy_gets_past_its_learning_start(tmp_path):
    """Two agents bring chunks twice the size the default tolerance of the replay's rate
    limiter was set for: inserts stopped short of min_size, so nothing was sampled, and the
    run stalled at 528 frames with its trainer never stepping."""
    (tmp_path / "reach.py").write_text(TWO_REACH)
    run = tmp_path / "run"
    result = troupe(
        "train", "--import", "reach.py", "TwoReach-v0", "--algo", "sac", "frames=1200",
        "evaluation.workers=0", "stop.stall_seconds=60", "--run-dir", str(run), "--no-display",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert max(r.get("trainer/default/steps") or 0 for r in records) >= 1
