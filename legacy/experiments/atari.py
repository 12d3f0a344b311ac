"""Atari experiments, ``pong-ppo``, ``pong-ppo-gpu`` and ``breakout-ppo`` (need ``pip install
'troupe-rl[atari]'``).

PPO with the numbers most Atari PPO baselines share (Schulman et al. 2017; CleanRL's
``ppo_atari``): 8 environments, 128-step segments, minibatches of 256 transitions, 4 epochs,
learning rate 2.5e-4 decaying linearly to zero over 10M agent steps, clip 0.1 (policy and value),
entropy 0.01, value weight 0.5, gradient norm 0.5, gamma 0.99, GAE lambda 0.95. One Nature-CNN
backbone feeds both heads (``shared_backbone=True``, no MLP after its 512 features).

``pong-ppo`` is sized for 2 CPU cores (``pong-ppo-gpu`` for one GPU and many cores, see its
docstring): one actor process with the 8 environments in 2 groups (one steps while
the other waits for actions), one policy worker, one trainer. On such a machine the trainer is
the bottleneck: a pass of the 1.7M-parameter CNN forward and back costs about 1.4 ms of one core
a frame on one thread, so throughput is a few hundred agent steps a second whatever the
actors could do; the trainer runs on 2 threads (``trainer_threads``), which the idle actors
leave it. A trainer step takes 512
transitions (4 segments; 2 minibatches of 256) instead of the usual 1024: the same minibatch
size and sample reuse, half as long a step (about 3 s alone on a core), so weights reach the
actors sooner. A trainer sends no heartbeat during a step, and the controller restarts a worker
silent for 30 s: on a 2-core machine shared with other heavy jobs (load average 11 measured)
even a 512-transition step went past that.

``env_frames`` in the run's metrics counts agent steps; each is ``frame_skip`` = 4 emulator
frames. The environment's arguments are spelled out so that ``troupe run pong-ppo
environment.args.repeat_action_probability=0.25`` (sticky actions) is one override away.
"""

from __future__ import annotations

import dataclasses

from api.config import (
    ActorConfig,
    ComponentConfig,
    EvaluationConfig,
    ExperimentConfig,
    PolicyConfig,
    StopConfig,
    auto_actor_workers,
)

AGENT_STEPS = 10_000_000
"""Length of a run in agent steps (40M emulator frames), as in the PPO paper's Atari runs."""
BATCH_SEGMENTS, SEGMENT_LENGTH = 4, 128


def _atari_env(game: str) -> ComponentConfig:
    return ComponentConfig(
        "Atari-v0",
        dict(
            game=game,
            frame_skip=4,
            noop_max=30,
            frame_stack=4,
            episodic_life=True,
            clip_rewards=True,
            repeat_action_probability=0.0,
        ),
    )


def _atari_ppo() -> PolicyConfig:
    trainer_steps = AGENT_STEPS // (BATCH_SEGMENTS * SEGMENT_LENGTH)
    return PolicyConfig(
        policy=ComponentConfig("actor-critic", dict(hidden_sizes=[], shared_backbone=True)),
        trainer=ComponentConfig(
            "ppo",
            dict(
                lr=2.5e-4,
                lr_schedule="linear",
                total_steps=trainer_steps,
                epochs=4,
                minibatches=2,
                gamma=0.99,
                gae_lambda=0.95,
                clip=0.1,
                value_clip=0.1,
                entropy_coef=0.01,
                value_coef=0.5,
                max_grad_norm=0.5,
            ),
        ),
        batch_segments=BATCH_SEGMENTS,
        # a CPU learner of this CNN gets 18% more frames with a second thread on 2 cores
        # (BENCHMARKS.md, issue 23); on a GPU its CPU work is small either way
        trainer_threads=2,
    )


def pong_ppo() -> ExperimentConfig:
    """PPO on Pong until greedy play scores 18 (of 21) on average, or 10M agent steps.

    Pong has no lives and rewards of -1/+1, so the returns shown are the game's score. Greedy
    evaluation runs 2 games at a time, held to 50 agent steps a second (about 5% of a core, for
    the environment and its inference) so that the trainer keeps the CPU.
    """
    return ExperimentConfig(
        name="pong-ppo",
        environment=_atari_env("Pong"),
        policies={"default": _atari_ppo()},
        actors=ActorConfig(workers=1, envs_per_worker=8, segment_length=SEGMENT_LENGTH, groups=2),
        evaluation=EvaluationConfig(workers=1, envs_per_worker=2, episodes=8, max_fps=50.0),
        stop=StopConfig(eval_return=18.0, env_frames=AGENT_STEPS),
    )


