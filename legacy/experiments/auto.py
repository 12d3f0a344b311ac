"""``ppo``: PPO on any registered environment, set up from its spaces (``troupe train ENV``).

The policy is ``actor-critic``, whose encoder and action head follow the spaces: vectors go
through an MLP, uint8 images through a CNN, Dict observations key by key; Discrete,
MultiDiscrete and MultiBinary actions get Categoricals, Box actions a diagonal Gaussian. What
differs between the two families is the training recipe:

* discrete actions: the CartPole recipe (large batches, few minibatches, lr 2e-3), which solves
  CartPole-v1 and Acrobot-v1 in well under a minute of CPU;
* continuous actions: smaller batches, ten epochs of small minibatches, no entropy bonus, a
  linear learning-rate decay over the run's frame budget, and running normalisation of
  observations and returns (kept in the policy's checkpoint), as continuous-control PPO needs.

The stop rule is ``target`` when given, else the environment's target when gymnasium declares one
(``reward_threshold``), else Troupe's own for a well-known id that declares none
(:data:`DEFAULT_TARGETS`), and always ``frames`` environment steps at most. The config says which
(``stop.eval_return_source``), and ``troupe train`` prints it as the run starts.
"""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym

from algorithm.modules.encoders import ACTION_MASK_KEY
from api.config import (
    ActorConfig,
    CheckpointConfig,
    ComponentConfig,
    EvaluationConfig,
    ExperimentConfig,
    PolicyConfig,
    StopConfig,
)
from api.errors import UserError
from legacy.environment.pettingzoo_spaces import STATE_KEY
from legacy.experiments.agent_kinds import AgentKind, agent_kinds, declared, seats

DEFAULT_TARGETS: dict[str, float] = {
    "Pendulum-v1": -300.0,
}
"""Stop targets for well-known gymnasium ids that declare no ``reward_threshold``.

Pendulum-v1: an episode's return is about -1200 acting at random and about -150 for a pendulum
swung up and held from any start; -300 is swung up and held most of the episode, what a user
would call learned. Every other classic-control and Box2D id declares its own threshold
(gymnasium 1.x: CartPole, MountainCar, MountainCarContinuous, Acrobot, LunarLander,
BipedalWalker, CarRacing), and so does gymnasium wherever it has one: its own number wins."""


ACTOR_CRITIC_ACTIONS = (
    gym.spaces.Box,
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
)
"""The action spaces the actor-critic policy acts in (ppo, impala)."""


def ppo(
    env: str = "CartPole-v1",
    env_args: dict[str, Any] | None = None,
    target: float | None = None,
    frames: int | None = None,
) -> ExperimentConfig:
    """PPO on ``env`` (any registered environment or gymnasium id), set up from its spaces.

    ``target``: stop once greedy evaluation reaches it (default: gymnasium's
    ``reward_threshold``, else :data:`DEFAULT_TARGETS`); ``frames``: environment steps at most
    (default 1M discrete, 500k where an agent acts in a Box).

    Several agents with the same spaces share one policy; agents whose spaces differ get a
    policy per kind (:mod:`legacy.experiments.agent_kinds`), each with its action space's
    recipe. A two-seat board game with action masks (``pettingzoo:classic/tictactoe_v3``) is
    trained by self-play against its past instead (:func:`legacy.experiments.selfplay.selfplay`).
    """
    return ppo_experiment(env, env_args, target, frames)


