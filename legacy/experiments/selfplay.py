"""Self-play on a PettingZoo classic game: the learner against its own past versions.

``connect4-selfplay`` trains ``main`` (actor-critic, PPO with an entropy bonus of 0.03; two 3x3
convolutions of 32 channels over the board's piece planes, then an MLP of 256 and 256, one body
for the policy and the value, made left-right symmetric by ``mirror_actions``) on connect four.
Every episode the ``self-play`` policy mapping seats ``main`` first or second (alternately) and
draws the other seat: mostly ``past``, a frozen copy of ``main``'s network whose policy workers play
snapshots of ``main`` (every 5th version joins a pool of the last 20; every 5 seconds each worker
draws the newest one half the time, else one uniformly, and makes a random legal move instead of the
snapshot's one time in ten, so that odd moves keep being met), and sometimes ``main`` itself
(in both seats). Neither scripted policy is ever trained against: evaluation actors play ``main``
greedily against ``random`` (uniform over legal columns) and ``heuristic`` (win, else block, else
the centre); ``main``'s mean return in those games is the evaluation return (``evaluation.policy``),
and the metrics report ``eval/result/main_vs_random`` and ``eval/result/main_vs_heuristic`` (1 a
win, 0.5 a draw) over the last 300 such games, played on 30 boards at up to 600 frames/s (large
batches for the policy workers). Each evaluation window of 300 games is played by one version of
``main`` (``system.run.stopping``), so the version the run stops on is one that met the target
itself: ``summary.json``'s ``solved_version``, what ``troupe eval`` plays. A game returns at most
1 (``stop.max_return``), so a window ends as soon as its version can no longer reach the target;
most versions lose within a few games, and the run judges about a third of them.
``ratings.json`` in the run folder rates every snapshot met, and ``win_rates.png`` plots every
matchup's score.

Needs the ``multiagent`` extra (PettingZoo).
"""

from __future__ import annotations

import re

from api.config import (
    ActorConfig,
    CheckpointConfig,
    ComponentConfig,
    EvaluationConfig,
    ExperimentConfig,
    PolicyConfig,
    StopConfig,
)
from api.config.league import SelfPlayConfig

_NETWORK = dict(
    hidden_sizes=[256, 256],
    activation="relu",
    grid_channels=[32, 32],
    shared_backbone=True,  # one body for actor and critic: half the CPU a frame (BENCHMARKS.md)
    mirror_actions=[6, 5, 4, 3, 2, 1, 0],  # the game reflected left to right is the same game
)
_PPO = dict(
    lr=3e-4, epochs=4, minibatches=4, gamma=0.99, gae_lambda=0.95, clip=0.2, entropy_coef=0.03
)


def _training_league() -> dict:
    """How ``main`` trains, in both recipes: either seat, against its snapshots (``past``, 80%)
    or itself, with a tenth of the opponents' moves random; 2 actors of 32 boards."""
    return dict(
        policy_mapping=ComponentConfig(
            "self-play", dict(learner="main", opponents={"past": 0.8, "main": 0.2})
        ),
        selfplay=SelfPlayConfig(
            learner="main", opponent="past", snapshot_every=5, pool_size=20, random_moves=0.1
        ),
        actors=ActorConfig(workers=2, envs_per_worker=32, segment_length=32, groups=2),
    )


