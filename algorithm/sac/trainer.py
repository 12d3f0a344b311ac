"""Soft actor-critic (Haarnoja et al., 2018) with twin critics and a learned temperature.

One :meth:`SACTrainer.step` takes a :class:`~api.replay.TransitionBatch` from a replay buffer::

    y            = reward + discount * (min(Q1', Q2')(s', a') - alpha * log pi(a'|s')),  a' ~ pi(s')
    critic loss  = mean(weight * ((Q1(s, a) - y)^2 + (Q2(s, a) - y)^2)) / 2
    actor loss   = mean(alpha * log pi(a~|s) - min(Q1, Q2)(s, a~)),              a~ ~ pi(s)
    alpha loss   = -mean(log_alpha * (log pi(a~|s) + target_entropy))

Each loss moves only its own parameters (critics, actor, ``log_alpha``), each with its own Adam;
then the target critics move towards the critics by Polyak averaging (``tau``) and
``policy.inc_version()``. The temperature ``alpha = exp(log_alpha)`` is learned so that the
policy's entropy stays near ``target_entropy`` (default ``-action_dim``). Under data-parallel
training (``trainer_workers`` > 1) the policy's DDP wrapper averages the networks' gradients and
the trainer averages ``log_alpha``'s, so every rank takes the same step.

A policy serves this trainer by returning :class:`SACAnalyzedResult` from ``analyze(transitions,
target="sac")`` and providing ``actor_parameters()``, ``critic_parameters()``,
``update_target(tau)``, ``inc_version()`` and ``act_dim`` (``algorithm.sac.policy.SACPolicy``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from algorithm.modules.adam import load_adam_state, make_adam
from algorithm.modules.device_batch import on_device
from algorithm.policy import wait_for_gpu
from api.policy import Policy
from api.replay import TransitionBatch, require_transitions
from api.trainer import Trainer, TrainerStepResult


@dataclass
class SACAnalyzedResult:
    """What ``policy.analyze(transitions, target="sac")`` returns: ``[B, 1]`` tensors."""

    q1: torch.Tensor
    """First critic at ``(obs, action)`` (gradient into the critic only)."""
    q2: torch.Tensor
    """Second critic at ``(obs, action)`` (gradient into the critic only)."""
    next_q_target: torch.Tensor
    """``min`` of the target critics at ``(next_obs, a')``, ``a'`` fresh from the actor (no
    gradient)."""
    next_log_prob: torch.Tensor
    """``log pi(a'|next_obs)`` (no gradient)."""
    log_prob: torch.Tensor
    """``log pi(a~|obs)`` of a fresh reparameterised action (gradient into the actor)."""
    q_new: torch.Tensor
    """``min`` of the critics at ``(obs, a~)`` (gradient into the actor through ``a~`` only)."""


class SACTrainer(Trainer):
    """SAC with twin critics, target critics and automatic temperature tuning.

    Args:
        policy: the policy to train (see the module docstring for what it must provide).
        actor_lr: Adam learning rate of the actor.
        critic_lr: Adam learning rate of the critics.
        alpha_lr: Adam learning rate of ``log_alpha``.
        tau: Polyak step of the target critics after every trainer step.
        initial_alpha: the temperature at the start.
        learn_alpha: tune the temperature (else it stays at ``initial_alpha``).
        target_entropy: the entropy the temperature steers to, in the Box's units as the
            policy's log-probabilities are (None: ``-action_dim`` in the units of ``[-1, 1]``,
            as other SAC implementations set it, i.e. ``-action_dim + sum log(scale)`` with
            ``scale`` the half-width of each bound; ``-action_dim`` alone could not be met by a
            narrow Box: no distribution on ``[-0.1, 0.1]^2`` has an entropy above -3.2, so the
            temperature rose without end and the policy stayed random).
    """

    AnalyzedResult = SACAnalyzedResult
    analyze_target = "sac"
    needs_replay = True
    accepts_device_batches = True
    learning_rates = {
        "actor_lr": "actor_optimizer", "critic_lr": "critic_optimizer",
        "alpha_lr": "alpha_optimizer",
    }  # fmt: skip
    arg_ranges = {
        "actor_lr": "(0, inf)", "critic_lr": "(0, inf)", "alpha_lr": "(0, inf)",
        "tau": "(0, 1]", "initial_alpha": "(0, inf)",
    }  # fmt: skip

    def __init__(
        self,
        policy: Policy,
        actor_lr: float = 3e-4,
        critic_lr: float = 1e-3,
        alpha_lr: float = 1e-3,
        tau: float = 0.005,
        initial_alpha: float = 1.0,
        learn_alpha: bool = True,
        target_entropy: float | None = None,
    ):
        for name in ("actor_parameters", "critic_parameters", "update_target"):
            if not callable(getattr(policy, name, None)):
                raise TypeError(
                    f"SACTrainer needs a policy with {name}(); {type(policy).__name__} has none. "
                    "Use the sac-policy policy."
                )
        if not 0.0 < tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {tau}")
        if initial_alpha <= 0:
            raise ValueError(f"initial_alpha must be positive, got {initial_alpha}")
        self._policy = policy
        self.tau, self.learn_alpha = tau, learn_alpha
        if target_entropy is None:
            target_entropy = -float(policy.act_dim) + float(getattr(policy, "log_scale", 0.0))
        self.target_entropy = float(target_entropy)
        device = getattr(policy, "device", torch.device("cpu"))
        self.log_alpha = torch.tensor(math.log(initial_alpha), device=device, requires_grad=True)
        actor, critics = list(policy.actor_parameters()), list(policy.critic_parameters())
        self.actor_optimizer = make_adam(actor, fused=True, lr=actor_lr)
        self.critic_optimizer = make_adam(critics, fused=True, lr=critic_lr)
        self.alpha_optimizer = make_adam([self.log_alpha], fused=True, lr=alpha_lr)
        self._optimizers = [self.actor_optimizer, self.critic_optimizer]
        if learn_alpha:
            self._optimizers.append(self.alpha_optimizer)
        self._steps = 0
        self.priorities: np.ndarray | None = None
        """``[B]`` new priorities (the critics' mean absolute TD error) of the last batch."""

    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.detach().exp())

    def step(self, samples: TransitionBatch) -> TrainerStepResult:
        require_transitions(samples, "SACTrainer")
        device = getattr(self._policy, "device", torch.device("cpu"))
        batch = on_device(samples, device)
        self._policy.train_mode()
        out: SACAnalyzedResult = self._policy.analyze(batch, target=self.analyze_target)
        alpha = self.log_alpha.detach().exp()
        with torch.no_grad():
            soft_next = out.next_q_target - alpha * out.next_log_prob
            target = batch.reward.float() + batch.discount.float() * soft_next
        weight = torch.ones_like(target) if batch.weight is None else batch.weight.float()
        critic_loss = 0.5 * (weight * ((out.q1 - target).pow(2) + (out.q2 - target).pow(2))).mean()
        actor_loss = (alpha * out.log_prob - out.q_new).mean()
        alpha_loss = -(self.log_alpha * (out.log_prob.detach() + self.target_entropy)).mean()
        for optimizer in (self.actor_optimizer, self.critic_optimizer, self.alpha_optimizer):
            optimizer.zero_grad(set_to_none=True)
        # the three losses share no parameter (the policy froze the critics in q_new), so one
        # backward pass gives each optimiser exactly its own loss's gradient
        (critic_loss + actor_loss + alpha_loss).backward()
        if self.learn_alpha:
            _average_over_group(self._policy, self.log_alpha.grad)
        for optimizer in self._optimizers:
            optimizer.step()
        self._policy.update_target(self.tau)
        # No policy lag: replayed samples are old by design (the trainer worker reports their
        # age, ``sample_age_versions``, from its replay source).
        stats: dict[str, float] = {}
        self._policy.inc_version()
        self._steps += 1
        with torch.no_grad():
            td = 0.5 * ((out.q1 - target).abs() + (out.q2 - target).abs())
            wait_for_gpu(td.device)  # asleep, not spinning, while the step's kernels run
            self.priorities = td.reshape(-1).cpu().numpy()
            stats.update(
                critic_loss=float(critic_loss),
                actor_loss=float(actor_loss),
                alpha_loss=float(alpha_loss),
                alpha=float(alpha),
                entropy=float(-out.log_prob.mean()),
                q_mean=float(out.q1.mean()),
                target_mean=float(target.mean()),
            )
        return TrainerStepResult(stats=stats, step=self._steps)

    def get_checkpoint(self) -> dict[str, Any]:
        return {
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "alpha_optimizer": self.alpha_optimizer.state_dict(),
            "log_alpha": self.log_alpha.detach().cpu().clone(),
            "steps": self._steps,
        }

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        for name in ("actor", "critic", "alpha"):
            load_adam_state(getattr(self, f"{name}_optimizer"), checkpoint[f"{name}_optimizer"])
        with torch.no_grad():
            self.log_alpha.copy_(torch.as_tensor(checkpoint["log_alpha"]))
        self._steps = int(checkpoint["steps"])


def _average_over_group(policy: Policy, grad: torch.Tensor | None) -> None:
    """Under data-parallel training DDP averages the networks' gradients over the ranks; the
    temperature is the trainer's own tensor, outside the wrapped module, so its gradient is
    averaged here (else every rank would steer its own ``alpha``)."""
    net = getattr(policy, "net", None)
    if grad is None or not isinstance(net, torch.nn.parallel.DistributedDataParallel):
        return
    dist.all_reduce(grad, group=net.process_group)
    grad /= dist.get_world_size(net.process_group)
