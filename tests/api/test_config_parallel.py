"""The data-parallel trainer check (api.config.parallel): more than one trainer needs a trainer
and a policy class with ``distributed_setup()``; anything else is left to other checks."""

from __future__ import annotations

import pytest

from api import registry
from api.config import ComponentConfig, PolicyConfig
from api.config.parallel import check_data_parallel


class Frozen:
    """A policy class without distributed_setup()."""


class Wrappable:
    """A policy class that can wrap its model for data-parallel training."""

    def distributed_setup(self, group):
        return group


def frozen_factory():
    """A factory, not a class: what it builds is not known until it is called."""
    return Frozen()


@pytest.fixture(autouse=True)
def policies():
    names = {"test-frozen": Frozen, "test-wrappable": Wrappable, "test-factory": frozen_factory}
    for name, target in names.items():
        registry.register_policy(name, target)
    yield
    for name in names:
        registry.policies.unregister(name)


def _policy(policy: str, workers, trainer: str = "ppo") -> PolicyConfig:
    return PolicyConfig(
        policy=ComponentConfig(type=policy), trainer=ComponentConfig(type=trainer),
        trainer_workers=workers,
    )  # fmt: skip


def test_a_policy_class_without_distributed_setup_is_refused_naming_it():
    (error,) = check_data_parallel("policies.red", _policy("test-frozen", 2))
    assert error.startswith("policies.red.trainer_workers: 2 trainers train data-parallel")
    assert "'test-frozen' (test_config_parallel.Frozen) has none: set trainer_workers=1" in error


def test_a_policy_with_distributed_setup_may_train_data_parallel():
    assert check_data_parallel("policies.p", _policy("test-wrappable", 4)) == []
    assert check_data_parallel("policies.p", _policy("actor-critic", 2)) == []  # the built-in


def test_several_trainers_without_a_trainer_are_refused():
    assert check_data_parallel("policies.p", _policy("test-wrappable", 3, trainer="")) == [
        "policies.p.trainer_workers: 3 trainers for a policy without a trainer; set it to 1"
    ]


@pytest.mark.parametrize(
    "policy, workers",
    [
        ("test-frozen", 1),  # one trainer: nothing to average
        ("test-frozen", "2"),  # a wrong type is the type check's to report
        ("no-such-policy", 2),  # an unknown policy is the policy check's to report
        ("test-factory", 2),  # a factory: nothing to tell before it is called
    ],
)
def test_what_is_not_this_checks_business_passes(policy, workers):
    assert check_data_parallel("policies.p", _policy(policy, workers)) == []
