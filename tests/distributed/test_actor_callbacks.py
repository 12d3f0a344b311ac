"""Issue 28: hooks where the data is. A user's callback, written as README "Metrics and
callbacks" shows, runs inside the actors of a real ``troupe run``: it shapes CartPole's reward
before the step is recorded, sees every step's ``info``, and logs its own numbers, which
appear in metrics.jsonl and TensorBoard as ``custom/<name>`` (mean, min, max), for the run and
for a policy; its trajectory hook adds a declared field to every segment, which the trainers
take (they train, and drop nothing)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess

ROOT = Path(__file__).resolve().parents[2]

USER_FILE = '''\
from api.registry import register_callback


class Shaping:
    """Every step costs 0.1 of CartPole's +1: an episode of L steps returns 0.9 L."""

    segment_fields = {"bonus": ((1,), "float32")}

    def on_episode_start(self, episode):
        episode.user_data["infos"] = 0

    def on_episode_step(self, episode):
        for result in episode.results:
            if result is not None:
                result.reward = result.reward - 0.1
                episode.user_data["infos"] += isinstance(result.info, dict)

    def on_episode_end(self, episode):
        episode.log("steps_with_info", episode.user_data["infos"])
        episode.log("length_seen", episode.length)
        episode.log("agents", len(episode.policies), policy=episode.policies[0])

    def on_segment(self, segment, policy):
        segment.extras.bonus[:] = 0.01  # a bonus the trainer can read, kept apart


class SeeBonus:
    """In the trainer: the field the actors added, in the batch it trains on."""

    def on_train_result(self, result):
        result.log("bonus_seen", result.batch.extras.bonus.mean())


register_callback("shaping", Shaping)
register_callback("see-bonus", SeeBonus)
'''


def _run_shaped(tmp_path: Path, experiment: str, *overrides: str) -> subprocess.CompletedProcess:
    """``troupe run EXPERIMENT`` with USER_FILE's actor and trainer callbacks, into
    ``tmp_path/run``; it must end with exit code 0."""
    user = tmp_path / "shaping.py"
    user.write_text(USER_FILE)
    result = subprocess.run(
        [sys.executable, "-m", "distributed.cli", "run", experiment, "--import", str(user),
         "actor_callbacks=[{'type': 'shaping'}]", "trainer_callbacks=[{'type': 'see-bonus'}]",
         "stop.eval_return=None", *overrides, "--run-dir", str(tmp_path / "run"), "--no-display"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_an_actor_callback_shapes_rewards_sees_infos_and_logs_numbers(tmp_path):
    run_dir = tmp_path / "run"
    # It ends on an evaluation window, not on a frame budget that a loaded machine may spend
    # before its evaluation actor ends an episode; and on a window of a trained version: a
    # target of 5, which any greedy episode reaches, ended a loaded run before the trainer's
    # first step. Untrained, the greedy window of 10 lasted 100 steps or more for 10 of 60
    # initialisations (median 26; the best of the first 30, 417.6 steps, would return 375.8
    # here, at 0.9 a step); 400 is 444 steps, CartPole all but solved.
    result = _run_shaped(tmp_path, "cartpole-ppo", "stop.eval_return=400", "stop.confirm_windows=1",
                         "stop.env_frames=1000000", "evaluation.workers=1")  # fmt: skip
    assert json.loads((run_dir / "summary.json").read_text())["stop_reason"] == "eval_return"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if "custom/length_seen" in r][-1]
    # every step of every episode was seen, with its info
    assert last["custom/steps_with_info"] == pytest.approx(last["custom/length_seen"])
    assert last["custom/length_seen"] == pytest.approx(last["episode_length"])
    assert last["custom/length_seen/min"] <= last["custom/length_seen"]
    assert last["custom/length_seen"] <= last["custom/length_seen/max"]
    # the shaped reward is what was recorded: a return of 0.9 per step
    assert last["episode_return"] == pytest.approx(0.9 * last["episode_length"], rel=1e-6)
    assert any("eval/custom/length_seen" in r for r in records)  # evaluation actors too
    assert last["policy/default/custom/agents"] == 1.0
    # the segments with their declared field fit the run's layout: trained on, none dropped,
    # and the trainer's callback found the field in its batches
    assert max(r.get("trainer/default/steps") or 0 for r in records) >= 1
    seen = [
        r["policy/default/custom/bonus_seen"]
        for r in records
        if "policy/default/custom/bonus_seen" in r
    ]
    assert seen and seen[-1] == pytest.approx(0.01)
    logs = "".join(f.read_text() for f in (run_dir / "logs").glob("*.log"))
    assert "malformed message" not in logs + result.stderr
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    assert "custom/steps_with_info" in acc.Tags()["scalars"]
    assert "custom/length_seen/max" in acc.Tags()["scalars"]
    assert "steps_with_info" in result.stdout  # the plain progress line shows them


def test_the_fields_actors_add_reach_an_off_policy_trainer_through_its_replay_worker(tmp_path):
    """A DQN or SAC trainer's callback found no ``extras`` in its batch: the replay buffer kept
    the segments' standard fields alone, and the run ended on the callback's AttributeError."""
    run_dir = tmp_path / "run"
    result = _run_shaped(
        tmp_path, "cartpole-dqn", "stop.env_frames=3000", "policies.default.replay.min_size=500"
    )
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    seen = [r["policy/default/custom/bonus_seen"] for r in records
            if "policy/default/custom/bonus_seen" in r]  # fmt: skip
    assert seen and seen[-1] == pytest.approx(0.01)
    logs = "".join(f.read_text() for f in (run_dir / "logs").glob("*.log"))
    assert "malformed" not in logs + result.stderr


def test_a_hook_that_raises_ends_the_run_at_once_naming_it(tmp_path):
    user = tmp_path / "broken.py"
    user.write_text(
        textwrap.dedent("""\
        from api.registry import register_callback


        class Broken:
            def on_episode_step(self, episode):
                raise KeyError("no such thing")


        register_callback("broken", Broken)
    """)
    )
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "distributed.cli", "run", "cartpole-ppo", "--import", str(user),
         "actor_callbacks=[{'type': 'broken'}]", "stop.env_frames=4000", "--run-dir",
         str(run_dir), "--no-display"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "actor callback 'broken' raised in on_episode_step" in summary["failure"], summary
    workers = json.loads((run_dir / "workers.json").read_text())
    assert sum(w["restarts"] for w in workers.values()) == 0  # fatal: not restarted in a loop
