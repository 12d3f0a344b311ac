"""The off-policy example experiments (DQN, SAC): actors -> replay worker -> trainer.

Their trainers declare ``needs_replay``, so the runtime starts a replay buffer worker per policy
(``PolicyConfig.replay``) between the actors and the trainer. Registered in ``legacy.plugin``.
"""

from __future__ import annotations

from api.config import (
    ActorConfig,
    CheckpointConfig,
    ComponentConfig,
    EvaluationConfig,
    ExperimentConfig,
    PolicyConfig,
    ReplayConfig,
    StopConfig,
)


def dqn_checkpoints() -> CheckpointConfig:
    """A numbered checkpoint every 1,000 versions, for the DQN recipes.

    A DQN trainer makes a version every step, hundreds a second, and a numbered checkpoint (the
    optimiser's state goes with it) is waited for. At PPO's cadence of 50, cartpole-dqn made
    4,674-4,789 frames/s, against 5,146-5,183 at 1,000 (9% more; alternating on a quiet 2-core
    VM). At 1,000, a resume loses a few seconds of training at most. SAC keeps 50:
    pendulum-sac was no faster at 1,000 (268.3 and 271.7 frames/s against 279.9 and 280.5 at
    50, alternating).
    """
    return CheckpointConfig(every=1000)


def cartpole_dqn() -> ExperimentConfig:
    """Double, dueling DQN with 3-step returns and prioritised replay on CartPole-v1.

    Exploration decays from 1.0 to 0.05 over the first 10k actions; the trainer may sample each
    inserted frame 8 times on average (``samples_per_insert``), so it neither overfits a small
    buffer while the actors are slow nor falls behind them. Stops at a greedy return of 475, or
    at 200k frames (CleanRL's DQN budget is 500k).

    The layout is sized for a small machine, where the CPU a frame decides the time to solve:
    - one actor of 32 environments, not two of 4: each request carries 32 rows, so the policy
      worker answers far fewer requests a frame, and one process fewer shares the cores;
    - evaluation on 10 environments at up to 4,000 frames/s: a window of 10 episodes of 500
      frames takes 1.25 s, so a good version is confirmed (two windows) seconds after it is
      made, not five or more;
    - a version published every 10 trainer steps, a numbered checkpoint every 1,000
      (:func:`dqn_checkpoints`);
    - four batches to a replay message (``batches_per_message``): one sample and one message
      serve four trainer steps. On a 2-core Xeon VM this made 5,036-5,329 frames/s (590-648
      updates/s) against 3,905-4,036 (481-502) with one, and solved seeds 7-10 in a median
      25.1 s against 27.7 s.
    On a quiet 2-core AMD VM, seeds 7-12, it solved in 8.5-29.9 s (median 23.8), against
    26.0-32.1 s (median 29.3) for the CleanRL-style ``dqn.py`` run alternately; on the Xeon VM,
    with four batches a message, seeds 7-10 took 24.1-29.5 s from command to exit (median 25.1)
    against 37.2-44.9 s (median 42.0) for ``dqn.py`` (BENCHMARKS.md).
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
                    batches_per_message=4,
                    n_step=3,
                    gamma=0.99,
                    prioritized=True,
                    min_size=1000,
                    samples_per_insert=8.0,
                ),
                publish_every=10,
            )
        },
        actors=ActorConfig(workers=1, envs_per_worker=32, segment_length=16, groups=1),
        evaluation=EvaluationConfig(workers=1, envs_per_worker=10, episodes=10, max_fps=4000.0),
        stop=StopConfig(eval_return=475.0, env_frames=200_000),
        checkpoint=dqn_checkpoints(),
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
