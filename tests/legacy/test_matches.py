"""Head-to-head matches on connect four, and the same opponents behind the runtime's workers."""

from __future__ import annotations

import pytest

pytest.importorskip("pettingzoo", reason="needs the 'multiagent' extra")

from api import environment, policy, testing
from api.config import (
    ActorConfig,
    ComponentConfig,
    EvaluationConfig,
    ExperimentConfig,
    PolicyConfig,
    StopConfig,
)
from api.errors import UserError
from legacy.matches import MatchReport, play_matches

GAME = "ConnectFour-v3"


def _make(name: str, seed: int = 0):
    env = environment.make(GAME)
    return policy.make(
        name,
        observation_space=env.observation_spaces[0],
        action_space=env.action_spaces[0],
        seed=seed,
    )


def test_heuristic_beats_random_in_the_vast_majority_of_games():
    report = play_matches(GAME, [_make("connect-four-heuristic"), _make("random-legal")], 200)
    assert report.games == 200 and report.wins + report.draws + report.losses == 200
    assert report.win_rate > 0.9, str(report)
    assert sorted(report.by_seat) == [0, 1] and sum(report.by_seat[0]) == 100  # seats rotate


def test_random_against_random_is_even_up_to_the_first_move_advantage():
    report = play_matches(GAME, [_make("random-legal", 1), _make("random-legal", 2)], 400)
    assert abs(report.win_rate - report.loss_rate) < 0.12, str(report)
    first_mover_wins = report.by_seat[0][0] + report.by_seat[1][2]  # seat 0 moves first
    assert 0.5 < first_mover_wins / report.games < 0.7, str(report)


def test_fixed_seats_and_a_deterministic_pair_give_one_result():
    heuristic = _make("connect-four-heuristic")
    report = play_matches(GAME, [heuristic, heuristic], 6, rotate_seats=False, tables=3)
    assert report.by_seat == {0: [6, 0, 0]}  # the same game six times: the first mover wins


def test_seats_must_match_the_policies():
    with pytest.raises(UserError, match="2 seats but 3 policies"):
        play_matches(GAME, [_make("random-legal")] * 3, 2)


def test_report_text_names_rates_and_seats():
    report = MatchReport()
    report.record(0, 0)
    report.record(1, 2)
    assert str(report) == (
        "2 games: win 50.0%, draw 0.0%, loss 50.0% (wins/draws/losses by seat: seat 0: 1/0/0, "
        "seat 1: 0/0/1)"
    )


def _two_seat_config(first: ComponentConfig, first_trainer: str = "") -> ExperimentConfig:
    return ExperimentConfig(
        name="c4-vs-scripted",
        environment=ComponentConfig(GAME),
        policies={
            "first": PolicyConfig(
                policy=first, trainer=ComponentConfig(first_trainer), batch_segments=4
            ),
            "second": PolicyConfig(policy=ComponentConfig("random-legal", {"seed": 3})),
        },
        agent_policies=["first", "second"],
        actors=ActorConfig(workers=1, envs_per_worker=4, segment_length=16),
        evaluation=EvaluationConfig(workers=1, envs_per_worker=4),
        stop=StopConfig(env_frames=1),
    )


def test_scripted_opponents_play_through_the_runtimes_own_workers():
    """Actor and policy workers (serial mode) stepping the adapter: the heuristic still wins."""
    from system.run.serial import SerialRun

    config = _two_seat_config(ComponentConfig("connect-four-heuristic"))
    run = SerialRun(config, train=False, validate_actions=True)
    try:
        episodes = run.eval_until(40)
    finally:
        run.close()
    wins = sum(e["policy/first/episode_return"] > 0 for e in episodes)
    assert wins >= 36, episodes
    assert all(
        e["policy/first/episode_return"] == -e["policy/second/episode_return"] for e in episodes
    )


def test_a_learned_policy_trains_against_a_scripted_one():
    config = _two_seat_config(ComponentConfig("actor-critic", {"hidden_sizes": [32]}), "ppo")
    report = testing.test_pipeline(experiment=config, trainer_steps=2, episodes=4)
    assert report.trainer_steps == {"first": 2} and report.episodes >= 4