def connect4_selfplay() -> ExperimentConfig:
    """PPO by self-play on ConnectFour-v3, until one version of ``main`` reaches a greedy mean
    return of 0.98 against the scripted players (1 a win, -1 a loss) in three windows of 300
    fresh games, or for 15 minutes (or 4M frames)."""
    learner = ComponentConfig("actor-critic", dict(_NETWORK))
    return ExperimentConfig(
        name="connect4-selfplay",
        environment=ComponentConfig("ConnectFour-v3"),
        policies={
            "main": PolicyConfig(
                policy=learner, trainer=ComponentConfig("ppo", dict(_PPO)), batch_segments=32
            ),
            "past": PolicyConfig(policy=ComponentConfig("actor-critic", dict(_NETWORK))),
            "random": PolicyConfig(policy=ComponentConfig("random-legal")),
            "heuristic": PolicyConfig(policy=ComponentConfig("connect-four-heuristic")),
        },
        **_training_league(),
        evaluation=EvaluationConfig(
            workers=1,
            envs_per_worker=30,  # 10 games each a window; large batches for the policy workers
            episodes=300,  # about 150 games against `random`: a version at 95% rarely passes
            max_fps=600.0,
            policy="main",
            policy_mapping=ComponentConfig(
                "self-play", dict(learner="main", opponents=["random", "heuristic"], seed=1)
            ),
        ),
        stop=StopConfig(
            eval_return=0.98,
            confirm_windows=3,
            max_return=1.0,
            env_frames=4_000_000,
            wall_seconds=900.0,
        ),
        checkpoint=CheckpointConfig(every=20),
    )


def selfplay(
    env: str,
    env_args: dict | None = None,
    target: float | None = None,
    frames: int | None = None,
) -> ExperimentConfig:
    """PPO by self-play on any two-player board game with action masks (a Dict observation of
    ``observation`` and ``action_mask``, e.g. ``pettingzoo:classic/tictactoe_v3``): the
    learner ``main`` plays either seat against snapshots of itself (``past``) or itself, and is
    judged greedily against a random legal player. ``connect4_selfplay``'s recipe without what
    is connect four's own (the mirror of the board, the scripted heuristic). ``target``: stop
    at that greedy mean return against ``random`` (1 a win, -1 a loss; default: none);
    ``frames``: at most (default 2M)."""
    grid = _is_grid(env, dict(env_args or {}))
    network = dict(hidden_sizes=[256, 256], activation="relu", shared_backbone=True)
    if grid:
        network["grid_channels"] = [32, 32]
    return ExperimentConfig(
        name=re.sub(r"[^a-z0-9_.-]+", "-", env.lower()).strip("-") + "-selfplay",
        environment=ComponentConfig(env, dict(env_args or {})),
        policies={
            "main": PolicyConfig(
                policy=ComponentConfig("actor-critic", dict(network)),
                trainer=ComponentConfig("ppo", dict(_PPO)),
                batch_segments=32,
            ),
            "past": PolicyConfig(policy=ComponentConfig("actor-critic", dict(network))),
            "random": PolicyConfig(policy=ComponentConfig("random-legal")),
        },
        **_training_league(),
        evaluation=EvaluationConfig(
            workers=1,
            envs_per_worker=20,  # 10 games each a window
            episodes=200,
            max_fps=600.0,
            policy="main",
            policy_mapping=ComponentConfig(
                "self-play", dict(learner="main", opponents=["random"], seed=1)
            ),
        ),
        stop=StopConfig(
            eval_return=target,
            max_return=1.0,
            env_frames=frames or 2_000_000,
            eval_return_source="given: target=" if target is not None else "",
        ),
    )


def is_board_game(observations: list, actions: list) -> bool:
    """Two agents with the same spaces, each seeing a Dict with ``action_mask``: a turn-based
    board game that :func:`selfplay` can play."""
    import gymnasium as gym

    first = observations[0]
    return (
        len(observations) == 2
        and observations[0] == observations[1]
        and actions[0] == actions[1]
        and isinstance(first, gym.spaces.Dict)
        and "action_mask" in first.spaces
        and "observation" in first.spaces
    )


def _is_grid(env: str, env_args: dict) -> bool:
    """Whether the board is a grid of planes (``[rows, columns, planes]``): convolutions."""
    from api import environment

    made = environment.make(env, **env_args)
    try:
        board = made.observation_spaces[0]["observation"]
        return len(board.shape) == 3
    finally:
        made.close()
