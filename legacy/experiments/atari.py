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
import inspect
import re
from typing import Any

import gymnasium as gym

from api.config import (
    ActorConfig,
    ComponentConfig,
    EvaluationConfig,
    ExperimentConfig,
    PolicyConfig,
    StopConfig,
    auto_actor_workers,
)
from api.errors import UserError
from legacy.environment.atari import AtariEnvironment
from legacy.environment.gym_adapter import add_ale_ids_to_gymnasium

AGENT_STEPS = 10_000_000
"""Length of a run in agent steps (40M emulator frames), as in the PPO paper's Atari runs."""
BATCH_SEGMENTS, SEGMENT_LENGTH = 4, 128
PONG_MAX = 21.0
"""The most a game of Pong returns (21-0): ``stop.max_return``, so that a greedy window of a
version that has already lost a game by too much ends then, and the next version is judged."""
WHOLE_GAMES = {"episodic_life": False, "clip_rewards": False}
"""What greedy evaluation plays (``evaluation.env_args``): whole games at their score. Training
plays lives with clipped rewards, whose returns are not a game's score but on Pong."""


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
    the environment and its inference) so that the trainer keeps the CPU; a version's window of
    8 games ends as soon as its mean can no longer reach 18 (a game returns 21 at most).
    """
    return ExperimentConfig(
        name="pong-ppo",
        environment=_atari_env("Pong"),
        policies={"default": _atari_ppo()},
        actors=ActorConfig(workers=1, envs_per_worker=8, segment_length=SEGMENT_LENGTH, groups=2),
        evaluation=EvaluationConfig(
            workers=1, envs_per_worker=2, episodes=8, max_fps=50.0, env_args=dict(WHOLE_GAMES)
        ),
        stop=StopConfig(eval_return=18.0, env_frames=AGENT_STEPS, max_return=PONG_MAX),
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
      takes minutes, not the quarter hour the 2-core recipe's paced one would;
    * its trainer then busy all the time again, at 0.22 s a step, launching some 150 kernels
      one by one a minibatch: each minibatch's gradient step replays as one CUDA graph
      (``trainer.args.cuda_graphs=True``), 0.096 s a step, and the trainer waits for samples
      two thirds of its time.

    On an H200 with 16 cores, as it ships (2026-12-04): 58k emulator frames/s with 13.6 cores
    busy, the actors the limit; a greedy 18 first 3 min 5 s into the run, stopped solved at
    4 min 6 s (6 min 15 s before the trainer's graphs). Falls back to the CPU without a GPU
    (then it is only a slower ``pong-ppo``)."""
    config = pong_ppo()
    base = config.policies["default"]
    trainer_args = dict(
        base.trainer.args,
        minibatches=GPU_MINIBATCHES,
        total_steps=AGENT_STEPS // (GPU_BATCH_SEGMENTS * SEGMENT_LENGTH),
        fused_adam=True,
        cuda_graphs=True,
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
        evaluation=EvaluationConfig(
            workers=1, envs_per_worker=8, episodes=8, max_fps=None, env_args=dict(WHOLE_GAMES)
        ),
    )


def breakout_ppo() -> ExperimentConfig:
    """PPO on Breakout for 10M agent steps.

    With episodic life and reward clipping, the returns shown are bricks hit per life (clipped
    rewards); the game's score is ``info["game_return"]`` at each game's end. No evaluation
    workers, so that the cores go to training; ``evaluation.workers=1`` (and a
    ``stop.eval_return``) judges greedy play by whole games' scores (``evaluation.env_args``).
    """
    return ExperimentConfig(
        name="breakout-ppo",
        environment=_atari_env("Breakout"),
        policies={"default": _atari_ppo()},
        actors=ActorConfig(workers=1, envs_per_worker=8, segment_length=SEGMENT_LENGTH, groups=2),
        evaluation=EvaluationConfig(workers=0, env_args=dict(WHOLE_GAMES)),
        stop=StopConfig(env_frames=AGENT_STEPS),
    )


ALE_ENTRY_POINT = "ale_py.env:AtariEnv"
"""The gymnasium entry point of every ALE id."""
PONG_TARGET = 18.0
"""Pong's greedy target, ``pong-ppo``'s: the one game whose episodes are whole games (no lives)
and whose rewards clipping leaves alone, so a return is its score."""


def atari_ppo(
    env: str = "ALE/Pong-v5",
    env_args: dict[str, Any] | None = None,
    target: float | None = None,
    frames: int | None = None,
) -> ExperimentConfig:
    """The Atari recipe for a gymnasium Atari id (``ALE/Breakout-v5``, ``PongNoFrameskip-v4``)
    or ``Atari-v0``: what ``troupe train`` runs for one, instead of a network over raw
    210x160 RGB frames.

    The game is the id's, played through ``Atari-v0`` (DeepMind preprocessing, see
    :mod:`legacy.environment.atari`) with the id's sticky actions (0.25 for ``-v5`` and ``-v0``
    ids, none for ``-v4`` ones); ``env_args`` are ``Atari-v0``'s and override. The layout is
    ``pong-ppo``'s on a machine without a GPU and ``pong-ppo-gpu``'s with one; ``frames`` agent
    steps (default 10M) set the run's length and the learning-rate schedule. The stop target
    is ``target``, a greedy game's score (evaluation plays whole games, unclipped:
    :data:`WHOLE_GAMES`), else 18 for Pong; other games are trained for their frames with no
    greedy evaluation (the cores go to training). The score of every game played in training
    is in the panel and the metrics all the same (``game``, ``game_return``)."""
    config = pong_ppo_gpu() if has_cuda() else pong_ppo()
    return for_game(config, "ppo", env, env_args, target, frames)


