"""``mujoco-ppo`` and ``mujoco-sac``: the recipes the field publishes MuJoCo results with.

Hopper, HalfCheetah, Walker2d, Ant and the other MuJoCo tasks of gymnasium (the ``mujoco``
extra) are where continuous-control results are compared, and every published figure comes
from one recipe per algorithm. These are CleanRL's (``ppo_continuous_action.py`` and
``sac_continuous_action.py``, both after openai/baselines and spinning-up), so that a Troupe
return can be read beside theirs (BENCHMARKS.md):

* PPO: 2,048 transitions a trainer step, 10 epochs of 32 minibatches (64 transitions each),
  Adam at 3e-4 decayed linearly to zero over the frame budget, gamma 0.99, GAE lambda 0.95,
  ratio and value clipped at 0.2, no entropy bonus, gradient norm 0.5; separate 64x64 tanh
  networks for the actor and the critic, a state-independent log-std; running normalisation
  of observations and of returns. Troupe's ``ppo`` default for continuous actions is tuned
  for Pendulum (gamma 0.95, lr 1e-3, 1,024 a step) and falls short on locomotion.
* SAC: twin 256x256 ReLU critics and actor, batches of 256, one update a frame (256 sampled
  transitions per inserted one), critic lr 1e-3, actor lr 3e-4, a learned temperature
  targeting ``-action_dim`` entropy, Polyak 0.005, 5,000 uniform warm-up actions, a replay
  buffer holding the whole budget.

``troupe train Hopper-v5`` (and ``--algo ppo``) runs ``mujoco-ppo`` on any MuJoCo id,
``--algo sac`` runs ``mujoco-sac``: :func:`legacy.environment.gym_adapter.is_mujoco` tells
them apart by gymnasium's entry point. The stop rule is gymnasium's ``reward_threshold`` where
the task declares one (Hopper 3,800, HalfCheetah 4,800), met by greedy windows, else the frame
budget (1M by default, the budget of the published figures).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from api.config import (
    ActorConfig,
    ComponentConfig,
    EvaluationConfig,
    ExperimentConfig,
    PolicyConfig,
    ReplayConfig,
)
from api.errors import UserError
from legacy.experiments.agent_kinds import agent_spaces
from legacy.experiments.auto import named_experiment

MUJOCO_FRAMES = 1_000_000
"""The frame budget of the published MuJoCo figures (CleanRL's, SB3's zoo, the SAC paper's)."""

EVALUATION = EvaluationConfig(workers=1, envs_per_worker=10, episodes=10, max_fps=1000.0)
"""Windows of 10 greedy episodes of up to 1,000 steps, one per environment (unbiased); capped
at 1,000 frames a second so that evaluation takes a small share of the cores."""

PPO_BATCH = 2048
SAC_LEARNING_STARTS = 5000
"""CleanRL's ``learning_starts``: random actions, and no update, until the buffer holds this."""
"""Transitions a PPO trainer step: CleanRL's ``num_envs * num_steps`` (1 x 2,048)."""


def mujoco_ppo(
    env: str = "Hopper-v5",
    env_args: dict[str, Any] | None = None,
    target: float | None = None,
    frames: int | None = None,
) -> ExperimentConfig:
    """PPO on a MuJoCo task with CleanRL's ``ppo_continuous_action`` recipe (module docstring).

    Four environments (two actor processes of two) fill a step's 2,048 transitions with
    segments of 256: the same batch as CleanRL's one environment, drawn from four episodes at a
    time, which keeps both cores busy while the trainer runs its epochs.
    """
    agents = _continuous_vector_task(env, env_args, "mujoco-ppo")
    frames = frames or MUJOCO_FRAMES
    actors = ActorConfig(workers=2, envs_per_worker=2, segment_length=256, groups=1)
    batch_segments = PPO_BATCH // actors.segment_length
    trainer = dict(
        lr=3e-4, lr_schedule="linear", total_steps=max(1, frames // PPO_BATCH),
        epochs=10, minibatches=PPO_BATCH // 64, gamma=0.99, gae_lambda=0.95, clip=0.2,
        value_clip=0.2, entropy_coef=0.0, value_coef=0.5, max_grad_norm=0.5, adam_eps=1e-5,
    )  # fmt: skip
    network = dict(hidden_sizes=[64, 64], activation="tanh")
    network.update(normalize_obs=True, normalize_returns=True)
    policy = PolicyConfig(
        policy=ComponentConfig("actor-critic", network),
        trainer=ComponentConfig("ppo", trainer),
        batch_segments=batch_segments,
    )
    return named_experiment(
        env, env_args, "ppo", policy, actors, agents, target, frames, EVALUATION
    )


def mujoco_sac(
    env: str = "HalfCheetah-v5",
    env_args: dict[str, Any] | None = None,
    target: float | None = None,
    frames: int | None = None,
) -> ExperimentConfig:
    """SAC on a MuJoCo task with CleanRL's ``sac_continuous_action`` recipe (module docstring).

    One environment feeds the replay worker, as in CleanRL, so that the ratio of updates to
    frames is theirs (one batch of 256 per frame); a version is published every 10 trainer
    steps, as in ``pendulum-sac``.
    """
    agents = _continuous_vector_task(env, env_args, "mujoco-sac")
    frames = frames or MUJOCO_FRAMES
    policy = PolicyConfig(
        policy=ComponentConfig(
            "sac-policy",
            dict(hidden_sizes=[256, 256], activation="relu", warmup_frames=SAC_LEARNING_STARTS),
        ),
        trainer=ComponentConfig(
            "sac", dict(actor_lr=3e-4, critic_lr=1e-3, alpha_lr=1e-3, tau=0.005)
        ),
        replay=ReplayConfig(
            # room for the first batch's frames even where frames= is below them: the budget's
            # check then says the run would train nothing, not that the buffer is too small
            capacity_frames=max(frames, 2 * SAC_LEARNING_STARTS),
            batch_size=256,
            gamma=0.99,
            min_size=SAC_LEARNING_STARTS,
            samples_per_insert=256.0,
        ),
        publish_every=10,
    )
    actors = ActorConfig(workers=1, envs_per_worker=1, segment_length=16, groups=1)
    return named_experiment(
        env, env_args, "sac", policy, actors, agents, target, frames, EVALUATION
    )


def _continuous_vector_task(env: str, env_args: dict[str, Any] | None, experiment: str) -> int:
    """The number of agents of ``env``, once its spaces are checked to be what the recipes
    take: Box actions, vector observations."""
    observation, action, agents = agent_spaces(env, env_args)
    if not isinstance(action, gym.spaces.Box):
        raise UserError(
            f"environment '{env}' has {type(action).__name__} actions; {experiment} is a "
            "continuous-control recipe (Box actions): use troupe train ENV --algo ppo or dqn"
        )
    if not (isinstance(observation, gym.spaces.Box) and len(observation.shape) == 1):
        raise UserError(
            f"environment '{env}' observes {observation}; {experiment} takes vector "
            "observations (a 1-dimensional Box) as MuJoCo's state-based tasks give"
        )
    return agents
