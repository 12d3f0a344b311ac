"""IMPALA and DQN on an Atari game: what ``troupe train ALE/Pong-v5 --algo impala|dqn`` runs.

Both play the game as :func:`legacy.experiments.atari.atari_ppo` does: through ``Atari-v0``
(DeepMind preprocessing, 84x84 grayscale, 4 frames stacked, episodic life, clipped rewards) with
the id's sticky actions, into the Nature CNN, with its stop rule (greedy 18 on Pong, ``target=``
otherwise) and a default of 10M agent steps. Without them, ``--algo impala|dqn`` set the network
up from the raw 210x160 RGB screen with CartPole's numbers.

* :func:`atari_impala`: the IMPALA paper's Atari settings (Espeholt et al. 2018, its table of
  Atari hyperparameters) in Troupe's knobs: segments of 20 steps (its unroll length), 32 to a
  trainer step (its batch), one gradient step each, learning rate 6e-4 decaying linearly to
  zero, entropy 0.01, value weight 0.5, gradient norm 40, discount 0.99. The paper's RMSProp is
  Adam here (Troupe's actor-critic trainers have only Adam). The layout is ``pong-ppo``'s, or
  ``pong-ppo-gpu``'s where torch sees a GPU.
* :func:`atari_dqn`: the RL Baselines3 Zoo's DQN for Atari (``hyperparams/dqn.yml``): a replay
  buffer of 100k frames, learning from 100k, batches of 32, one update every 4 frames
  (``samples_per_insert`` 8), the target copied every 1,000 frames (250 updates), learning rate
  1e-4, epsilon from 1 to 0.01 over the first 10% of the frames, one-step targets, uniform
  replay, gradient norm 10, no double or dueling networks (the Zoo's DQN has neither).

Neither recipe's learning has been shown on an Atari game in Troupe: on the 2-core machines
these were written on, one game takes hours. What is tested is that each builds, plays real
frames and trains (``tests/legacy/test_atari.py``). On 2 CPU cores ``troupe train ALE/Pong-v5
--algo impala`` stepped 320-430 agent steps a second, its policy worker the busiest role; with
``--algo dqn`` each update of the CNN took 0.12-0.17 s, so the limit of 8 sampled transitions a
frame held the actors to 24-46 frames a second: DQN on Atari wants a GPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from api.config import ComponentConfig, ExperimentConfig, PolicyConfig, ReplayConfig
from legacy.experiments.atari import AGENT_STEPS, for_game, has_cuda, pong_ppo, pong_ppo_gpu
from legacy.experiments.off_policy import dqn_checkpoints

IMPALA_UNROLL, IMPALA_BATCH = 20, 32
"""The IMPALA paper's unroll length and batch (segments a learner step) on Atari."""


def atari_impala(
    env: str = "ALE/Pong-v5",
    env_args: dict[str, Any] | None = None,
    target: float | None = None,
    frames: int | None = None,
) -> ExperimentConfig:
    """IMPALA on an Atari id or ``Atari-v0`` (see the module docstring): the Atari PPO recipe's
    environment, network and layout with V-trace and the IMPALA paper's numbers."""
    config = pong_ppo_gpu() if has_cuda() else pong_ppo()
    base = config.policies["default"]
    trainer = ComponentConfig(
        "impala",
        dict(
            lr=6e-4,
            lr_schedule="linear",
            total_steps=AGENT_STEPS // (IMPALA_UNROLL * IMPALA_BATCH),
            gamma=0.99,
            entropy_coef=0.01,
            value_coef=0.5,
            max_grad_norm=40.0,
            minibatches=1,
            fused_adam=bool(base.trainer.args.get("fused_adam", False)),
        ),
    )
    config.policies["default"] = dataclasses.replace(
        base, trainer=trainer, batch_segments=IMPALA_BATCH
    )
    config.actors.segment_length = IMPALA_UNROLL
    return for_game(config, "impala", env, env_args, target, frames)


DQN_BUFFER_FRAMES = 100_000
"""The Zoo's Atari replay buffer: 100k stacked 84x84 frames, 2.8 GB as Troupe keeps them (each
observation once, its 4 planes together)."""


def atari_dqn(
    env: str = "ALE/Pong-v5",
    env_args: dict[str, Any] | None = None,
    target: float | None = None,
    frames: int | None = None,
) -> ExperimentConfig:
    """DQN on an Atari id or ``Atari-v0`` (see the module docstring).

    The buffer is not saved while the run goes on (``replay.save_every_s=None``): each save
    would rewrite its 2.8 GB, holding up the replay worker meanwhile. It is saved when the run
    stops, so a resume starts from it; a replay worker restarted after a crash starts empty and
    waits for 100k frames again. The policy acts on the GPU where torch sees one."""
    frames = frames or AGENT_STEPS
    config = pong_ppo()
    device = "cuda" if has_cuda() else "cpu"
    config.policies["default"] = PolicyConfig(
        policy=ComponentConfig(
            "q-network",
            dict(
                hidden_sizes=[],  # the Nature CNN ends in its 512 features, as Nature DQN
                dueling=False,
                epsilon=dict(start=1.0, end=0.01, decay_frames=max(1_000, frames // 10)),
                device=device,
            ),
        ),
        trainer=ComponentConfig(
            "dqn", dict(lr=1e-4, double=False, target_update_every=250, max_grad_norm=10.0)
        ),
        replay=ReplayConfig(
            capacity_frames=DQN_BUFFER_FRAMES,
            batch_size=32,
            batches_per_message=4,
            n_step=1,
            gamma=0.99,
            prioritized=False,
            min_size=DQN_BUFFER_FRAMES,
            samples_per_insert=8.0,
            save_every_s=None,
        ),
        # versions are 6.7 MB of weights: one a trainer step would be hundreds a second
        publish_every=50,
        trainer_threads=1 if device == "cuda" else 2,  # as pong-ppo's CPU learner of this CNN
    )
    config.actors.segment_length = 32
    config.checkpoint = dqn_checkpoints()
    return for_game(config, "dqn", env, env_args, target, frames)