def ppo_experiment(
    env: str,
    env_args: dict[str, Any] | None,
    target: float | None,
    frames: int | None,
    *,
    centralised_critic: bool = False,
) -> ExperimentConfig:
    """:func:`ppo`; with ``centralised_critic`` (``--algo mappo``), each policy's critic reads
    the whole observation, the game's global state included, and its actor only the agent's own
    part (``actor_keys``), in an experiment named ``<env>-mappo``."""
    from legacy.experiments.selfplay import is_board_game, selfplay

    env_args = dict(env_args or {})
    known = declared(env, env_args)  # one environment made: it may take minutes to make
    if is_board_game(*map(list, zip(*known.spaces, strict=True))) and not centralised_critic:
        return selfplay(env, env_args, target=target, frames=frames)  # against its past
    kinds = agent_kinds(env, env_args, known)
    for kind in kinds:
        if not isinstance(kind.action, ACTOR_CRITIC_ACTIONS):
            raise UserError(
                f"environment '{env}' has a {type(kind.action).__name__} action space"
                f"{kind.whose(kinds)}; the ppo experiment handles Discrete, MultiDiscrete, "
                "MultiBinary and Box actions" + _parts_said(kind.action)
            )
    continuous = any(isinstance(kind.action, gym.spaces.Box) for kind in kinds)
    frames = frames or (500_000 if continuous else 1_000_000)
    actors = _actors(continuous)
    policies = {kind.name: _ppo_policy(kind, actors, frames) for kind in kinds}
    if centralised_critic:
        for kind in kinds:
            policies[kind.name].policy.args["actor_keys"] = own_keys(kind.observation)
    algo = "mappo" if centralised_critic else "ppo"
    return named_experiment(env, env_args, algo, policies, actors, seats(kinds), target, frames)


def own_keys(observation: gym.Space) -> list[str]:
    """The keys of an observation with the game's state beside it that are the agent's own."""
    if not isinstance(observation, gym.spaces.Dict) or STATE_KEY not in observation.spaces:
        raise UserError(
            f"a centralised critic reads the game's global state, and this observation has "
            f"none ({observation}): make the game with global_state=True"
        )
    return [k for k in observation.spaces if k not in (STATE_KEY, ACTION_MASK_KEY)]


PER_STEP = 1024
"""Transitions a PPO trainer step takes, in both recipes: 16 segments of 64 discrete, 8 of 128
continuous (with continuous actors, a discrete kind's 1,024 are 8 segments of 128), times the
agents that share the policy (:data:`MAX_SHARED_BATCHES`)."""
MAX_SHARED_BATCHES = 8
"""A policy its kind's N agents share takes ``min(N, 8) * PER_STEP`` transitions a trainer step:
a step then covers as many environment steps as a one-agent task's, which the recipes were
tuned for. At 1,024 a step the three agents of MPE's ``simple_spread_v3`` had their trainer step
every 341 environment steps, their samples 6.8 versions old on average; their training return
was -21.9 after 270 s, and -15.1 at 3,072 a step (BENCHMARKS.md, one run each). Capped, so
that a game of dozens of agents does not make a trainer step of tens of thousands of
transitions."""


def _actors(continuous: bool) -> ActorConfig:
    """A fresh one each call: a config is changed in place (presets, overrides)."""
    if continuous:
        return ActorConfig(workers=2, envs_per_worker=4, segment_length=128)
    return ActorConfig(workers=2, envs_per_worker=16, segment_length=64, groups=1)


