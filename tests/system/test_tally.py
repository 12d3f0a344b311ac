"""The controller's tally: checked stats in, the record and the panel's snapshot out, and the
observers told as figures come."""

from __future__ import annotations

import logging

import pytest

from api.config import make_experiment
from system.errors import WireError
from system.roles import WorkerState
from system.run import tally as tally_lib
from system.run.episodes import Seat
from system.run.plan import plan_workers
from system.run.tally import ENDLESS_STEPS, Tally, WorkerStats
from system.run.worker_record import WorkerRecord


class Observer:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_episodes(self, episodes, evaluation):
        self.calls.append(("episodes", len(episodes), evaluation))

    def on_evaluation(self, mean_return, episodes):
        self.calls.append(("evaluation", mean_return, len(episodes)))

    def on_train_stats(self, policy, stats):
        self.calls.append(("train", policy, stats["steps"]))


@pytest.fixture
def tally():
    config = make_experiment("cartpole-ppo", ["evaluation.episodes=2"])
    observer = Observer()
    records = {p.worker_id: WorkerRecord(p) for p in plan_workers(config)}
    return Tally(config, [observer]), observer, records


def test_stats_that_do_not_fit_are_refused_naming_the_field():
    with pytest.raises(WireError, match="'env_frames' must be an int >= 0"):
        WorkerStats.from_heartbeat({"env_frames": -3})
    with pytest.raises(WireError, match="'episodes' must be a list"):
        WorkerStats.from_heartbeat({"episodes": {"episode_return": 1.0}})
    with pytest.raises(WireError, match=r"'eval_episodes'.* needs a numeric episode_return"):
        WorkerStats.from_heartbeat({"eval_episodes": [{"episode_length": 3}]})
    for bad, field in (
        ({"versions": {"default": [3]}}, r"versions\['default'\]"),
        ({"versions": {"default": [3, "4"]}}, r"versions\['default'\]"),
        ({"seats": [["main", 3]]}, "seat must be"),
        ({"seats": "main"}, "seats must be a list"),
        ({"started_at": "noon"}, "started_at"),
    ):
        with pytest.raises(WireError, match=field):
            WorkerStats.from_heartbeat({"episodes": [{"episode_return": 1.0, **bad}]})


def test_an_episode_record_is_read_once_into_typed_fields():
    sent = {
        "episode_return": 1.0,
        "episode_length": 9,
        "policy/main/episode_return": 1.0,
        "policy/past/episode_return": -1.0,
        "versions": {"main": [4, 5], "past": [2, 2]},
        "seats": [["main", 5, 1.0], ["past", 2, -1.0]],
        "env": "actor/0/3",
        "started_at": 1700000000.5,
        "episode_info/game_return": 21,
        "label": "kept for callbacks",
    }
    (episode,) = WorkerStats.from_heartbeat({"episodes": [sent]}).episodes
    assert episode.policy_return("past") == -1.0 and episode.policy_return("random") is None
    assert episode.policy_return(None) == 1.0 and episode.game_return == 21.0
    assert episode.versions == {"main": (4, 5), "past": (2, 2)}
    assert episode.seats[1] == Seat("past", 2, -1.0)
    assert (episode.env, episode.started_at) == ("actor/0/3", 1700000000.5)
    assert "started_at" not in episode.numbers and "label" not in episode.numbers
    assert episode.numbers["episode_length"] == 9.0
    assert episode.sent == sent  # what the user's callbacks receive


def test_timing_stages_are_kept_apart_from_the_role_s_numbers():
    stats = WorkerStats.from_heartbeat(
        {"version": 3, "loss": 0.5, "stage/compute": 0.7, "stage_wall_s": 1.0, "held": True}
    )
    assert stats.numbers == {"version": 3, "loss": 0.5}
    assert type(stats.numbers["version"]) is int  # a held version is compared as an int
    assert set(stats.timing) == {"stage/compute", "stage_wall_s"} and stats.flags == {"held": True}


def test_the_recent_rate_forgets_the_start_up_the_mean_keeps(tally):
    t, _, records = tally
    actor = records["actor/0"]
    assert t.record(1.0, records.values(), {})[0]["fps_recent"] is None  # nothing to compare
    for second in range(2, 40):  # 100 frames a second for 20 s, then 1,000 a second
        t.add(actor, WorkerStats(env_frames=100 if second <= 20 else 1_000))
        record, roles = t.record(float(second), records.values(), {})
    assert record["fps_recent"] == pytest.approx(1_000.0)  # the last FPS_WINDOW_S only
    assert record["fps"] == pytest.approx((19 * 100 + 19 * 1_000) / 39.0)
    assert t.snapshot(record, roles, records.values(), 39.0).fps == record["fps_recent"]
    t.add(actor, WorkerStats(env_frames=500))
    record, _ = t.record(45.0, records.values(), {})  # a late record: the window reaches back
    assert record["fps_recent"] == pytest.approx((4 * 1_000 + 500) / (45.0 - 35.0))


