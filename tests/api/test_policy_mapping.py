"""Policy mappings: registry, factories, determinism, and the check that names are policies."""

from __future__ import annotations

from collections import Counter

import pytest

from api import registry
from api.errors import ConfigError, RegistryError
from api.policy_mapping import check_policy_mapping, make_policy_mapping, register_policy_mapping


def test_built_in_mappings_are_registered():
    assert {"fixed-seats", "rotate-seats", "self-play"} <= set(registry.policy_mappings.names())


def test_fixed_and_rotating_seats():
    fixed = make_policy_mapping("fixed-seats", policies=["red", "blue"])
    assert [fixed(e, a, {}) for e in range(3) for a in range(2)] == ["red", "blue"] * 3
    rotate = make_policy_mapping("rotate-seats", policies=["a", "b", "c"])
    assert [[rotate(e, s, {}) for s in range(3)] for e in range(3)] == [
        ["a", "b", "c"],
        ["c", "a", "b"],
        ["b", "c", "a"],
    ]


def test_self_play_rotates_the_learner_and_draws_opponents_by_weight():
    mapping = make_policy_mapping(
        "self-play", learner="main", opponents={"main": 1.0, "random": 3.0}, seed=5
    )
    seats = [[mapping(e, a, {}) for a in range(2)] for e in range(4000)]
    assert all(seats[e][e % 2] == "main" for e in range(4000))
    drawn = Counter(seats[e][1 - e % 2] for e in range(4000))
    assert abs(drawn["random"] / 4000 - 0.75) < 0.03
    again = make_policy_mapping(
        "self-play", learner="main", opponents={"main": 1.0, "random": 3.0}, seed=5
    )
    opponents = [seats[e][1 - e % 2] for e in range(200)]
    assert [again(e, 1 - e % 2, {}) for e in range(200)] == opponents  # same episode, same draw


def test_bad_arguments_are_config_errors_naming_the_mapping():
    with pytest.raises(ConfigError, match="self-play: opponent weights"):
        make_policy_mapping("self-play", learner="main", opponents={"x": 0.0})
    with pytest.raises(ConfigError, match="rotate-seats: policies must be a non-empty list"):
        make_policy_mapping("rotate-seats", policies="ab")
    with pytest.raises(RegistryError, match="Did you mean 'self-play'"):
        make_policy_mapping("self_play")


def test_check_reports_names_that_are_not_policies():
    mapping = make_policy_mapping("self-play", learner="main", opponents=["main", "old"])
    problems = check_policy_mapping(mapping, ["main"], agent_count=2)
    assert len(problems) == 1 and "returned 'old', which is not a policy" in problems[0]
    assert check_policy_mapping(mapping, ["main", "old"], agent_count=2) == []


def _not_a_factory():
    return 42


def test_a_factory_must_return_a_function():
    register_policy_mapping("test-not-a-factory", _not_a_factory, override=True)
    try:
        with pytest.raises(ConfigError, match="not a function"):
            make_policy_mapping("test-not-a-factory")
    finally:
        registry.policy_mappings.unregister("test-not-a-factory")