def for_game(
    config: ExperimentConfig,
    algo: str,
    env: str,
    env_args: dict[str, Any] | None,
    target: float | None,
    frames: int | None,
) -> ExperimentConfig:
    """An Atari recipe's ``config`` set to play ``env``'s game (:func:`atari_args`) for
    ``frames`` agent steps (default 10M), named ``<env>-<algo>``, with :func:`atari_ppo`'s stop
    rule: ``target``, else 18 for Pong, else no greedy evaluation. A trainer with a linear
    learning-rate schedule gets its ``total_steps`` from the frames."""
    args = atari_args(env, env_args or {})
    game = args["game"]
    frames = frames or AGENT_STEPS
    default = config.policies["default"]
    if "total_steps" in default.trainer.args:
        per_step = default.batch_segments * config.actors.segment_length
        default.trainer.args["total_steps"] = max(1, frames // per_step)
    if target is None and str(game).lower() == "pong":
        target, source = PONG_TARGET, "Troupe's Pong target (pong-ppo's)"
    elif target is None:
        source = f"none for {game}: give one with target= (a greedy game's score)"
        config.evaluation = EvaluationConfig(workers=0, env_args=dict(WHOLE_GAMES))
    else:
        source = "given: target="
    config.name = re.sub(r"[^a-z0-9_.-]+", "-", env.lower()).strip("-") + f"-{algo}"
    config.environment = ComponentConfig("Atari-v0", args)
    pong = str(game).lower() == "pong"
    config.stop = StopConfig(eval_return=target, env_frames=frames, eval_return_source=source,
                             max_return=PONG_MAX if pong else None)  # fmt: skip
    return config


ALE_KEYS = {
    "repeat_action_probability": "repeat_action_probability",
    "full_action_space": "full_action_space",
    "frameskip": "frame_skip",
    "max_num_frames_per_episode": "max_episode_frames",
}
"""Arguments of a gymnasium Atari id and the ``Atari-v0`` argument each is."""


def atari_args(env: str, env_args: dict[str, Any]) -> dict[str, Any]:
    """``Atari-v0``'s arguments for an Atari id and its ``env_args`` (the id's own, as
    :data:`ALE_KEYS` translates them, or ``Atari-v0``'s), or for ``Atari-v0``'s ``env_args``:
    the recipe's preprocessing, the id's game and sticky actions, then what was given."""
    if env == "Atari-v0":
        return dict(_atari_env(str(env_args.get("game", "Pong"))).args, **env_args)
    kwargs = gym.spec(env).kwargs
    game = "".join(part.capitalize() for part in str(kwargs["game"]).split("_"))
    args = dict(_atari_env(game).args, repeat_action_probability=float(
        kwargs.get("repeat_action_probability", 0.25)))  # fmt: skip
    own = set(inspect.signature(AtariEnvironment).parameters) - {"game"}
    for key, value in env_args.items():
        if key == "obs_type":
            continue  # the screen either way: the recipe makes it 84x84 grayscale
        if key not in ALE_KEYS and key not in own:
            raise UserError(
                f"{env}: the Atari recipe plays it through Atari-v0, which has no '{key}'; "
                f"it takes {sorted(ALE_KEYS)} of the id's arguments and its own {sorted(own)}"
            )
        args[ALE_KEYS.get(key, key)] = value
    return args


def is_atari_pixels(env: str, env_args: dict[str, Any] | None = None) -> bool:
    """Whether ``env`` is ``Atari-v0`` or a gymnasium Atari id that observes the screen (not
    its RAM, ``obs_type="ram"``: 128 bytes are a vector, which the spaces' own recipe suits)."""
    if (env_args or {}).get("obs_type") == "ram":
        return False
    if env == "Atari-v0":
        return True
    if not env.startswith("ALE/") and not re.fullmatch(r"[A-Za-z0-9]+-v[04]", env):
        return False  # no need to load ALE's ids to know
    add_ale_ids_to_gymnasium()
    try:
        spec = gym.spec(env)
    except Exception:  # not a gymnasium id (a Troupe environment, a PettingZoo name, a typo)
        return False
    return spec.entry_point == ALE_ENTRY_POINT and spec.kwargs.get("obs_type") != "ram"


def has_cuda() -> bool:
    """Whether torch sees a GPU: the Atari recipes take their GPU layout where it does."""
    import torch  # only for an Atari id: other experiments are set up without it

    return torch.cuda.is_available()