def test_emulator_frames_are_counted_beside_agent_steps_where_a_step_covers_several(tally):
    """Atari's steps are 4 emulator frames each: ``env_frames`` and the panel counted agent
    steps alone, and a Pong rate read as frames (as Sample Factory's is) was a quarter of it."""
    t, _, records = tally
    t.add(records["actor/0"], WorkerStats.from_heartbeat({"env_frames": 640}))
    record, roles = t.record(1.0, records.values(), {})
    assert "emulator_frames" not in record  # a step is one frame: nothing beside it
    assert t.snapshot(record, roles, records.values(), 1.0).frames_per_step == 1
    t.add(records["actor/1"], WorkerStats.from_heartbeat({"env_frames": 360, "frames_per_step": 4}))
    record, roles = t.record(2.0, records.values(), {})
    assert (record["env_frames"], record["emulator_frames"]) == (1000, 4000)
    assert t.snapshot(record, roles, records.values(), 2.0).frames_per_step == 4
    for bad in (-4, "4", 2.5):
        with pytest.raises(WireError, match="'frames_per_step' must be an int >= 0"):
            WorkerStats.from_heartbeat({"frames_per_step": bad})


def test_actor_episodes_reach_the_record_and_the_observers(tally):
    t, observer, records = tally
    episodes = [{"episode_return": r, "episode_length": 10} for r in (10.0, 30.0)]
    evals = [{"episode_return": 500.0, "env": 0, "started_at": i} for i in range(2)]
    beat = {"env_frames": 640, "episodes": episodes, "eval_episodes": evals}
    t.add(records["actor/0"], WorkerStats.from_heartbeat(beat))
    record, _ = t.record(2.0, records.values(), {"custom/shaped": 1.5})
    assert record["env_frames"] == 640 and record["fps"] == 320.0
    assert record["episode_return"] == 20.0 and record["episode_length"] == 10.0
    assert record["eval/episode_return"] == 500.0 and record["custom/shaped"] == 1.5
    assert observer.calls[:2] == [("episodes", 2, False), ("episodes", 2, True)]
    assert observer.calls[2][0] == "evaluation" and observer.calls[2][2] == 2


def test_the_training_return_is_the_judged_policy_s_as_the_evaluation_return_is():
    """connect4-selfplay judges ``main``: its panel and learning curve showed a training return
    of 0.0 all along (every agent's mean, in a zero-sum game) beside main's evaluation."""
    config = make_experiment("connect4-selfplay", ["evaluation.episodes=2"])
    records = {p.worker_id: WorkerRecord(p) for p in plan_workers(config)}
    t = Tally(config, [])
    game = {"episode_length": 20, "episode_return": 0.0}
    won = {**game, "policy/main/episode_return": 1.0, "policy/past/episode_return": -1.0}
    lost = {**game, "policy/main/episode_return": -1.0, "policy/past/episode_return": 1.0}
    past_only = {**game, "policy/past/episode_return": 0.0}  # main played no part
    beat = {"env_frames": 640, "episodes": [won, won, won, lost, past_only]}
    t.add(records["actor/0"], WorkerStats.from_heartbeat(beat))
    record, _ = t.record(2.0, records.values(), {})
    assert record["episode_return"] == 0.5  # main's: three won, one lost
    assert record["policy/past/episode_return"] == -0.4  # each policy's own, in its 5 games


