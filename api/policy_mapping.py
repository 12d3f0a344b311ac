"""Policy mappings: which policy plays which agent, decided afresh for every episode.

A fixed seat -> policy list (``ExperimentConfig.agent_policies``) cannot express self-play
(the learner sits in either seat, against a changing opponent) nor leagues. A *policy mapping*
is a function ``(episode_id, agent_index, info) -> policy name``:

* ``episode_id``: a number that names the episode; an actor calls the function once per agent at
  every reset, with the same ``episode_id`` for all agents of that episode;
* ``agent_index``: the agent (seat), 0 to ``agent_count - 1``;
* ``info``: what the runtime knows that a mapping may use (read-only; may be empty), e.g. the
  environment slot, the actor, whether it is evaluation.

The function must be deterministic in its arguments (derive any randomness from
``episode_id``): processes that ask the same question must get the same answer.

Mappings are registered like every other component, by name, with a lazy ``"module:factory"``
entry point. The factory takes the mapping's keyword arguments and returns the function, so one
registered mapping serves many experiments::

    from api.policy_mapping import make_policy_mapping, register_policy_mapping

    register_policy_mapping("my-league", "my_package.mappings:league", p_latest=0.5)
    mapping = make_policy_mapping("my-league", learner="main")
    mapping(17, 1, {})  # -> e.g. "main"

``check_policy_mapping`` calls a mapping on a few episodes and reports names that are not
policies of the experiment before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from api.errors import ConfigError
from api.registry import Spec, make_spec, policy_mappings

PolicyMapping = Callable[[int, int, dict[str, Any]], str]
"""``(episode_id, agent_index, info) -> policy name``."""


def register_policy_mapping(
    name: str, entry_point: str | Callable[..., PolicyMapping], *, override: bool = False, **kwargs
) -> Spec:
    """Register a mapping factory under ``name``; ``kwargs`` become its default arguments."""
    return policy_mappings.register(name, entry_point, override=override, **kwargs)


def make_policy_mapping(name_or_spec: str | Spec, **kwargs: Any) -> PolicyMapping:
    """Build a registered mapping: call its factory with the defaults and ``kwargs``."""
    mapping = make_spec("policy_mapping", name_or_spec).make(**kwargs)
    if not callable(mapping):
        raise ConfigError(
            [
                f"policy mapping '{name_or_spec}': its factory returned a "
                f"{type(mapping).__name__}, not a function (episode_id, agent_index, info) -> "
                "policy name; make the entry point a factory that returns the function"
            ]
        )
    return mapping


def check_policy_mapping(
    mapping: PolicyMapping,
    policies: Iterable[str],
    agent_count: int,
    episodes: Iterable[int] = range(64),
) -> list[str]:
    """Problems with ``mapping`` over ``episodes``: names that are not in ``policies``, answers
    that are not strings, exceptions. Empty when it is fine."""
    known = set(policies)
    problems: list[str] = []
    for episode in episodes:
        for agent in range(agent_count):
            try:
                name = mapping(episode, agent, {})
            except Exception as e:
                problems.append(f"episode {episode}, agent {agent}: the mapping raised {e!r}")
                return problems
            if not isinstance(name, str) or name not in known:
                problems.append(
                    f"episode {episode}, agent {agent}: the mapping returned {name!r}, which is "
                    f"not a policy of the experiment ({sorted(known)})"
                )
                return problems
    return problems
