"""The built-in plugin: registers Troupe's own components, as any third-party plugin would.

``pyproject.toml`` names :func:`register_builtins` under the ``troupe.plugins`` entry-point group;
the registry calls it on the first lookup in every process. Every registration is a lazy
``module:Attribute`` string, so nothing heavy (torch, gymnasium's environments) is imported here.
"""

from __future__ import annotations

from api import registry


def register_builtins() -> None:
    _register_environments()
    _register_policies()
    _register_trainers()
    _register_experiments()


def _register_environments() -> None:
    from legacy.environment.gym_adapter import register_gymnasium_ids

    register_gymnasium_ids()
    registry.register_environment(
        "GridGather-v0",
        "legacy.environment.grid_gather:GridGatherEnvironment",
        description="Built-in multi-agent grid: agents gather coins in turns; dict observations.",
    )
    registry.register_environment(
        "MemoryCue-v0",
        "legacy.environment.memory_cue:MemoryCueEnvironment",
        description="Memory task: a cue shown at the start decides the right action at the end.",
    )
    registry.register_environment(
        "Synthetic-v0",
        "legacy.environment.synthetic:SyntheticEnvironment",
        description="Benchmark environment: each step burns a set CPU time (step_cost_us).",
    )


def _register_policies() -> None:
    registry.register_policy(
        "actor-critic",
        "algorithm.actor_critic_policies.policy:ActorCriticPolicy",
        description="Actor-critic policy: separate or shared backbone, optional GRU memory.",
    )
    registry.register_policy(
        "q-network",
        "algorithm.q_policies.policy:QPolicy",
        description="Q-network for Discrete actions: optional dueling head, epsilon-greedy.",
    )
    registry.register_policy(
        "sac-policy",
        "algorithm.sac.policy:SACPolicy",
        description="SAC for Box actions: tanh-squashed Gaussian actor, twin Q critics.",
    )


def _register_trainers() -> None:
    registry.register_trainer(
        "ppo",
        "algorithm.ppo.trainer:PPOTrainer",
        description="Proximal Policy Optimization with GAE (or V-trace), clipping and epochs.",
    )
    registry.register_trainer(
        "impala",
        "algorithm.impala.trainer:ImpalaTrainer",
        description="IMPALA: actor-critic with V-trace correction for stale actor samples.",
    )
    registry.register_trainer(
        "dqn",
        "algorithm.dqn.trainer:DQNTrainer",
        description="DQN on replayed transitions: double, n-step, target network, Huber loss.",
    )
    registry.register_trainer(
        "sac",
        "algorithm.sac.trainer:SACTrainer",
        description="Soft actor-critic on replayed transitions: twin Q, learned temperature.",
    )


def _register_experiments() -> None:
    for name, attr, description in (
        ("cartpole-ppo", "cartpole_ppo", "PPO on CartPole-v1, stops at greedy return 475."),
        ("pendulum-ppo", "pendulum_ppo", "PPO with Gaussian actions on Pendulum-v1."),
        ("memory-gru-ppo", "memory_gru_ppo", "PPO with a GRU policy on the MemoryCue-v0 task."),
        ("gather-2p-ppo", "gather_two_policies", "Two PPO policies on GridGather-v0 agents."),
        ("cartpole-impala", "cartpole_impala", "IMPALA on CartPole-v1 with 4 actor workers."),
    ):
        registry.register_experiment(
            name, f"legacy.experiments.examples:{attr}", description=description
        )
    registry.register_experiment(
        "synthetic-ppo",
        "legacy.experiments.synthetic:synthetic_ppo",
        description="Benchmark: PPO on Synthetic-v0 at 1 ms CPU per step; stops at 100k frames.",
    )
