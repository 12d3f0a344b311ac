"""IMPALA (Espeholt et al., 2018): an actor-critic trainer that corrects for policy lag with
V-trace, so actors may act with parameters several versions older than the learner's.

One :meth:`ImpalaTrainer.step` on a ``SampleBatch`` of ``B`` segments of ``T`` steps:

1. ``policy.analyze(minibatch, target="impala")`` evaluates the current parameters on the
   segments: log-probs of the actions taken, entropy and state values (with gradients);
2. V-trace (:mod:`algorithm.modules.vtrace`) turns the current values and the ratios
   ``pi(a|x) / mu(a|x)`` against the behaviour log-probs recorded at rollout into value targets
   ``vs`` and advantages, both held constant;
3. one gradient step on ``-adv * log pi(a|x) + value_coef * 0.5 * (V - vs)^2 - entropy_coef * H``,
   averaged over the steps trained on.

Minibatches split the batch along segments (V-trace runs along time inside each segment), one
gradient step each. Then ``policy.inc_version()``: one trainer step is one version.

A policy serves this trainer by returning :class:`ImpalaAnalyzedResult` from
``analyze(sample, target="impala")`` and exposing ``parameters()`` and ``inc_version()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from algorithm.modules.actor_critic_trainer import ActorCriticTrainer, masked_mean
from algorithm.modules.device_batch import on_device
from algorithm.modules.policy_lag import policy_lag_stats
from algorithm.modules.vtrace import vtrace_targets
from api.policy import Policy, SampleBatch
from api.trainer import TrainerStepResult


@dataclass
class ImpalaAnalyzedResult:
    """What ``policy.analyze(sample, target="impala")`` returns: torch tensors ``[T, B, 1]``."""

    new_log_prob: torch.Tensor
    """Joint log-probability of ``sample.action`` under the current parameters (with gradient)."""
    old_log_prob: torch.Tensor
    """The behaviour policy's log-probability of the same action, recorded at rollout."""
    entropy: torch.Tensor
    """Entropy of the current action distribution (with gradient)."""
    value: torch.Tensor
    """State value of ``sample.obs`` under the current parameters (with gradient)."""


UPDATE_STATS = (
    "policy_loss",
    "value_loss",
    "entropy",
    "grad_norm",
    "loss",
    "rho_mean",
    "rho_clip_fraction",
    "value_target_mean",
)
"""Per-minibatch statistics, averaged over a trainer step, in :meth:`ImpalaTrainer._update`'s
order."""


