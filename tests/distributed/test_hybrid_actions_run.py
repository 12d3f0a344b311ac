"""``troupe train`` on a gymnasium environment whose action mixes a discrete choice and a
continuous value (``{"move": Discrete(3), "push": Box(-1, 1, (1,))}``), as a user runs it: the
run acts in one HybridBox, the environment gets its own Dict, and ``load_policy`` plays it. Every
experiment refused such an environment before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_agent_kinds_run import troupe  # the CLI as a user runs it, in a process

ROOT = Path(__file__).resolve().parents[2]

AIM = """\
import gymnasium as gym
import numpy as np


class Aim(gym.Env):
    \"\"\"Pick the third of [-1, 1] that a lies in (the move) and match b (the push).\"\"\"

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Dict(
        {"move": gym.spaces.Discrete(3, start=1), "push": gym.spaces.Box(-1, 1, (1,), np.float32)}
    )

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.obs = 0, self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self.obs, {}

    def step(self, action):
        assert action in self.action_space, action  # its own Dict, each part in its space
        a, b = self.obs
        right = 1 + int(np.digitize(a, [-1 / 3, 1 / 3]))
        reward = float(action["move"] == right) - float((action["push"][0] - b) ** 2)
        self.t += 1
        self.obs = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self.obs, reward, False, self.t >= 20, {}


gym.register("Aim-v0", entry_point=Aim)
"""

PLAY = """\
import json
import sys

import troupe
import aim  # noqa: F401  (registers Aim-v0)

policy = troupe.load_policy(sys.argv[1])
env = policy.make_env(evaluation=True)
(step,), state = env.reset(), None
while not (step.done or step.truncated):
    action, state = policy.act(step.obs, state)
    (step,) = env.step([action])
print(json.dumps([float(x) for x in action]))
"""


def _train(tmp_path: Path, *args: str) -> Path:
    (tmp_path / "aim.py").write_text(AIM)
    run = tmp_path / "run"
    result = troupe(
        "train", "--import", "aim.py", "Aim-v0", *args, "--run-dir", str(run), "--no-display",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return run


@pytest.mark.multiprocess
@pytest.mark.parametrize("algo", ["ppo", "impala"])
def test_a_choice_with_a_value_trains_and_plays_as_the_environments_own_action(tmp_path, algo):
    run = _train(tmp_path, "--algo", algo, "frames=3000", "evaluation.workers=0")
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert max(r.get("trainer/default/steps") or 0 for r in records) >= 1
    (tmp_path / "play.py").write_text(PLAY)
    played = subprocess.run(
        [sys.executable, "play.py", str(run)], capture_output=True, text=True, timeout=300,
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"},
    )  # fmt: skip
    assert played.returncode == 0, played.stderr[-3000:]  # the environment asserts its actions
    action = json.loads(played.stdout.strip().splitlines()[-1])
    assert action[0] in (0.0, 1.0, 2.0) and -1.0 <= action[1] <= 1.0  # the flat action: index


@pytest.mark.learning
@pytest.mark.multiprocess
def test_ppo_learns_the_choice_and_the_value_together(tmp_path):
    """A greedy return of 17 of 20 needs both parts right: the move (1 a step) and a push
    near b (each step's squared miss taken off)."""
    run = _train(tmp_path, "frames=150000", "target=17")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["solved"], summary
