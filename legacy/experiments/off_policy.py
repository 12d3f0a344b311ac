"""The off-policy example experiments (DQN, SAC): actors -> replay worker -> trainer.

Their trainers declare ``needs_replay``, so the runtime starts a replay buffer worker per policy
(``PolicyConfig.replay``) between the actors and the trainer. Registered in ``legacy.plugin``.
"""

from __future__ import annotations

from api.config import (
    ActorConfig,
    ComponentConfig,
    EvaluationConfig,
    ExperimentConfig,
    PolicyConfig,
    ReplayConfig,
    StopConfig,
)


def cartpole_dqn() -> ExperimentConfig:
    """Double, dueling DQN with 3-step returns and prioritised replay on CartPole-v1.

    Exploration decays from 1.0 to 0.05 over the first 10k actions; the trainer may sample each
    inserted frame 8 times on average (``samples_per_insert``), so it neither overfits a small
    buffer while the actors are slow nor falls behind them. Stops at a greedy return of 475: one
    ``troupe run cartpole-dqn`` on a shared 2-core machine met it at 83k frames (283 s wall,
    about 8 sampled transitions per inserted frame throughout), CleanRL's DQN budget is 500k.
    A version is published every 10 trainer steps (``publish_every``): on a quiet 2-core VM
    that took a run from 1,145 to 1,600 frames/s and from 78.8 s to 59.6 s to solve
    (BENCHMARKS.md).
    """
    return ExperimentConfig(
        name="cartpole-dqn",
        environment=ComponentConfig("CartPole-v1"),
        policies={
            "default": PolicyConfig(
                policy=ComponentConfig(
                    "q-network",
                    dict(
                        hidden_sizes=[64, 64],
                        dueling=True,
                        epsilon=dict(start=1.0, end=0.05, decay_frames=10_000),
                    ),
                ),
                trainer=ComponentConfig("dqn", dict(lr=1e-3, target_update_every=100)),
                replay=ReplayConfig(
                    capacity_frames=50_000,
                    batch_size=64,
                    n_step=3,
                    gamma=0.99,
                    prioritized=True,
                    min_size=1000,
                    samples_per_insert=8.0,
                ),
                publish_every=10,
            )
        },
        actors=ActorConfig(workers=2, envs_per_worker=4, segment_length=16, groups=1),
        evaluation=EvaluationConfig(workers=1, envs_per_worker=5, episodes=10, max_fps=2000.0),
        stop=StopConfig(eval_return=475.0, env_frames=200_000),
    )


def pendulum_sac() -> ExperimentConfig:
    """SAC (twin Q, learned temperature, tanh-squashed Gaussian) on Pendulum-v1.

    The first 1000 actions are uniform (``warmup_frames``); 128 sampled transitions per inserted
    frame (``samples_per_insert=128`` with batches of 128: one trainer step a frame, as in the
    SAC paper).
    The issue's target: a greedy return above -250 within 20k environment steps. As separate
    processes on a shared 2-core machine (tests/algorithm/test_learning_replay_worker.py) it was
    met at 3,600 and 3,870 frames (two runs, 85 s and 114 s), about one trainer step a frame.
    A version is published every 10 trainer steps (``publish_every``): 110 -> 145 trainer steps
    a second on a quiet 2-core VM, solved in 30.8 s instead of 41.8 s (BENCHMARKS.md).
    """
    return ExperimentConfig(
        name="pendulum-sac",
        environment=ComponentConfig("Pendulum-v1"),
        policies={
            "default": PolicyConfig(
                policy=ComponentConfig(
                    "sac-policy", dict(hidden_sizes=[64, 64], warmup_frames=1000)
                ),
                trainer=ComponentConfig("sac", dict(actor_lr=3e-4, critic_lr=1e-3)),
                replay=ReplayConfig(
                    capacity_frames=50_000,
                    batch_size=128,
                    gamma=0.99,
                    min_size=1000,
                    samples_per_insert=128.0,
                ),
                publish_every=10,
            )
        },
        actors=ActorConfig(workers=1, envs_per_worker=1, segment_length=16, groups=1),
        evaluation=EvaluationConfig(workers=1, envs_per_worker=2, episodes=10, max_fps=1000.0),
        stop=StopConfig(eval_return=-250.0, env_frames=20_000),
    )
