"""Built-in policy mappings (``api.policy_mapping``): who plays which seat in each episode.

Each entry point is a factory: it takes the mapping's arguments, checks them, and returns the
function ``(episode_id, agent_index, info) -> policy name``. The functions draw any randomness
from ``(seed, episode_id, agent_index)``, so every process that asks gets the same answer.

* ``fixed-seats`` (:func:`fixed_seats`): seat ``i`` is always ``policies[i]`` (what
  ``agent_policies`` does today).
* ``rotate-seats`` (:func:`rotate_seats`): the policies move one seat on per episode, so each
  plays every seat equally often (first-move advantage shared out).
* ``self-play`` (:func:`self_play`): the learner takes seat ``episode_id % agent_count``; every
  other seat is an opponent drawn by weight from ``opponents``, which may include the learner
  itself (mirror play) and frozen or scripted policies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from api.errors import ConfigError
from api.policy_mapping import PolicyMapping


def fixed_seats(policies: Sequence[str]) -> PolicyMapping:
    names = _names(policies, "fixed-seats", "policies")

    def mapping(episode_id: int, agent_index: int, info: dict[str, Any]) -> str:
        return names[agent_index]

    return mapping


def rotate_seats(policies: Sequence[str]) -> PolicyMapping:
    names = _names(policies, "rotate-seats", "policies")

    def mapping(episode_id: int, agent_index: int, info: dict[str, Any]) -> str:
        return names[(agent_index - episode_id) % len(names)]

    return mapping


def self_play(
    learner: str,
    opponents: Sequence[str] | Mapping[str, float],
    agent_count: int = 2,
    seed: int = 0,
) -> PolicyMapping:
    """``opponents``: names (equally likely) or ``{name: weight}``."""
    if not isinstance(learner, str) or not learner:
        raise ConfigError(["self-play: learner must name a policy"])
    if isinstance(opponents, Mapping):
        names = _names(list(opponents), "self-play", "opponents")
        weights = np.array([float(opponents[n]) for n in names])
    else:
        names = _names(opponents, "self-play", "opponents")
        weights = np.ones(len(names))
    if np.any(weights < 0) or not weights.sum() > 0:
        raise ConfigError([f"self-play: opponent weights must be >= 0 and not all 0: {opponents}"])
    if agent_count < 2:
        raise ConfigError([f"self-play: agent_count must be at least 2, got {agent_count}"])
    probabilities = weights / weights.sum()

    def mapping(episode_id: int, agent_index: int, info: dict[str, Any]) -> str:
        if agent_index == episode_id % agent_count:
            return learner
        rng = np.random.default_rng([seed, episode_id, agent_index])
        return names[int(rng.choice(len(names), p=probabilities))]

    return mapping


def _names(policies: Any, mapping: str, key: str) -> list[str]:
    if (
        isinstance(policies, str)
        or not policies
        or not all(isinstance(p, str) and p for p in policies)
    ):
        raise ConfigError([f"{mapping}: {key} must be a non-empty list of policy names"])
    return list(policies)
