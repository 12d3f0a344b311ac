"""The kinds of agent an environment has, as ``troupe train ENV`` sets a run up from them.

Agents whose observation and action spaces are the same are one kind, and one policy plays
them all (parameter sharing: the agents of ``simple_spread``, KAZ's knights and archers).
Agents whose spaces differ (a predator and its prey, a speaker and a listener) are kinds of
their own, each with its own policy; ``troupe train`` used to refuse them and ask for an
experiment written by hand with ``agent_policies``.

A kind's policy is named after its agents: the name they share without their number where the
environment names its agents (PettingZoo's ``adversary_0`` and ``adversary_1``: ``adversary``),
else ``agent<i>`` after its first agent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from api import environment as env_api
from api.env_check import declared_spaces
from api.errors import UserError


@dataclass
class Declared:
    """What one environment made for it declares: each agent's (observation, action) spaces,
    and the agents' names where it has them."""

    spaces: list[tuple[gym.Space, gym.Space]]
    names: list[str] | None = None


@dataclass
class AgentKind:
    """Agents with the same spaces, which one policy plays."""

    name: str
    """The policy's name (:func:`agent_kinds`)."""
    observation: gym.Space
    action: gym.Space
    agents: list[int]
    """The kind's agents, by index."""

    def said(self) -> str:
        """``agent 1`` or ``agents 0 and 2``, as errors name them."""
        if len(self.agents) == 1:
            return f"agent {self.agents[0]}"
        return "agents " + ", ".join(map(str, self.agents[:-1])) + f" and {self.agents[-1]}"

    def whose(self, kinds: list[AgentKind]) -> str:
        """`` (agent 1's)`` where the environment has several kinds, for an error to say whose
        space it means; empty where it has one."""
        return f" ({self.said()}'s)" if len(kinds) > 1 else ""


def declared(env: str, env_args: dict[str, Any] | None) -> Declared:
    """The spaces ``env`` declares, from one environment made for them (and closed)."""
    made = env_api.make(env, **(env_args or {}))
    try:
        observations, actions = declared_spaces(made, env)
        names = getattr(made, "agent_names", None)
        names = [str(n) for n in names] if isinstance(names, (list, tuple)) else None
        return Declared(list(zip(observations, actions, strict=True)), names)
    finally:
        env_api.close_after_probe(made, env)


def agent_kinds(
    env: str, env_args: dict[str, Any] | None, known: Declared | None = None
) -> list[AgentKind]:
    """The kinds of agent of ``env``, in the order of their first agents; every kind's
    observation checked to be one a built-in policy reads. ``known``: its spaces, read
    already (else an environment is made for them)."""
    known = known if known is not None else declared(env, env_args)
    groups: list[list[int]] = []
    for i, pair in enumerate(known.spaces):
        same = next((g for g in groups if known.spaces[g[0]] == pair), None)
        if same is None:
            groups.append([i])
        else:
            same.append(i)
    names = _names(groups, known.names)
    kinds = [AgentKind(n, *known.spaces[g[0]], g) for n, g in zip(names, groups, strict=True)]
    for kind in kinds:
        check_encodable(env, kind.observation)
    return kinds


def agent_spaces(
    env: str, env_args: dict[str, Any] | None, known: Declared | None = None
) -> tuple[gym.Space, gym.Space, int]:
    """The spaces of the environment's agents and their number, for a recipe that trains one
    policy for all of them (MuJoCo's, Atari's): agents that differ are refused."""
    kinds = agent_kinds(env, env_args, known)
    if len(kinds) > 1:
        raise UserError(
            f"environment '{env}' has {sum(len(k.agents) for k in kinds)} agents whose spaces "
            "differ; this recipe trains one policy for all of them: use troupe train ENV "
            "--algo ppo (a policy per kind of agent), or write an experiment with agent_policies"
        )
    (kind,) = kinds
    return kind.observation, kind.action, len(kind.agents)


def seats(kinds: list[AgentKind]) -> list[str]:
    """``agent_policies``: each agent's policy, by agent index."""
    seat = {agent: kind.name for kind in kinds for agent in kind.agents}
    return [seat[agent] for agent in range(len(seat))]


def _names(groups: list[list[int]], agent_names: list[str] | None) -> list[str]:
    """A policy name per group: ``default`` for one group, else the agents' common name where
    each group's is its own, else ``agent<i>`` of the group's first agent."""
    if len(groups) == 1:
        return ["default"]
    if agent_names is not None and len(agent_names) == sum(map(len, groups)):
        shared = [_common_name([agent_names[i] for i in g]) for g in groups]
        if all(shared) and len(set(shared)) == len(shared):
            return shared
    return [f"agent{g[0]}" for g in groups]


def _common_name(names: list[str]) -> str:
    """``adversary`` for ``adversary_0`` and ``adversary_1``; empty where they differ."""
    bare = {re.sub(r"[_\-.]?\d+$", "", n) for n in names}
    if len(bare) != 1:
        return ""
    return re.sub(r"[^a-z0-9]+", "-", bare.pop().lower()).strip("-")


def check_encodable(env: str, space: gym.Space, key: str = "") -> None:
    """Refuse, before any process starts, an observation no built-in policy can read (a
    MiniGrid-like ``mission`` Text): every policy worker failed to build instead."""
    from algorithm.modules.encoders import ENCODED_SPACES  # torch: only once it is needed

    if isinstance(space, gym.spaces.Dict):
        for name, part in space.spaces.items():
            check_encodable(env, part, f"{key}.{name}" if key else name)
        return
    if isinstance(space, ENCODED_SPACES):
        return
    where = f"observation key '{key}'" if key else "observation"
    if env in gym.registry:
        leave_out = (
            "e.g. register your own id in a file you --import, gym.register('Mine-v0', "
            "entry_point=lambda **kw: gymnasium.wrappers.FilterObservation("
            f"gym.make('{env}', **kw), filter_keys=[...]))"
        )
    else:  # an environment of one's own: a gymnasium wrapper cannot take it
        leave_out = "from its observation_spaces and the observations it returns"
    raise UserError(
        f"environment '{env}': its {where} is a {type(space).__name__} space, which no built-in "
        "policy reads (they read Box, Discrete, MultiDiscrete and MultiBinary, and Dicts and "
        f"Tuples of them): leave it out, {leave_out}, or register a policy with its own encoder"
    )
