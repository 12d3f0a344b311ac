"""The benchmark experiment on ``Synthetic-v0``, registered as ``synthetic-ppo``.

Its purpose is measurement, not learning: ``troupe bench`` runs it with the environment's step
cost set by override (``environment.args.step_cost_us=1000``) and reads frames/s from the run's
metrics, so throughput is measured while the trainer really trains. It stops on frames, and has no
evaluation workers, so every core left over goes to the training actors.
"""

from __future__ import annotations

from api.config import (
    ActorConfig,
    ComponentConfig,
    EvaluationConfig,
    ExperimentConfig,
    PolicyConfig,
    StopConfig,
)


def synthetic_ppo() -> ExperimentConfig:
    """PPO (2x64 MLP, as cartpole-ppo) on Synthetic-v0 at 1 ms of CPU per step, 64 floats in."""
    return ExperimentConfig(
        name="synthetic-ppo",
        environment=ComponentConfig(
            "Synthetic-v0", dict(step_cost_us=1000.0, obs_size=64, n_actions=4)
        ),
        policies={
            "default": PolicyConfig(
                policy=ComponentConfig(
                    "actor-critic", dict(hidden_sizes=[64, 64], activation="tanh")
                ),
                trainer=ComponentConfig("ppo", dict(lr=1e-3, epochs=4, minibatches=2)),
                batch_segments=16,
            )
        },
        # 2 groups of 16: an actor steps one while the other waits for its actions.
        actors=ActorConfig(workers=2, envs_per_worker=32, segment_length=64, groups=2),
        evaluation=EvaluationConfig(workers=0),
        stop=StopConfig(env_frames=100_000),
    )
