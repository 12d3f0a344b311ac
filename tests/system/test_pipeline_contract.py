"""``test_pipeline`` says what a policy of one's own gets wrong in ``rollout`` and ``analyze``,
where it passed code that trained wrongly or failed with an error naming nothing of it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from algorithm.actor_critic_policies.policy import ActorCriticPolicy
from algorithm.ppo.trainer import PPOTrainer
from api import registry, testing
from api.errors import PipelineCheckError, UserError
from api.policy import register
from api.registry import register_trainer


class FlatLogProb(ActorCriticPolicy):
    """``new_log_prob`` ``[T*B]``: broadcast against ``[T, B, 1]`` in the loss, no error."""

    def analyze(self, sample, target="ppo", **kwargs):
        out = super().analyze(sample, target, **kwargs)
        return dataclasses.replace(out, new_log_prob=out.new_log_prob.reshape(-1))


class NoGrad(ActorCriticPolicy):
    def analyze(self, sample, target="ppo", **kwargs):
        with torch.no_grad():
            return super().analyze(sample, target, **kwargs)


class AsDict(ActorCriticPolicy):
    def analyze(self, sample, target="ppo", **kwargs):
        out = super().analyze(sample, target, **kwargs)
        return {f.name: getattr(out, f.name) for f in dataclasses.fields(out)}


class DictOutput(ActorCriticPolicy):
    def rollout(self, request, **kwargs):
        result = super().rollout(request, **kwargs)
        result.policy_output = dict(result.policy_output.items())
        return result


CASES = {
    "contract-flat": (FlatLogProb, PipelineCheckError,
                      r"returned fields of different leading shapes: entropy \(\d+, 4, 1\), "
                      r"new_log_prob \(\d+,\), .*each is \[T, B, \.\.\.\]"),
    "contract-nograd": (NoGrad, PipelineCheckError,
                        r"returned no tensor that requires grad .* torch.no_grad\(\)\?"),
    "contract-dict": (AsDict, PipelineCheckError,
                      r"returned a dict; it returns the dataclass PPOTrainer declares, "
                      r"PPOAnalyzedResult\(new_log_prob=\.\.\., "),
    "contract-output": (DictOutput, UserError,
                        r"rollout returned a dict as policy_output: a NamedArray is needed"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_policy_that_breaks_the_contract_is_told_what_to_change(name):
    cls, error, said = CASES[name]
    register(name, cls)
    try:
        with pytest.raises(error, match=said):
            testing.test_pipeline("CartPole-v1", name, "ppo", trainer_steps=1)
    finally:  # a registration made here would travel with every run this process launches
        registry.policies.unregister(name)


class KeepsTheOptimiser(PPOTrainer):
    def get_checkpoint(self):
        return {"optimizer": object()}  # the object, not its state_dict()


def test_a_trainer_state_that_cannot_be_saved_is_said_before_a_run_fails_on_it():
    """It passed here, and a run failed at its first persisted version (version 50)."""
    register_trainer("contract-state", KeepsTheOptimiser)
    try:
        _check_state_refused()
    finally:
        registry.trainers.unregister("contract-state")


def _check_state_refused() -> None:
    with pytest.raises(PipelineCheckError, match=r"\(KeepsTheOptimiser\).get_checkpoint\(\) "
                       r"returned what cannot be saved with its versions: cannot encode "
                       r"body\['state'\]\['optimizer'\]: values of type object"):  # fmt: skip
        testing.test_pipeline("CartPole-v1", "actor-critic", "contract-state", trainer_steps=1)
