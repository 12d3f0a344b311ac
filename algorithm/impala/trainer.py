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
from typing import Any

import numpy as np
import torch

from algorithm.modules.policy_lag import policy_lag_stats
from algorithm.modules.vtrace import vtrace_targets
from api.policy import Policy, SampleBatch
from api.trainer import Trainer, TrainerStepResult


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


class ImpalaTrainer(Trainer):
    """IMPALA: V-trace actor-critic, one pass over each batch.

    Args:
        policy: the policy to train (see the module docstring for what it must provide).
        lr: Adam learning rate.
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
        adam_eps: Adam's epsilon.
        seed: seeds the split of segments into minibatches (None: from torch's seed).
    """

    AnalyzedResult = ImpalaAnalyzedResult
    analyze_target = "impala"

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
        adam_eps: float = 1e-5,
        seed: int | None = None,
    ):
        if c_bar > rho_bar:
            raise ValueError(f"c_bar ({c_bar}) must not exceed rho_bar ({rho_bar}): see IMPALA")
        if minibatches < 1:
            raise ValueError(f"minibatches must be at least 1, got {minibatches}")
        if not callable(getattr(policy, "parameters", None)):
            raise TypeError(
                f"ImpalaTrainer needs a policy with parameters(); {type(policy).__name__} has "
                "none. Subclass algorithm.policy.SingleModelPytorchPolicy."
            )
        self._policy = policy
        self.gamma, self.rho_bar, self.c_bar = gamma, rho_bar, c_bar
        self.pg_rho_bar, self.vtrace_lambda = pg_rho_bar, vtrace_lambda
        self.entropy_coef, self.value_coef = entropy_coef, value_coef
        self.max_grad_norm, self.minibatches = max_grad_norm, minibatches
        self._params = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(self._params, lr=lr, eps=adam_eps, foreach=True)
        self._steps = 0
        self._rng = np.random.default_rng(torch.initial_seed() if seed is None else seed)

    @property
    def policy(self) -> Policy:
        return self._policy

    def step(self, samples: SampleBatch) -> TrainerStepResult:
        device = getattr(self._policy, "device", torch.device("cpu"))
        batch = samples.apply(lambda x: torch.as_tensor(np.asarray(x), device=device))
        trained = ~(batch.done | batch.truncated)[:-1]
        stats = policy_lag_stats(self._policy.version, batch.policy_version[:-1], trained)
        self._policy.train_mode()
        segments = batch.reward.shape[1]
        order = self._rng.permutation(segments)
        rows = []
        for chunk in np.array_split(order, min(self.minibatches, segments)):
            index = torch.as_tensor(np.sort(chunk), device=device)
            rows.append(self._update(batch.apply(lambda x, i=index: x.index_select(1, i))))
        self._policy.inc_version()
        self._steps += 1
        means = torch.stack(rows).double().mean(dim=0).tolist()
        stats.update(zip(UPDATE_STATS, means, strict=True))
        return TrainerStepResult(stats=stats, step=self._steps)

    def _update(self, minibatch: SampleBatch) -> torch.Tensor:
        """One gradient step on whole segments; the :data:`UPDATE_STATS` as one tensor."""
        out: ImpalaAnalyzedResult = self._policy.analyze(minibatch, target=self.analyze_target)
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
        valid, count = mask.bool(), mask.sum().clamp(min=1.0)

        def mean(x: torch.Tensor) -> torch.Tensor:
            # where, not a product: an untrained step's log-prob may be -inf
            return torch.where(valid, x, torch.zeros_like(x)).sum() / count

        policy_loss = -mean(advantages * out.new_log_prob)
        value_loss = 0.5 * mean((out.value - vs).pow(2))
        entropy = mean(out.entropy)
        loss = policy_loss + self.value_coef * value_loss - self.entropy_coef * entropy
        for p in self._params:
            p.grad = None
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self._params, self.max_grad_norm)
        self.optimizer.step()
        with torch.no_grad():
            ratio = torch.where(valid, log_rho, torch.zeros_like(log_rho)).exp()
            clipped = mean((ratio > self.rho_bar).float())
            row = (policy_loss, value_loss, entropy, grad_norm, loss, mean(ratio), clipped)
            return torch.stack([*row, mean(vs)])

    def get_checkpoint(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "steps": self._steps}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self._steps = int(checkpoint["steps"])
