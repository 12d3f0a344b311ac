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
    _register_policy_mappings()
    _register_experiments()


def _register_environments() -> None:
    from legacy.environment.gym_adapter import late_gymnasium_id, register_gymnasium_ids

    register_gymnasium_ids()
    registry.environments.add_late_names(late_gymnasium_id)
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
        "Atari-v0",
        "legacy.environment.atari:AtariEnvironment",
        description="Atari (pip install 'troupe-rl[atari]'), DeepMind preprocessing; game='Pong'.",
    )
    registry.register_environment(
        "Synthetic-v0",
        "legacy.environment.synthetic:SyntheticEnvironment",
        description="Benchmark environment: each step burns a set CPU time (step_cost_us).",
    )
    registry.register_environment(
        "StagedCartPole-v0",
        "legacy.environment.staged_cartpole:StagedCartPole",
        description="CartPole with curriculum stages: longer episodes, shorter pole per stage.",
    )
    _register_pettingzoo()


def _register_pettingzoo() -> None:
    """PettingZoo games through the adapter (building one needs the 'multiagent' extra): three
    by name, and any by its module path as ``pettingzoo:<family>/<game>``."""
    from legacy.environment.pettingzoo_ids import PREFIX, spec_of_id

    registry.environments.add_family(PREFIX, spec_of_id)
    module = "legacy.environment.pettingzoo_adapter"
    for name, api, env, description in (
        (
            "ConnectFour-v3",
            "AEC",
            "classic.connect_four.connect_four:env",
            "connect four, action masks",
        ),
        ("TicTacToe-v3", "AEC", "classic.tictactoe.tictactoe:env", "tic-tac-toe, action masks"),
        (
            "KnightsArchersZombies-v11",
            "Parallel",
            "butterfly.knights_archers_zombies.knights_archers_zombies:parallel_env",
            "4 agents acting at once, vector observations; agents die mid-episode",
        ),
    ):
        registry.register_environment(
            name,
            f"{module}:PettingZoo{api}Environment",
            env=f"pettingzoo.{env}",
            description=f"PettingZoo {description} (pip install 'troupe-rl[multiagent]').",
        )


def _register_policies() -> None:
    registry.register_policy(
        "actor-critic",
        "algorithm.actor_critic_policies.policy:ActorCriticPolicy",
        description="Actor-critic, Discrete/MultiDiscrete/Box actions (ppo, impala); optional GRU.",
    )
    registry.register_policy(
        "random-legal",
        "algorithm.scripted_policies:RandomLegalPolicy",
        description="Scripted: uniform over the legal actions (the action_mask); no trainer.",
    )
    registry.register_policy(
        "connect-four-heuristic",
        "algorithm.scripted_policies:ConnectFourHeuristicPolicy",
        description="Scripted connect four: win, else block, else centre columns; no trainer.",
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
        description="PPO (actor-critic, any action space): GAE or V-trace, clipping, epochs.",
    )
    registry.register_trainer(
        "impala",
        "algorithm.impala.trainer:ImpalaTrainer",
        description="IMPALA (actor-critic, any action space): V-trace corrects stale samples.",
    )
    registry.register_trainer(
        "dqn",
        "algorithm.dqn.trainer:DQNTrainer",
        description="DQN (q-network, Discrete actions) on a replay worker: double, n-step.",
    )
    registry.register_trainer(
        "sac",
        "algorithm.sac.trainer:SACTrainer",
        description="SAC (sac-policy, Box actions) on a replay worker: twin Q, learned alpha.",
    )


def _register_policy_mappings() -> None:
    for name, attr, description in (
        ("fixed-seats", "fixed_seats", "Seat i is always policies[i]."),
        ("rotate-seats", "rotate_seats", "Policies move one seat on per episode."),
        ("self-play", "self_play", "Learner in a rotating seat; opponents drawn by weight."),
    ):
        registry.register_policy_mapping(
            name, f"algorithm.policy_mappings:{attr}", description=description
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
    for name, attr, description in (
        ("cartpole-dqn", "cartpole_dqn", "Double dueling DQN with a replay worker, CartPole-v1."),
        ("pendulum-sac", "pendulum_sac", "SAC with a replay worker on Pendulum-v1."),
    ):
        registry.register_experiment(
            name, f"legacy.experiments.off_policy:{attr}", description=description
        )
    for name, attr, description in (
        ("pong-ppo", "pong_ppo", "PPO, Nature CNN on Atari Pong (needs the atari extra)."),
        ("pong-ppo-gpu", "pong_ppo_gpu", "pong-ppo for one GPU and many cores (atari extra)."),
        ("breakout-ppo", "breakout_ppo", "PPO, Nature CNN on Atari Breakout (atari extra)."),
    ):
        registry.register_experiment(
            name, f"legacy.experiments.atari:{attr}", description=description
        )
    registry.register_experiment(
        "ppo",
        "legacy.experiments.by_algo:ppo",
        description="PPO on any environment (env=NAME), set up from its spaces: troupe train ENV.",
    )
    for name, what in (
        ("impala", "IMPALA"),
        ("dqn", "DQN, with a replay worker,"),
        ("sac", "SAC, with a replay worker,"),
        ("mappo", "PPO with a centralised critic (a PettingZoo game with a global state)"),
    ):
        registry.register_experiment(
            name,
            f"legacy.experiments.by_algo:{name}",
            description=f"{what} on any environment (env=NAME): troupe train ENV --algo {name}.",
        )
    registry.register_experiment(
        "mountaincar-dqn",
        "legacy.experiments.by_algo:mountaincar_dqn",
        description="DQN tuned for MountainCar-v0: what troupe train MountainCar-v0 runs.",
    )
    registry.register_experiment(
        "mountaincar-continuous-sac",
        "legacy.experiments.by_algo:mountaincar_continuous_sac",
        description="SAC for MountainCarContinuous-v0: what troupe train runs on it.",
    )
    for name, what in (("mujoco-ppo", "PPO"), ("mujoco-sac", "SAC")):
        registry.register_experiment(
            name,
            f"legacy.experiments.mujoco:{name.replace('-', '_')}",
            description=f"{what} with CleanRL's MuJoCo recipe (env=Hopper-v5; mujoco extra).",
        )
    registry.register_experiment(
        "auto",
        "legacy.experiments.by_algo:auto",
        description="troupe train ENV: the preset tuned for ENV where there is one, else ppo.",
    )
    for name, attr, description in (
        ("cartpole-curriculum", "cartpole_curriculum", "PPO on StagedCartPole-v0's 3 stages."),
        ("cartpole-pbt", "cartpole_pbt", "Population-based training: 4 PPO members, CartPole."),
    ):
        registry.register_experiment(
            name, f"legacy.experiments.league:{attr}", description=description
        )
    registry.register_experiment(
        "connect4-selfplay",
        "legacy.experiments.selfplay:connect4_selfplay",
        description="PPO self-play on connect four against a pool of past versions (multiagent).",
    )
    registry.register_experiment(
        "synthetic-ppo",
        "legacy.experiments.synthetic:synthetic_ppo",
        description="Benchmark: PPO on Synthetic-v0 at 1 ms CPU per step; stops at 100k frames.",
    )
