"""PPO (clipped surrogate, GAE, minibatch epochs) as a Troupe trainer.

One :meth:`PPOTrainer.step` is one PPO iteration on a ``SampleBatch`` of ``B`` segments of
``T = segment_length + 1`` steps: GAE once with the values recorded at rollout time, then
``epochs`` passes of ``minibatches`` gradient steps each, then ``policy.inc_version()``.

Feed-forward policies (``default_policy_state is None``) are trained on shuffled single
transitions: the valid ``(t, b)`` entries. Recurrent policies are trained on whole segments
(minibatches along ``B``), so the policy can unroll its memory from the state recorded at ``t=0``.

A policy serves this trainer by returning :class:`PPOAnalyzedResult` from
``analyze(sample, target="ppo")`` and by exposing ``parameters()`` (any
``algorithm.policy.SingleModelPytorchPolicy`` does) and ``inc_version()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from algorithm.modules.gae import gae_advantages
from api.namedarray import NamedArray
from api.policy import Policy, SampleBatch
from api.trainer import Trainer, TrainerStepResult


@dataclass
class PPOAnalyzedResult:
    """What ``policy.analyze(sample, target="ppo")`` returns: torch tensors, all ``[T, B, 1]``
    for a sample of ``T`` steps and ``B`` segments."""

    new_log_prob: torch.Tensor
    """Joint log-probability of ``sample.action`` under the current parameters (with gradient)."""
    old_log_prob: torch.Tensor
    """``sample.policy_output.log_prob``: the same at rollout time."""
    entropy: torch.Tensor
    """Entropy of the current action distribution (with gradient)."""
    value: torch.Tensor
    """State value of ``sample.obs`` under the current parameters (with gradient)."""
    old_value: torch.Tensor
    """``sample.policy_output.value``: the value recorded at rollout time."""


class PPOTrainer(Trainer):
    """PPO with GAE, clipped surrogate, optional value clipping and an entropy bonus.

    Args:
        policy: the policy to train (see the module docstring for what it must provide).
        lr: Adam learning rate (the starting one under ``lr_schedule="linear"``).
        gamma: discount factor.
        gae_lambda: GAE's lambda.
        clip: the surrogate's ratio clip epsilon.
        value_clip: clip the value change around the rollout value by this much (None: off).
        entropy_coef: weight of the entropy bonus.
        value_coef: weight of the value loss (itself ``0.5 * (V - return)^2``).
        max_grad_norm: global gradient-norm clip.
        epochs: passes over each batch.
        minibatches: gradient steps per pass.
        normalize_advantages: standardise advantages within each minibatch.
        lr_schedule: ``"constant"`` or ``"linear"`` (to zero at ``total_steps`` trainer steps).
        total_steps: trainer steps of the whole run; needed by the linear schedule.
        adam_eps: Adam's epsilon.
        seed: seeds minibatch shuffling (None: derived from torch's current seed, so a run that
            seeds torch before building its trainer shuffles reproducibly).
    """

    AnalyzedResult = PPOAnalyzedResult
    analyze_target = "ppo"

    def __init__(
        self,
        policy: Policy,
        lr: float = 2.5e-4,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        clip: float = 0.2,
        value_clip: float | None = None,
        entropy_coef: float = 0.01,
        value_coef: float = 0.5,
        max_grad_norm: float = 0.5,
        epochs: int = 4,
        minibatches: int = 4,
        normalize_advantages: bool = True,
        lr_schedule: str = "constant",
        total_steps: int | None = None,
        adam_eps: float = 1e-5,
        seed: int | None = None,
    ):
        if lr_schedule not in ("constant", "linear"):
            raise ValueError(f"lr_schedule must be 'constant' or 'linear', got '{lr_schedule}'")
        if lr_schedule == "linear" and not total_steps:
            raise ValueError("lr_schedule='linear' needs total_steps (trainer steps of the run)")
        if not callable(getattr(policy, "parameters", None)):
            raise TypeError(
                f"PPOTrainer needs a policy with parameters(); {type(policy).__name__} has none. "
                "Subclass algorithm.policy.SingleModelPytorchPolicy."
            )
        self._policy = policy
        self.lr, self.gamma, self.gae_lambda = lr, gamma, gae_lambda
        self.clip, self.value_clip = clip, value_clip
        self.entropy_coef, self.value_coef = entropy_coef, value_coef
        self.max_grad_norm = max_grad_norm
        self.epochs, self.minibatches = epochs, minibatches
        self.normalize_advantages = normalize_advantages
        self.lr_schedule, self.total_steps = lr_schedule, total_steps
        self._params = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(self._params, lr=lr, eps=adam_eps)
        self._steps = 0
        self._rng = np.random.default_rng(torch.initial_seed() if seed is None else seed)

    @property
    def policy(self) -> Policy:
        return self._policy

    # ----------------------------------------------------------------- one iteration
    def step(self, samples: SampleBatch) -> TrainerStepResult:
        device = getattr(self._policy, "device", torch.device("cpu"))
        batch = samples.apply(lambda x: torch.as_tensor(np.asarray(x), device=device))
        old_value = batch.policy_output.value.float()
        with torch.no_grad():
            advantages, returns, mask = gae_advantages(
                batch.reward.float(),
                old_value,
                batch.done,
                batch.truncated,
                self.gamma,
                self.gae_lambda,
            )
        lr = self._set_lr()
        self._policy.train_mode()
        totals: dict[str, float] = {}
        count = 0
        for _ in range(self.epochs):
            for index in self._minibatch_indices(mask):
                stats = self._update(batch[index], advantages[index], returns[index], mask[index])
                for k, v in stats.items():
                    totals[k] = totals.get(k, 0.0) + v
                count += 1
        self._policy.inc_version()
        self._steps += 1
        stats = {k: v / max(count, 1) for k, v in totals.items()}
        stats.update(self._batch_stats(batch, advantages, returns, old_value, mask), lr=lr)
        return TrainerStepResult(stats=stats, step=self._steps)

    def _update(self, mb: NamedArray, adv, ret, mask) -> dict[str, float]:
        out: PPOAnalyzedResult = self._policy.analyze(mb, target=self.analyze_target)
        valid = mask.bool()
        denom = mask.sum().clamp(min=1.0)

        def mean(x: torch.Tensor) -> torch.Tensor:
            # where, not a product: a masked-out step must not leak inf or nan into the loss
            return torch.where(valid, x, torch.zeros_like(x)).sum() / denom

        if self.normalize_advantages:
            centred = adv - mean(adv)
            adv = centred / (mean(centred.pow(2)).sqrt() + 1e-8)
        log_ratio = out.new_log_prob - out.old_log_prob.detach()
        ratio = log_ratio.exp()
        surrogate = torch.max(-adv * ratio, -adv * ratio.clamp(1.0 - self.clip, 1.0 + self.clip))
        policy_loss = mean(surrogate)
        value_error = (out.value - ret).pow(2)
        if self.value_clip is not None:
            old = out.old_value.detach()
            clipped = old + (out.value - old).clamp(-self.value_clip, self.value_clip)
            value_error = torch.max(value_error, (clipped - ret).pow(2))
        value_loss = 0.5 * mean(value_error)
        entropy = mean(out.entropy)
        loss = policy_loss - self.entropy_coef * entropy + self.value_coef * value_loss
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self._params, self.max_grad_norm)
        self.optimizer.step()
        with torch.no_grad():
            approx_kl = mean((ratio - 1.0) - log_ratio)
            clip_fraction = mean(((ratio - 1.0).abs() > self.clip).float())
        return {
            "policy_loss": policy_loss.item(),
            "value_loss": value_loss.item(),
            "entropy": entropy.item(),
            "approx_kl": approx_kl.item(),
            "clip_fraction": clip_fraction.item(),
            "grad_norm": float(grad_norm),
            "loss": loss.item(),
        }

    def _minibatch_indices(self, mask: torch.Tensor) -> list[Any]:
        """Index expressions into ``[T, B]``: ``(t_idx, b_idx)`` kept 2-D as ``[1, N]``, or
        ``(slice, b_idx)`` for whole segments when the policy is recurrent."""
        if self._policy.default_policy_state is not None:
            segments = mask.shape[1]
            order = self._rng.permutation(segments)
            chunks = np.array_split(order, min(self.minibatches, segments))
            return [(slice(None), torch.as_tensor(c, device=mask.device)) for c in chunks]
        valid = mask[..., 0].nonzero().cpu().numpy()
        order = self._rng.permutation(len(valid))
        chunks = np.array_split(order, min(self.minibatches, max(len(valid), 1)))
        out = []
        for c in chunks:
            t, b = valid[c, 0][None], valid[c, 1][None]
            out.append(
                (torch.as_tensor(t, device=mask.device), torch.as_tensor(b, device=mask.device))
            )
        return out

    def _set_lr(self) -> float:
        lr = self.lr
        if self.lr_schedule == "linear":
            lr = self.lr * max(0.0, 1.0 - self._steps / self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _batch_stats(self, batch, advantages, returns, old_value, mask) -> dict[str, float]:
        valid = mask.bool()
        ret, val = returns[valid], old_value[valid]
        var = ret.var() if ret.numel() > 1 else torch.tensor(0.0)
        explained = 1.0 - (ret - val).var() / var if var > 0 else torch.tensor(float("nan"))
        stats = {
            "explained_variance": float(explained),
            "advantage_mean": float(advantages[valid].mean()) if ret.numel() else 0.0,
            "return_mean": float(ret.mean()) if ret.numel() else 0.0,
            "valid_fraction": float(mask.mean()),
        }
        if batch.policy_version is not None:
            lag = self._policy.version - 1 - batch.policy_version.float()[valid]
            stats["policy_lag"] = float(lag.mean()) if lag.numel() else 0.0
        return stats

    # ----------------------------------------------------------------- checkpoints
    def get_checkpoint(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "steps": self._steps}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self._steps = int(checkpoint["steps"])