def _ppo_policy(kind: AgentKind, actors: ActorConfig, frames: int) -> PolicyConfig:
    """The recipe of the kind's action space: discrete actions the CartPole recipe (large
    batches, few minibatches, lr 2e-3), continuous ones ten epochs of small minibatches, no
    entropy bonus, a linear learning-rate decay over the run, and normalised observations and
    returns. The decay runs to the trainer step of the run's last frame: each of the kind's
    agents adds a transition a step (it ran out at 1/N of a run of N agents sharing a policy).
    A step takes ``PER_STEP`` transitions for each agent sharing the policy (up to 8)."""
    continuous = isinstance(kind.action, gym.spaces.Box)
    per_step = PER_STEP * min(len(kind.agents), MAX_SHARED_BATCHES)
    if continuous:
        total_steps = max(1, frames * len(kind.agents) // per_step)
        trainer = dict(lr=1e-3, epochs=10, minibatches=16, gamma=0.95, gae_lambda=0.95,
                       entropy_coef=0.0, clip=0.2, lr_schedule="linear",
                       total_steps=total_steps)  # fmt: skip
    else:
        trainer = dict(lr=2e-3, epochs=6, minibatches=2, gamma=0.99, gae_lambda=0.95,
                       entropy_coef=0.01, clip=0.2, max_grad_norm=0.5)  # fmt: skip
    policy_args: dict[str, Any] = dict(hidden_sizes=[64, 64], activation="tanh")
    if continuous:
        policy_args.update(normalize_obs=_is_vector(kind.observation), normalize_returns=True)
    return PolicyConfig(
        policy=ComponentConfig("actor-critic", policy_args),
        trainer=ComponentConfig("ppo", trainer),
        batch_segments=per_step // actors.segment_length,
    )


def default_target(env: str) -> float | None:
    """Gymnasium's ``reward_threshold`` for ``env``, else :data:`DEFAULT_TARGETS`'s, else None."""
    declared = _reward_threshold(env)
    return declared if declared is not None else DEFAULT_TARGETS.get(env)


def _parts_said(action: gym.Space) -> str:
    """Why a Dict or Tuple of actions is not flattened (a part of another kind), or what is."""
    from legacy.environment.flat_actions import flat_actions

    try:
        flat_actions(action)
    except ValueError as e:
        return f": {e}"
    return ", and Dicts or Tuples of discrete and Box parts as gymnasium's make them"


def target_source(env: str, target: float | None) -> str:
    """Where the stop target of :func:`ppo` on ``env`` comes from, in words."""
    if target is not None:
        return "given: target="
    if _reward_threshold(env) is not None:
        return f"gymnasium's reward_threshold for {env}"
    if env in DEFAULT_TARGETS:
        return f"Troupe's default for {env}, which declares no reward_threshold"
    if env in gym.registry:
        return f"none: gymnasium declares no reward_threshold for {env}; give one with target="
    return f"none: {env} is not a gymnasium id with a reward_threshold; give one with target="


def named_experiment(
    env: str,
    env_args: dict[str, Any] | None,
    algo: str,
    policy: PolicyConfig | dict[str, PolicyConfig],
    actors: ActorConfig,
    agents: int | list[str],
    target: float | None,
    frames: int,
    evaluation: EvaluationConfig | None = None,
    checkpoint: CheckpointConfig | None = None,
) -> ExperimentConfig:
    """The experiment that trains ``policy`` on ``env`` named ``<env>-<algo>``: several agents
    with the same spaces share it (``agents`` their number), or ``policy`` maps names to
    policies and ``agents`` is each agent's policy name (:func:`seats`); the stop rule is
    ``target`` (else the environment's, see :func:`default_target`) or ``frames``, evaluation
    windows of 20 greedy episodes unless ``evaluation`` says otherwise, and ``checkpoint``'s
    cadence (default: the config's)."""
    return ExperimentConfig(
        name=re.sub(r"[^a-z0-9_.-]+", "-", env.lower()).strip("-") + f"-{algo}",
        agent_policies=_agent_policies(agents),
        environment=ComponentConfig(env, dict(env_args or {})),
        policies=policy if isinstance(policy, dict) else {"default": policy},
        actors=actors,
        evaluation=evaluation
        or EvaluationConfig(workers=1, envs_per_worker=10, episodes=20, max_fps=5000.0),
        stop=StopConfig(
            eval_return=target if target is not None else default_target(env),
            env_frames=frames,
            eval_return_source=target_source(env, target),
        ),
        checkpoint=checkpoint or CheckpointConfig(),
    )


def _agent_policies(agents: int | list[str]) -> list[str]:
    seated = agents if isinstance(agents, list) else ["default"] * agents
    return seated if len(seated) > 1 else []


def _reward_threshold(env: str) -> float | None:
    try:
        threshold = gym.spec(env).reward_threshold
    except gym.error.Error:  # not a gymnasium id: a user's own environment
        return None
    return None if threshold is None else float(threshold)


def _is_vector(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 1