GPU_BATCH_SEGMENTS, GPU_MINIBATCHES, GPU_POLICY_WORKERS = 32, 8, 2


def pong_ppo_gpu() -> ExperimentConfig:
    """``pong-ppo`` laid out for one GPU and a machine of many cores (BENCHMARKS.md, issue 23).

    What the stage timings of ``pong-ppo`` showed on a 16-core H200 machine, and what changes:

    * its trainer, busy all the time on 512-transition steps, capped the run at about 30k
      emulator frames/s with 9 of 16 cores busy: a step takes 32 segments (4,096 transitions)
      in 8 minibatches of 512, so the GPU works on larger products (and the loader thread has a
      whole step to gather the next batch). That is half as many gradient steps for the frames
      collected as the 2-core recipe's minibatches of 256 take (32 instead of 64 per 4,096
      transitions over the 4 epochs), each on twice the transitions;
    * its one policy worker, then busy all the time forming batches and waiting on the GPU,
      became the next limit: two of them, acting through CUDA graphs (one launch a batch, 1.46
      cores for the two instead of 1.84, and 5% more frames);
    * the actors, as many as the cores the other roles leave (``actors.workers=auto``: 12 on
      16 cores), each with 16 environments in 2 groups, so that one group steps while the
      other's request is answered;
    * greedy evaluation at full speed, on 8 environments with one game each, so that a window
      takes minutes, not the quarter hour the 2-core recipe's paced one would.

    On an H200 with 16 cores it ran at 50k emulator frames/s with 14 cores busy, reached a
    greedy 18 five minutes after the command and stopped solved at 6 min 15 s. Falls back to
    the CPU without a GPU (then it is only a slower ``pong-ppo``)."""
    config = pong_ppo()
    base = config.policies["default"]
    trainer_args = dict(
        base.trainer.args,
        minibatches=GPU_MINIBATCHES,
        total_steps=AGENT_STEPS // (GPU_BATCH_SEGMENTS * SEGMENT_LENGTH),
        fused_adam=True,
    )
    policy = dataclasses.replace(
        base,
        policy=dataclasses.replace(
            base.policy, args=dict(base.policy.args, device="cuda", cuda_graphs=True)
        ),
        trainer=dataclasses.replace(base.trainer, args=trainer_args),
        batch_segments=GPU_BATCH_SEGMENTS,
        policy_workers=GPU_POLICY_WORKERS,
        trainer_threads=1,
    )
    layout = {
        "policies": {
            "default": {
                "policy_workers": GPU_POLICY_WORKERS,
                "trainer": {"type": "ppo"},
                "trainer_workers": 1,
            }
        }
    }
    return dataclasses.replace(
        config,
        name="pong-ppo-gpu",
        policies={"default": policy},
        actors=ActorConfig(
            workers=auto_actor_workers(layout),
            envs_per_worker=16,
            segment_length=SEGMENT_LENGTH,
            groups=2,
        ),
        evaluation=EvaluationConfig(workers=1, envs_per_worker=8, episodes=8, max_fps=None),
    )


def breakout_ppo() -> ExperimentConfig:
    """PPO on Breakout for 10M agent steps.

    With episodic life and reward clipping, the returns shown are bricks hit per life (clipped
    rewards); the game's score is ``info["game_return"]`` at each game's end. No evaluation
    workers: greedy evaluation on the same environment would report per-life returns too, and
    the cores go to training.
    """
    return ExperimentConfig(
        name="breakout-ppo",
        environment=_atari_env("Breakout"),
        policies={"default": _atari_ppo()},
        actors=ActorConfig(workers=1, envs_per_worker=8, segment_length=SEGMENT_LENGTH, groups=2),
        evaluation=EvaluationConfig(workers=0),
        stop=StopConfig(env_frames=AGENT_STEPS),
    )