class ImpalaTrainer(ActorCriticTrainer):
    """IMPALA: V-trace actor-critic, one pass over each batch.

    Args:
        policy: the policy to train (see the module docstring for what it must provide).
        lr: Adam learning rate (the starting one under ``lr_schedule="linear"``).
        gamma: discount factor.
        rho_bar: clip of the importance weight in the value targets' TD errors (the paper's
            rho-bar; 1.0 in the paper). Larger trusts stale actions more.
        c_bar: clip of the trace-cutting weights (c-bar): how far back off-policy corrections
            propagate. Must not exceed ``rho_bar``.
        pg_rho_bar: clip of the importance weight in the policy gradient (None: ``rho_bar``).
        vtrace_lambda: extra trace decay inside ``c`` (1.0: plain V-trace).
        entropy_coef: weight of the entropy bonus.
        value_coef: weight of the value loss ``0.5 * (V - vs)^2``.
        max_grad_norm: global gradient-norm clip.
        minibatches: gradient steps per batch, each on a share of the segments.
        lr_schedule: ``"constant"`` or ``"linear"`` (to zero at ``total_steps`` trainer steps).
        total_steps: trainer steps of the whole run; needed by the linear schedule.
        adam_eps: Adam's epsilon.
        fused_adam: Adam's fused kernel (faster steps; see
            ``algorithm.modules.adam.adam_impl``).
        precision: ``"float32"`` or ``"bfloat16"`` (autocast forward and backward passes; see
            ``algorithm.modules.actor_critic_trainer.ActorCriticTrainer``).
        seed: seeds the split of segments into minibatches (None: from torch's seed).
    """

    AnalyzedResult = ImpalaAnalyzedResult
    analyze_target = "impala"
    arg_ranges = {
        "lr": "(0, inf)", "gamma": "[0, 1]", "rho_bar": "(0, inf)", "c_bar": "(0, inf)",
        "pg_rho_bar": "(0, inf)", "vtrace_lambda": "[0, 1]", "entropy_coef": "[0, inf)",
        "value_coef": "[0, inf)", "max_grad_norm": "(0, inf)", "minibatches": "[1, inf)",
        "total_steps": "[1, inf)", "adam_eps": "(0, inf)", "seed": "[0, inf)",
    }  # fmt: skip

    def __init__(
        self,
        policy: Policy,
        lr: float = 5e-4,
        gamma: float = 0.99,
        rho_bar: float = 1.0,
        c_bar: float = 1.0,
        pg_rho_bar: float | None = None,
        vtrace_lambda: float = 1.0,
        entropy_coef: float = 0.01,
        value_coef: float = 0.5,
        max_grad_norm: float = 40.0,
        minibatches: int = 1,
        lr_schedule: Literal["constant", "linear"] = "constant",
        total_steps: int | None = None,
        adam_eps: float = 1e-5,
        fused_adam: bool = False,
        precision: Literal["float32", "bfloat16"] = "float32",
        seed: int | None = None,
    ):
        if c_bar > rho_bar:
            raise ValueError(f"c_bar ({c_bar}) must not exceed rho_bar ({rho_bar}): see IMPALA")
        super().__init__(
            policy,
            lr=lr,
            minibatches=minibatches,
            max_grad_norm=max_grad_norm,
            lr_schedule=lr_schedule,
            total_steps=total_steps,
            adam_eps=adam_eps,
            fused_adam=fused_adam,
            precision=precision,
            seed=seed,
        )
        self.gamma, self.rho_bar, self.c_bar = gamma, rho_bar, c_bar
        self.pg_rho_bar, self.vtrace_lambda = pg_rho_bar, vtrace_lambda
        self.entropy_coef, self.value_coef = entropy_coef, value_coef

    def step(self, samples: SampleBatch) -> TrainerStepResult:
        device = self._device()
        batch = on_device(samples, device)
        trained = ~(batch.done | batch.truncated)[:-1]
        stats = policy_lag_stats(self._policy.version, batch.policy_version[:-1], trained)
        lr = self._set_lr()
        self._policy.train_mode()
        rows = []
        # whole segments, in their order: V-trace runs along time inside each
        for index in self._minibatch_indices(batch.reward.shape[1], device, sort=True):
            rows.append(self._update(batch.apply(lambda x, i=index: x.index_select(1, i))))
        step = self._finish_step()
        stats.update(self._mean_update_stats(rows, UPDATE_STATS), lr=lr)
        return TrainerStepResult(stats=stats, step=step)

    def _update(self, minibatch: SampleBatch) -> torch.Tensor:
        """One gradient step on whole segments; the :data:`UPDATE_STATS` as one tensor."""
        out: ImpalaAnalyzedResult = self._analyze(minibatch)
        with torch.no_grad():
            log_rho = out.new_log_prob - out.old_log_prob
            vs, advantages, mask = vtrace_targets(
                minibatch.reward.float(),
                out.value.detach(),
                minibatch.done,
                minibatch.truncated,
                log_rho,
                self.gamma,
                self.rho_bar,
                self.c_bar,
                self.pg_rho_bar,
                self.vtrace_lambda,
            )
        valid, mean = mask.bool(), masked_mean(mask)
        policy_loss = -mean(advantages * out.new_log_prob)
        value_loss = 0.5 * mean((out.value - vs).pow(2))
        entropy = mean(out.entropy)
        loss = policy_loss + self.value_coef * value_loss - self.entropy_coef * entropy
        grad_norm = self._gradient_step(loss)
        with torch.no_grad():
            ratio = torch.where(valid, log_rho, torch.zeros_like(log_rho)).exp()
            clipped = mean((ratio > self.rho_bar).float())
            row = (policy_loss, value_loss, entropy, grad_norm, loss, mean(ratio), clipped)
            return torch.stack([*row, mean(vs)])
