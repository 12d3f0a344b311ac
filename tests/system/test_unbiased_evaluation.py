"""Issue 26, item 1: evaluation is not biased by episode length.

``LengthReturnEnv``'s return is its episode's length (1-60 steps, drawn at each reset): a mean
over "the first N episodes to finish" of several environments stepping at once keeps the short
ones and reads low. With a quota per environment (system.eval_quota) the mean from
``troupe eval`` / ``troupe.evaluate``, from the in-run windows, and from ``load_policy().act``
played one episode at a time agree, within the reported 95% interval of the true mean.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from api import registry
from api.config import make_experiment
from system.eval_quota import QuotaWindow, ReturnSummary, episode_seed, exact_quotas, t_95
from system.run.stopping import EvaluationWindows

USER_CODE = Path(__file__).resolve().parent / "user_code"
sys.path.insert(0, str(USER_CODE))
from length_return import TRUE_MEAN  # noqa: E402

ENV = "length-return"


@pytest.fixture
def length_env():
    registry.register_environment(
        ENV, "length_return:LengthReturnEnv", source=str(USER_CODE / "length_return.py"),
        override=True,
    )  # fmt: skip
    yield
    registry.environments.unregister(ENV)


def _config(*extra: str):
    return make_experiment("cartpole-ppo", [
        f"environment.type={ENV}", "environment.args={}", "evaluation.workers=1",
        "evaluation.envs_per_worker=8", "actors.workers=1", "stop.eval_return=None", *extra,
    ])  # fmt: skip


def test_a_quota_per_environment_counts_long_episodes_as_often_as_short_ones():
    """Episodes in the order they finish: env a's short ones (return 1) come first."""
    arrivals = [("a", 1.0)] * 4 + [("b", 10.0)] * 2
    first_to_finish = [r for _, r in arrivals[:4]]
    window = QuotaWindow(envs=2, per_env=2)
    for env, value in arrivals:
        window.add(env, value)
    assert window.complete and np.mean(first_to_finish) == 1.0
    assert np.mean(window.values()) == 5.5  # two of each environment


def test_in_run_windows_judge_quota_windows_and_ignore_episodes_begun_before_them():
    w = EvaluationWindows(target=5.0, episodes=4, windows=1, envs=2, wall=lambda: 100.0)
    w.add(1.0, env="a", started_at=99.0)  # in progress when the window opened: not counted
    for value in (1.0, 1.0):
        w.add(value, env="a", started_at=100.5)
    assert not w.solved()  # env b has not played its quota yet
    for value in (10.0, 10.0):
        w.add(value, env="b", started_at=100.5)
    assert w.solved() and w.confirmed == [5.5]
    assert "2 consecutive" not in w.describe() and "4 fresh episodes" in w.describe()


def test_exact_quotas_are_decided_by_environment():
    assert exact_quotas(["x", "y", "z"], 10) == {"x": 4, "y": 3, "z": 3}


def test_episode_seeds_are_deterministic_and_distinct():
    seeds = {episode_seed(base, i) for base in range(8) for i in range(50)}
    assert len(seeds) == 400 and episode_seed(3, 7) == episode_seed(3, 7)


def test_the_interval_covers_the_mean():
    summary = ReturnSummary.of([1.0, 2.0, 3.0, 4.0])
    assert summary.ci95_low < 2.5 < summary.ci95_high and summary.episodes == 4


def test_the_interval_of_a_few_episodes_is_students_t_and_one_episode_has_none():
    """The normal quantile made 3 episodes' interval +-0.33 where Student's t gives +-0.72,
    and one episode's a point (+-0)."""
    summary = ReturnSummary.of([0.5, 1.0, 1.0])
    half = (summary.ci95_high - summary.ci95_low) / 2
    assert half == pytest.approx(4.303 * summary.std / np.sqrt(3))
    assert t_95(1) == 12.706 and t_95(30) == 2.042
    assert t_95(31) == pytest.approx(2.0395, abs=5e-4) and t_95(120) == pytest.approx(
        1.9799, abs=5e-4
    )
    assert t_95(10**6) == pytest.approx(1.96, abs=1e-4)
    one = ReturnSummary.of([7.0])
    assert (one.ci95_low, one.ci95_high) == (None, None)
    assert one.describe() == "7.00 ± 0.00 (one episode: no interval of the mean)"


def test_serial_evaluation_has_no_length_bias(length_env):
    """Evaluations from a fresh start, as ``troupe eval`` makes, 16 episodes on 8
    environments, 30 times (seeds 0-29): the first 16 episodes to finish read about 4 points
    low (a short episode finishes first), the quotas (2 per environment) are unbiased."""
    from system.run.serial import SerialRun

    quota, finished = [], []
    for seed in range(30):
        run = SerialRun(_config(f"seed={seed}"), train=False)
        try:
            quota += [e["episode_return"] for e in run.eval_until(16)]
            finished += [e["episode_return"] for e in run.progress.eval_episodes[:16]]
        finally:
            run.close()
    summary = ReturnSummary.of(quota)
    assert summary.ci95_low <= TRUE_MEAN <= summary.ci95_high, summary
    assert np.mean(finished) < summary.ci95_low, (np.mean(finished), summary)


@pytest.mark.multiprocess
def test_eval_evaluate_and_one_at_a_time_agree(tmp_path, length_env):
    """A short real run (``troupe run``), then its policy evaluated three ways: ``troupe
    eval``, ``troupe.evaluate`` and ``load_policy().act`` one episode at a time (the issue's
    Done-when)."""
    import troupe

    root, run_dir = Path(__file__).resolve().parents[2], tmp_path / "run"

    def troupe_cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "distributed.cli", *args], cwd=root,
                              capture_output=True, text=True, timeout=300)  # fmt: skip

    trained = troupe_cli(
        "run", "cartpole-ppo", f"environment.type={ENV}", "environment.args={}",
        "stop.env_frames=3000", "stop.eval_return=None", "evaluation.workers=0",
        "--import", str(USER_CODE / "length_return_registered.py"), "--run-dir", str(run_dir),
        "--no-display",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    evaluated = troupe.evaluate(run_dir, episodes=48, envs=8)
    assert evaluated.ci95_low <= TRUE_MEAN <= evaluated.ci95_high, evaluated
    cli = troupe_cli("eval", str(run_dir), "--episodes", "48", "--envs", "8", "--json")
    assert cli.returncode == 0, cli.stderr[-3000:]
    report = json.loads(cli.stdout.strip().splitlines()[-1])
    assert report["mean_return"] == evaluated.mean_return  # the same seeds, the same episodes
    policy = troupe.load_policy(run_dir)
    env = policy.make_env()
    returns = []
    for i in range(96):
        env.seed(episode_seed(12345, i))
        obs, total, done = env.reset()[0].obs, 0.0, False
        while not done:
            action, _ = policy.act(obs)
            step = env.step([action])[0]
            obs, total, done = step.obs, total + step.reward, step.done
        returns.append(total)
    alone = ReturnSummary.of(returns)
    assert alone.ci95_low <= TRUE_MEAN <= alone.ci95_high, alone
    # the two means differ by no more than their sampling errors allow (95%)
    half_widths = [alone.ci95_high - alone.mean, evaluated.ci95_high - evaluated.mean_return]
    assert abs(alone.mean - evaluated.mean_return) <= np.hypot(*half_widths), (alone, evaluated)
