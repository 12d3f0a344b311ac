"""Example experiments of run-wide coordination: a curriculum, and population-based training."""

from __future__ import annotations

from api.config import (
    ActorConfig,
    ComponentConfig,
    EvaluationConfig,
    ExperimentConfig,
    PolicyConfig,
    StopConfig,
)
from api.config.league import CurriculumConfig, PBTConfig

_NETWORK = dict(hidden_sizes=[64, 64], shared_backbone=False, activation="tanh")
_PPO = dict(epochs=6, minibatches=2, gamma=0.99, gae_lambda=0.95, clip=0.2, max_grad_norm=0.5)


def cartpole_curriculum() -> ExperimentConfig:
    """PPO on StagedCartPole-v0: episodes of 100, then 200, then 500 steps with a shorter pole.

    The run moves on when the mean training return of the last 100 episodes (``episode_return``)
    reaches 90, then 180, with at least 100 episodes played in each stage, so the mean that
    decides is the new stage's. The stage is ``curriculum/stage`` in metrics.jsonl and, as each
    environment saw it, ``episode_info/curriculum_stage``. It stops at a greedy return of 475,
    which only the last stage allows.
    """
    return ExperimentConfig(
        name="cartpole-curriculum",
        environment=ComponentConfig("StagedCartPole-v0"),
        policies={
            "default": PolicyConfig(
                policy=ComponentConfig("actor-critic", dict(_NETWORK)),
                trainer=ComponentConfig("ppo", dict(_PPO, lr=2e-3, entropy_coef=0.01)),
                batch_segments=16,
            )
        },
        actors=ActorConfig(workers=2, envs_per_worker=16, segment_length=64, groups=1),
        evaluation=EvaluationConfig(workers=1, envs_per_worker=5, episodes=10, max_fps=3000.0),
        curriculum=CurriculumConfig(
            metric="episode_return", thresholds=[90.0, 180.0], min_episodes=100
        ),
        stop=StopConfig(eval_return=475.0, env_frames=600_000),
    )


def cartpole_pbt() -> ExperimentConfig:
    """Population-based training of 4 PPO members on CartPole-v1.

    Each member has its own trainer, policy worker, actor and evaluation actor, and starts from
    its own learning rate and entropy bonus (one of them far too low a rate to learn fast). Every
    10 trainer steps of a member, it is ranked by its last 8 greedy evaluation episodes; the
    worst copies the best (weights through the parameter service) and perturbs the copied
    hyper-parameters by x0.8 or x1.25. ``pbt.jsonl`` and ``pbt.png`` in the run folder hold the
    population's history. Stops when the best member scores 475.
    """
    starts = [(3e-5, 0.001), (3e-4, 0.02), (1e-3, 0.005), (3e-3, 0.01)]
    return ExperimentConfig(
        name="cartpole-pbt",
        environment=ComponentConfig("CartPole-v1"),
        policies={
            f"member{i}": PolicyConfig(
                policy=ComponentConfig("actor-critic", dict(_NETWORK)),
                trainer=ComponentConfig("ppo", dict(_PPO, lr=lr, entropy_coef=entropy)),
                batch_segments=8,
            )
            for i, (lr, entropy) in enumerate(starts)
        },
        actors=ActorConfig(workers=4, envs_per_worker=16, segment_length=64, groups=1),
        evaluation=EvaluationConfig(workers=4, envs_per_worker=4, episodes=8, max_fps=1500.0),
        pbt=PBTConfig(
            members=[f"member{i}" for i in range(len(starts))],
            interval_steps=10,
            eval_episodes=8,
            hyperparameters={"lr": [1e-5, 1e-2], "entropy_coef": [0.0, 0.05]},
            target_return=475.0,
        ),
        stop=StopConfig(env_frames=3_000_000, wall_seconds=1200.0),
    )
