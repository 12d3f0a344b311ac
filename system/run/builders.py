"""Build a run's components from its configuration, by registered name.

The runtime never imports a concrete environment, policy or trainer: it asks the registry, so the
same code builds whatever the experiment names, in any process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym

from api import environment as env_api
from api import policy as policy_api
from api import trainer as trainer_api
from api.config import ExperimentConfig
from api.environment import Environment
from api.errors import ConfigError
from api.policy import Policy
from api.trainer import Trainer


@dataclass
class AgentSpaces:
    observation: list[gym.Space]
    action: list[gym.Space]

    @property
    def agent_count(self) -> int:
        return len(self.observation)


def env_factory(config: ExperimentConfig) -> Callable[[int], Environment]:
    comp = config.environment

    def make(_index: int) -> Environment:
        return env_api.make(comp.type, **comp.args)

    return make


def probe_spaces(config: ExperimentConfig) -> AgentSpaces:
    """Build one environment to read its agents' spaces, and check the agent-policy mapping."""
    env = env_factory(config)(0)
    try:
        spaces = AgentSpaces(list(env.observation_spaces), list(env.action_spaces))
    finally:
        env.close()
    if config.agent_policies and len(config.agent_policies) != spaces.agent_count:
        raise ConfigError(
            [
                f"agent_policies: lists {len(config.agent_policies)} policies but environment "
                f"'{config.environment.type}' has {spaces.agent_count} agents"
            ]
        )
    return spaces


def make_policy(config: ExperimentConfig, name: str, spaces: AgentSpaces, seed: int) -> Policy:
    """Build policy ``name`` for the spaces of the first agent it controls."""
    import torch  # not at module level: actor processes never need it

    agent = next(a for a in range(spaces.agent_count) if config.policy_of_agent(a) == name)
    torch.manual_seed(seed)
    comp = config.policies[name].policy
    return policy_api.make(
        comp.type,
        observation_space=spaces.observation[agent],
        action_space=spaces.action[agent],
        **comp.args,
    )


def make_trainer(config: ExperimentConfig, name: str, policy: Policy) -> Trainer:
    comp = config.policies[name].trainer
    return trainer_api.make(comp.type, policy=policy, **comp.args)


def trained_policies(config: ExperimentConfig) -> list[str]:
    return [name for name, pc in config.policies.items() if pc.trainer.type]
