"""The trainers' Adam (``algorithm.modules.adam``): the off-policy trainers run the fused kernel
where torch has it, every implementation makes the same update, and a checkpoint written by one
implementation loads into another and goes on with the same steps."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from algorithm.dqn.trainer import DQNTrainer
from algorithm.modules.adam import adam_impl, load_adam_state, make_adam
from algorithm.q_policies.policy import QPolicy
from algorithm.sac.policy import SACPolicy
from algorithm.sac.trainer import SACTrainer

HAS_FUSED = adam_impl([torch.zeros(1)], fused=True)["fused"]


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in [(8, 4), (8,), (2, 8)]]


def _steps(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], n: int) -> None:
    for i in range(n):
        g = torch.Generator().manual_seed(100 + i)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        optimizer.step()


def test_the_off_policy_trainers_run_fused_adam_where_torch_has_it():
    box = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    dqn = DQNTrainer(QPolicy(box, gym.spaces.Discrete(2), hidden_sizes=[8]))
    sac = SACTrainer(SACPolicy(box, gym.spaces.Box(-1.0, 1.0, (1,), np.float32), hidden_sizes=[8]))
    optimizers = [dqn.optimizer, sac.actor_optimizer, sac.critic_optimizer, sac.alpha_optimizer]
    for optimizer in optimizers:
        group = optimizer.param_groups[0]
        assert group["fused"] == HAS_FUSED and group["foreach"] != HAS_FUSED


@pytest.mark.parametrize("first, second", [(False, True), (True, False)])
def test_a_checkpoint_of_one_implementation_goes_on_in_the_other(first, second):
    """Three steps, a checkpoint, three more: the same parameters as six steps in one."""
    whole_params, split_params = _params(0), _params(0)
    whole = make_adam(whole_params, fused=first, lr=1e-2)
    _steps(whole, whole_params, 3)
    split = make_adam(split_params, fused=first, lr=1e-2)
    _steps(split, split_params, 3)
    state = split.state_dict()
    resumed = make_adam(split_params, fused=second, lr=1e-2)
    load_adam_state(resumed, state)
    assert resumed.param_groups[0]["fused"] == (second and HAS_FUSED)  # its own, not the file's
    for i in range(3):  # the same gradients as the whole run's steps 4-6
        g = torch.Generator().manual_seed(103 + i)
        for p, q in zip(whole_params, split_params, strict=True):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        whole.step()
        resumed.step()
    for p, q in zip(whole_params, split_params, strict=True):
        torch.testing.assert_close(p, q)


def test_population_based_training_sets_the_rates_the_off_policy_trainers_built_adam_with():
    """PBT over DQN failed after launch: "DQNTrainer has no numeric hyper-parameter 'lr'" (its
    rate lives in its optimiser). Each rate the trainer took goes to its own optimiser, and a
    checkpoint keeps it."""
    box = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    dqn = DQNTrainer(QPolicy(box, gym.spaces.Discrete(2), hidden_sizes=[8]), lr=1e-3)
    dqn.set_hyperparameters({"lr": 4e-4, "target_update_every": 7.4})
    assert dqn.optimizer.param_groups[0]["lr"] == 4e-4 and dqn.target_update_every == 7
    assert dqn.get_checkpoint()["optimizer"]["param_groups"][0]["lr"] == 4e-4
    sac = SACTrainer(SACPolicy(box, gym.spaces.Box(-1.0, 1.0, (1,), np.float32), hidden_sizes=[8]))
    sac.set_hyperparameters({"actor_lr": 1e-4, "critic_lr": 2e-4, "alpha_lr": 3e-4, "tau": 0.01})
    optimizers = (sac.actor_optimizer, sac.critic_optimizer, sac.alpha_optimizer)
    assert [o.param_groups[0]["lr"] for o in optimizers] == [1e-4, 2e-4, 3e-4]
    assert sac.tau == 0.01
    with pytest.raises(Exception, match="SACTrainer has no numeric hyper-parameter 'lr'"):
        sac.set_hyperparameters({"lr": 1e-3})
