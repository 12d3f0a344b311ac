"""An observation that does not fit its space is caught at the actor, with the environment named.

Before, a policy worker in another process dropped such a request as malformed (rightly: it
cannot tell a broken environment from garbage on its socket), and the actor that sent it waited
for an answer that never came: the run went on at 0 frames/s with a warning a second, and never
ended. In one process the request reached the network and failed there, far from its cause.
The environment here is a real gymnasium CartPole whose observation grows at a chosen step
(test_nonfinite's BrokenCartPole).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import test_nonfinite as nonfinite  # its actor and policy worker in one process
from e2e_support import run_failing_file

from api.environment import Environment, StepResult
from api.namedarray import NamedArray
from api.policy import RolloutResult
from legacy.environment.gym_adapter import GymnasiumEnvironment
from system.errors import EnvironmentFailure
from system.streams import validation
from system.streams.inference import InprocInferenceHub
from system.workers.actor_worker import ActorWorker
from system.workers.lanes import misfit, observation_spec

ROOT = Path(__file__).resolve().parents[2]


def actor_and_policy(make_env, on_env_error: str = "raise"):
    return nonfinite.actor_and_policy("fail", make_env, on_env_error=on_env_error)


def growing(which: set[int], at: int = 3):
    def make(index: int):
        if index in which:
            return GymnasiumEnvironment("BrokenCartPole-v0", at=at, field="shape")
        return GymnasiumEnvironment("CartPole-v1")

    return make


def run(actor, worker, polls: int) -> None:
    for _ in range(polls):
        actor.poll()
        worker.poll()


@pytest.mark.parametrize("which", [{2}, {0, 1, 2, 3}], ids=["one-env", "every-env"])
def test_an_observation_of_the_wrong_shape_fails_the_actor_naming_the_environment(which):
    """One environment (the request cannot be stacked) or all of them (it can, wrongly)."""
    actor, worker, _ = actor_and_policy(growing(which))
    with pytest.raises(EnvironmentFailure) as caught:
        run(actor, worker, 50)
    first = min(which)
    assert str(caught.value) == (
        f"environment 'BrokenCartPole-v0' #{first} of actor/3, agent 0, at step 3 of its "
        "episode returned an observation that does not fit its observation space "
        f"{actor.envs[first].observation_spaces[0]}: observation has shape (5,), declared (4,); "
        "fix the environment (test_environment checks every step against the spaces)"
    )
    actor.close()


def test_on_env_error_reset_rebuilds_the_environment_and_no_misfit_leaves_the_actor():
    actor, worker, segments = actor_and_policy(growing({2}, at=2), on_env_error="reset")
    errors = 0
    for _ in range(60):
        run(actor, worker, 1)
        errors += actor.collect_stats().get("env_errors", 0)
    assert errors >= 10  # every episode of environment 2 misfits at its second step
    assert segments, "the healthy environments kept producing segments"
    assert all(chunk.obs.shape[2:] == (4,) for chunk in segments)
    actor.close()


def test_observations_the_policy_worker_would_accept_pass_unchanged():
    """Same kind, another width (float64 for float32), as the wire accepts; and no check for a
    space that has no simple layout."""
    box = gym.spaces.Box(-1, 1, (3,), np.float32)
    spec = observation_spec(box)
    assert misfit(np.zeros(3, np.float64), spec) is None
    wide = misfit(np.zeros((1, 3), np.float32), spec)
    assert wide == "observation has shape (1, 3), declared (3,)"
    assert misfit(np.zeros(3, np.complex64), spec) == (
        "observation has dtype complex64, declared float32"
    )
    nested = gym.spaces.Dict({"image": box, "step": gym.spaces.Discrete(5)})
    assert misfit({"image": np.zeros(3, np.float32), "step": 2}, observation_spec(nested)) is None
    assert "missing ['step']" in misfit(
        {"image": np.zeros(3, np.float32)}, observation_spec(nested)
    )
    assert observation_spec(gym.spaces.Tuple((box, box))) is None
    assert misfit(object(), None) is None
    # the layout is the one the policy workers check requests against
    row = validation.spec_of(np.stack([box.sample()]), 1)
    assert (row.shape, row.dtype) == (spec.shape, spec.dtype)


class DictObs(Environment):
    """A one-agent environment with a Dict observation that loses a key at ``at``."""

    def __init__(self, at: int = 2):
        self.at, self.t = at, 0

    agent_count = 1
    observation_spaces = [
        gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (2,), np.float32), "n": gym.spaces.Discrete(3)})
    ]
    action_spaces = [gym.spaces.Discrete(2)]

    def reset(self):
        self.t = 0
        return [StepResult({"x": np.zeros(2, np.float32), "n": 0})]

    def step(self, actions):
        self.t += 1
        obs = {"x": np.zeros(2, np.float32)} if self.t >= self.at else {"x": np.zeros(2), "n": 1}
        return [StepResult(obs, 0.0, self.t >= 9)]


def test_a_dict_observation_that_loses_a_field_is_named():
    hub = InprocInferenceHub()
    actor = ActorWorker("a", lambda i: DictObs(), 2, lambda _: "p", hub.client("a"), None)
    server = hub.server("p")
    with pytest.raises(EnvironmentFailure, match=r"#0 of a, agent 0, at step 2 of its episode "
                       r"returned an observation that does not fit .*missing \['n'\]"):  # fmt: skip
        for _ in range(5):
            actor.poll()
            for pending in server.gather(100, 0):
                n = pending.rows
                out = NamedArray(log_prob=np.zeros((n, 1), np.float32))
                server.reply(pending, RolloutResult(np.zeros(n, np.int64), out), 1)
    actor.close()


USER_FILE = '''\
import gymnasium as gym
import numpy as np
from api.environment import Environment, StepResult, register


class Stretching(Environment):
    """Declares 3 values an observation and returns 4 from step ``at`` of every episode."""

    def __init__(self, at=5):
        self.at, self.t = at, 0

    agent_count = 1
    observation_spaces = [gym.spaces.Box(-1, 1, (3,), np.float32)]
    action_spaces = [gym.spaces.Discrete(2)]

    def reset(self):
        self.t = 0
        return [StepResult(np.zeros(3, np.float32))]

    def step(self, actions):
        self.t += 1
        obs = np.zeros(4 if self.t >= self.at else 3, np.float32)
        return [StepResult(obs, 1.0, self.t >= 20)]


register("Stretching-v0", Stretching)
'''


@pytest.mark.multiprocess
def test_a_run_whose_environment_misfits_ends_with_its_error_instead_of_waiting(tmp_path):
    """Every worker in its own process, as `troupe run` starts them: the actors fail naming
    the environment, and the run ends non-zero (it used to wait at 0 frames/s for ever)."""
    user_file = tmp_path / "stretching.py"
    user_file.write_text(USER_FILE)
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "distributed.cli", "run", "--import", str(user_file),
         "Stretching-v0", "stop.eval_return=None", "--run-dir", str(run_dir), "--no-display"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    failure = json.loads((run_dir / "summary.json").read_text())["failure"]
    assert "environment 'Stretching-v0' #" in failure, failure
    assert "at step 5 of its episode returned an observation that does not fit" in failure
    assert "observation has shape (4,), declared (3,)" in failure
    # a worker that reported its failure exits 1: it was said to have "exited with code 0"
    said = result.stdout + result.stderr
    assert re.search(r"actor/\d exited with code 1; restarting it", said), said[-3000:]


EXPERIMENT_FILE = '''\
import gymnasium as gym
import numpy as np
from api.config import ComponentConfig
from api.environment import Environment, StepResult, register
from legacy.experiments.examples import cartpole_ppo


class OneSpace(Environment):
    """Two agents, one observation space."""

    agent_count = 2
    observation_spaces = [gym.spaces.Box(-1, 1, (3,), np.float32)]
    action_spaces = [gym.spaces.Discrete(2)] * 2

    def reset(self):
        return [StepResult(np.zeros(3, np.float32))] * 2

    def step(self, actions):
        return [StepResult(np.zeros(3, np.float32), 0.0, True)] * 2


register("OneSpace-v0", OneSpace)


def experiment():
    config = cartpole_ppo()
    config.environment = ComponentConfig("OneSpace-v0")
    return config
'''


@pytest.mark.multiprocess
def test_an_environment_that_declares_its_spaces_wrongly_fails_the_run_at_once(tmp_path):
    """Every worker that reads the spaces fails the same way, in every restart: the first
    error ends the run, with no restart (it used to crash-loop five times in every role)."""
    stderr, summary, workers = run_failing_file(tmp_path, "one_space.py", EXPERIMENT_FILE)
    said = "EnvironmentCheckError: environment 'OneSpace-v0': [field 'observation_spaces']"
    assert said in summary["failure"], summary["failure"]
    assert all(w["restarts"] == 0 for w in workers.values()), workers
    assert "restarting" not in stderr