def test_a_run_whose_episodes_never_end_is_told_so_once(tally, caplog):
    """Once every training environment has stepped ENDLESS_STEPS times with no episode ended
    anywhere, one warning; none where an episode has ended, and a resumed run counts its own
    steps only."""
    t, _, records = tally
    actor, envs = records["actor/0"], t.config.actors.workers * t.config.actors.envs_per_worker
    with caplog.at_level(logging.WARNING, logger=tally_lib.__name__):
        for _ in range(8):
            t.add(actor, WorkerStats(env_frames=ENDLESS_STEPS * envs // 4))
    (said,) = caplog.messages
    assert said.startswith(
        f"no episode has ended in {ENDLESS_STEPS * envs} environment steps ({ENDLESS_STEPS} "
        "per environment): does environment 'CartPole-v1' ever end one?"
    )
    config = make_experiment("cartpole-ppo")
    ended = Tally(config)
    resumed = Tally(config)
    resumed.continue_from({"env_frames": 10 * ENDLESS_STEPS * envs, "wall_s": 60.0})
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=tally_lib.__name__):
        beat = {"env_frames": 100, "episodes": [{"episode_return": 1.0, "episode_length": 9}]}
        ended.add(actor, WorkerStats.from_heartbeat(beat))
        ended.add(actor, WorkerStats(env_frames=2 * ENDLESS_STEPS * envs))
        resumed.add(actor, WorkerStats(env_frames=100))
    assert caplog.messages == []


def test_trainer_stats_make_the_policy_s_keys_and_the_step_rule(tally):
    t, observer, records = tally
    assert not t.trainer_steps_reached(1)  # no trainer has reported
    stats = WorkerStats.from_heartbeat(
        {"steps": 4, "version": 4, "loss": 0.25, "custom/grad_norm": 1.5}
    )
    t.add(records["trainer/default/0"], stats)
    record, roles = t.record(1.0, records.values(), {})
    assert record["policy/default/version"] == 4.0 and record["trainer/default/loss"] == 0.25
    # what a trainer callback logged (system.workers.trainer_hooks) is the policy's own
    assert record["policy/default/custom/grad_norm"] == 1.5
    assert "trainer/default/custom/grad_norm" not in record
    snapshot = t.snapshot(record, roles, records.values(), now=0.0)
    assert snapshot.custom == {"default:grad_norm": 1.5}
    assert snapshot.policies["default"].version == 4
    assert t.trainer_steps_reached(4) and not t.trainer_steps_reached(5)
    assert observer.calls == [("train", "default", 4.0)]
    assert records["trainer/default/0"].stats["version"] == 4  # for workers.json


def test_an_empty_heartbeat_keeps_a_worker_s_last_figures(tally):
    t, _, records = tally
    t.add(records["policy/default/0"], WorkerStats.from_heartbeat({"version": 7}))
    t.add(records["policy/default/0"], WorkerStats.from_heartbeat({}))  # from a busy thread
    assert records["policy/default/0"].stats == {"version": 7}


def test_the_snapshot_names_every_worker_and_the_bottleneck(tally):
    t, _, records = tally
    records["actor/0"].state = WorkerState.ALIVE
    record, roles = t.record(1.0, records.values(), {})
    snapshot = t.snapshot(record, roles, records.values(), now=records["actor/0"].last_seen)
    assert [w.id for w in snapshot.workers] == list(records)
    states = {w.id: w.state for w in snapshot.workers}
    assert states["actor/0"] is WorkerState.ALIVE and states["params"] is WorkerState.STARTING
    assert record["worker_health/alive"] == 1 and snapshot.bottleneck == ""  # none reported


def test_the_judged_policy_s_trainer_version_is_what_a_hold_round_names(tally):
    t, _, records = tally
    assert t.evaluation.policy == "default"  # cartpole-ppo confirms its target: it holds
    t.add(records["trainer/default/0"], WorkerStats.from_heartbeat({"steps": 9, "version": 9}))
    first = {"eval_episodes": [{"episode_return": 1.0}]}  # evaluation has begun: round 1
    t.add(records["actor/0"], WorkerStats.from_heartbeat(first))
    assert t.evaluation.hold_order() == {"policy": "default", "round": 1, "version": 9}


def test_what_the_actors_recovered_from_is_counted_in_the_record(tally):
    """``on_env_error=reset`` and ``on_nonfinite=drop_episode`` lose steps; their counts were
    in the actors' heartbeats only, never in metrics.jsonl."""
    t, _, records = tally
    record, _ = t.record(1.0, records.values(), {})
    assert record["worker_health/env_resets"] == record["worker_health/dropped_episodes"] == 0
    for actor, beat in (
        ("actor/0", {"env_errors": 2}),
        ("actor/1", {"env_errors": 1, "nonfinite_episodes": 4}),
    ):
        t.add(records[actor], WorkerStats.from_heartbeat({"env_frames": 10, **beat}))
    record, _ = t.record(2.0, records.values(), {})
    assert record["worker_health/env_resets"] == 3
    assert record["worker_health/dropped_episodes"] == 4


def test_a_resumed_run_counts_its_evaluation_frames_on(tally):
    """`eval_env_frames` went back to 0 on every resume (29,983 -> 2,660 in metrics.jsonl, in
    latest.json and TensorBoard), while `env_frames` went on."""
    _, _, records = tally
    resumed = Tally(make_experiment("cartpole-ppo"))
    resumed.continue_from({"env_frames": 50_000, "eval_env_frames": 29_983, "wall_s": 25.0})
    resumed.add(records["eval/0"], WorkerStats(eval_env_frames=100))
    record, _ = resumed.record(26.0, records.values(), {})
    assert record["eval_env_frames"] == 30_083 and record["env_frames"] == 50_000
