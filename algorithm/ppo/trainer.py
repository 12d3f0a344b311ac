"""PPO (clipped surrogate, GAE, minibatch epochs) as a Troupe trainer.

One :meth:`PPOTrainer.step` is one PPO iteration on a ``SampleBatch`` of ``B`` segments of
``T = segment_length + 1`` steps: GAE once with the values recorded at rollout time, then
``epochs`` passes of ``minibatches`` gradient steps each, then ``policy.inc_version()``.

With ``vtrace=True`` (asynchronous PPO, as Sample Factory's APPO) the targets come from V-trace
instead of GAE: before the epochs, the current parameters evaluate the whole batch once, and the
ratios of their log-probs to the behaviour policy's (recorded at rollout, possibly many versions
ago) weigh the value targets and advantages, clipped at ``rho_bar`` and ``c_bar``. GAE assumes
the actions came from the parameters being trained; with several actors and a busy trainer they
come from older ones (the ``policy_lag_*`` statistics say how much older).

Feed-forward policies (``default_policy_state is None``) are trained on shuffled single
transitions: the valid ``(t, b)`` entries. Recurrent policies are trained on whole segments
(minibatches along ``B``), so the policy can unroll its memory from the state recorded at ``t=0``.

A policy serves this trainer by returning :class:`PPOAnalyzedResult` from
``analyze(sample, target="ppo")`` and by exposing ``parameters()`` (any
``algorithm.policy.SingleModelPytorchPolicy`` does) and ``inc_version()``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.nn.parallel import DistributedDataParallel

from algorithm.modules.actor_critic_trainer import ActorCriticTrainer, masked_mean
from algorithm.modules.device_batch import on_device
from algorithm.modules.gae import gae_advantages
from algorithm.modules.graphed_minibatches import GraphedMinibatches
from algorithm.modules.policy_lag import policy_lag_stats
from algorithm.modules.vtrace import vtrace_targets
from api.namedarray import NamedArray
from api.policy import Policy, SampleBatch
from api.trainer import TrainerStepResult

logger = logging.getLogger(__name__)


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


UPDATE_STATS = (
    "policy_loss",
    "value_loss",
    "entropy",
    "approx_kl",
    "clip_fraction",
    "grad_norm",
    "loss",
)
"""The per-minibatch statistics, averaged over a trainer step, in :meth:`PPOTrainer._update`'s
order."""


def _take(x: NamedArray | torch.Tensor | None, index: torch.Tensor):
    """Entries ``index`` along dimension 1 of a tensor, or of every leaf of a NamedArray."""
    if isinstance(x, NamedArray):
        return x.apply(lambda leaf: leaf.index_select(1, index))
    return None if x is None else x.index_select(1, index)


class PPOTrainer(ActorCriticTrainer):
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
        fused_adam: Adam's fused kernel (faster steps; see
            ``algorithm.modules.adam.adam_impl``).
        precision: ``"float32"`` or ``"bfloat16"`` (autocast forward and backward passes; see
            ``algorithm.modules.actor_critic_trainer.ActorCriticTrainer``).
        vtrace: V-trace value targets and advantages instead of GAE (see the module docstring).
        rho_bar: V-trace's clip of the importance weights in the targets and advantages. The
            traces also decay by ``gae_lambda``: on on-policy data the value targets are GAE's
            returns (and at ``gae_lambda=1`` the advantages are GAE's too).
        c_bar: V-trace's clip of the trace-cutting weights (at most ``rho_bar``).
        seed: seeds minibatch shuffling (None: derived from torch's current seed, so a run that
            seeds torch before building its trainer shuffles reproducibly).
        cuda_graphs: replay each minibatch step as a CUDA graph, one launch instead of one per
            operation (feed-forward policies on a GPU, one trainer process; see
            :mod:`algorithm.modules.graphed_minibatches`). Without a GPU the same padded
            minibatches run as plain calls; a recurrent policy trains as without it.
    """

    AnalyzedResult = PPOAnalyzedResult
    analyze_target = "ppo"
    arg_ranges = {
        "lr": "(0, inf)", "gamma": "[0, 1]", "gae_lambda": "[0, 1]", "clip": "(0, inf)",
        "value_clip": "(0, inf)", "entropy_coef": "[0, inf)", "value_coef": "[0, inf)",
        "max_grad_norm": "(0, inf)", "epochs": "[1, inf)", "minibatches": "[1, inf)",
        "total_steps": "[1, inf)", "adam_eps": "(0, inf)", "rho_bar": "(0, inf)",
        "c_bar": "(0, inf)", "seed": "[0, inf)",
    }  # fmt: skip

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
        lr_schedule: Literal["constant", "linear"] = "constant",
        total_steps: int | None = None,
        adam_eps: float = 1e-5,
        fused_adam: bool = False,
        precision: Literal["float32", "bfloat16"] = "float32",
        vtrace: bool = False,
        rho_bar: float = 1.0,
        c_bar: float = 1.0,
        seed: int | None = None,
        cuda_graphs: bool = False,
    ):
        if vtrace and c_bar > rho_bar:
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
            capturable=cuda_graphs,
        )
        self.gamma, self.gae_lambda = gamma, gae_lambda
        self.clip, self.value_clip = clip, value_clip
        self.entropy_coef, self.value_coef = entropy_coef, value_coef
        self.epochs = epochs
        self.normalize_advantages = normalize_advantages
        self.vtrace, self.rho_bar, self.c_bar = vtrace, rho_bar, c_bar
        self._graphs = None
        self._warned_single_rows = False
        self.cuda_graphs = cuda_graphs
        if cuda_graphs and policy.default_policy_state is not None:
            logger.warning(
                "cuda_graphs=True applies to feed-forward policies; this recurrent one trains on "
                "whole segments, without graphs"
            )
        elif cuda_graphs:
            self._graphs = GraphedMinibatches(self._update, self._device())

    # ----------------------------------------------------------------- one iteration
    def step(self, samples: SampleBatch) -> TrainerStepResult:
        device = self._device()
        batch = on_device(samples, device)
        old_value = batch.policy_output.value.float()
        lr = self._set_lr()
        self._policy.train_mode()
        advantages, returns, mask = self._targets(batch, old_value)
        lag = policy_lag_stats(self._policy.version, batch.policy_version, mask)
        pool, pool_adv, pool_ret, pool_mask = self._training_pool(batch, advantages, returns, mask)
        rows = self._minibatch_steps(pool, pool_adv, pool_ret, pool_mask)
        step = self._finish_step()
        stats = self._mean_update_stats(rows, UPDATE_STATS)
        stats.update(self._batch_stats(advantages, returns, old_value, mask), lr=lr, **lag)
        if self.cuda_graphs:  # how many minibatch sizes replay as graphs (0: all eager)
            stats["minibatch_graphs"] = float(self._graphs.graphs if self._graphs else 0)
        return TrainerStepResult(stats=stats, step=step)

    def _minibatch_steps(self, pool, pool_adv, pool_ret, pool_mask) -> list[torch.Tensor]:
        """``epochs`` passes of shuffled minibatches over the pool, one gradient step each
        (through CUDA graphs where they apply); the statistics row of each."""
        count, device = pool_adv.shape[1], pool_adv.device
        self._warn_single_rows(count)
        if self._graphs is not None and count and not self._data_parallel():
            chunks = self._minibatch_chunks(count, passes=self.epochs)
            return self._graphs.run(pool, pool_adv, pool_ret, chunks)
        rows = []
        for index in self._minibatch_indices(count, device, passes=self.epochs):
            minibatch = (_take(x, index) for x in (pool, pool_adv, pool_ret, pool_mask))
            rows.append(self._update(*minibatch))
        return rows

    def _warn_single_rows(self, count: int) -> None:
        """Once: minibatches of one transition, whose advantage normalised within the minibatch
        is 0, so the policy gets no gradient at all (``minibatches=100000`` over a batch of a
        few thousand ran for minutes at ``policy_loss=0``, the entropy untouched)."""
        single = self.normalize_advantages and self._policy.default_policy_state is None
        if not single or self._warned_single_rows or not 0 < count < 2 * self.minibatches:
            return
        self._warned_single_rows = True
        logger.warning(
            "minibatches=%d over a batch of %d transitions leaves minibatches of one, whose "
            "normalised advantages are 0: the policy learns nothing from them; use at most %d "
            "minibatches (or normalize_advantages=False)",
            self.minibatches, count, max(1, count // 2),
        )  # fmt: skip

    def _data_parallel(self) -> bool:
        """Whether the policy trains data-parallel (DDP averages gradients with hooks of its
        own, which a captured graph would not run)."""
        return isinstance(getattr(self._policy, "net", None), DistributedDataParallel)

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().load_checkpoint(checkpoint)
        if self._graphs is not None:
            self._graphs.reset()  # the optimizer's state is new tensors: capture again

    @torch.no_grad()
    def _targets(self, batch: NamedArray, old_value: torch.Tensor) -> tuple:
        """``(advantages, returns, mask)``: GAE on the rollout values, or V-trace on the current
        parameters' values and log-probs against the behaviour log-probs.

        A policy that keeps running statistics (observation, return normalisation) updates them
        here, once a batch, and may scale the rewards."""
        normalize = getattr(self._policy, "normalize_batch", None)
        reward = batch.reward.float() if normalize is None else normalize(batch, self.gamma)
        if not self.vtrace:
            return gae_advantages(
                reward,
                old_value,
                batch.done,
                batch.truncated,
                self.gamma,
                self.gae_lambda,
            )
        out: PPOAnalyzedResult = self._analyze(batch)
        returns, advantages, mask = vtrace_targets(
            reward,
            out.value,
            batch.done,
            batch.truncated,
            out.new_log_prob - out.old_log_prob,
            self.gamma,
            self.rho_bar,
            self.c_bar,
            lam=self.gae_lambda,
        )
        return advantages, returns, mask

    def _update(self, mb: NamedArray, adv, ret, mask) -> torch.Tensor:
        """One gradient step; returns the :data:`UPDATE_STATS` as one detached tensor, so that
        the step reads them back once instead of once per statistic and minibatch."""
        out: PPOAnalyzedResult = self._analyze(mb)
        mean = masked_mean(mask)
        if self.normalize_advantages:
            centred = adv - mean(adv)
            adv = centred / (mean(centred.pow(2)).sqrt() + 1e-8)
        log_ratio = out.new_log_prob - out.old_log_prob.detach()
        ratio = log_ratio.exp()
        neg_adv = -adv
        surrogate = torch.max(
            neg_adv * ratio, neg_adv * ratio.clamp(1.0 - self.clip, 1.0 + self.clip)
        )
        policy_loss = mean(surrogate)
        value_error = (out.value - ret).pow(2)
        if self.value_clip is not None:
            old = out.old_value.detach()
            clipped = old + (out.value - old).clamp(-self.value_clip, self.value_clip)
            value_error = torch.max(value_error, (clipped - ret).pow(2))
        value_loss = 0.5 * mean(value_error)
        entropy = mean(out.entropy)
        loss = policy_loss - self.entropy_coef * entropy + self.value_coef * value_loss
        grad_norm = self._gradient_step(loss)
        with torch.no_grad():
            ratio_change = ratio - 1.0
            approx_kl = mean(ratio_change - log_ratio)
            clip_fraction = mean((ratio_change.abs() > self.clip).float())
            row = (policy_loss, value_loss, entropy, approx_kl, clip_fraction, grad_norm, loss)
            return torch.stack(row)

    def _training_pool(self, batch: NamedArray, advantages, returns, mask) -> tuple:
        """What minibatches are drawn from, along dimension 1, as ``(batch, advantages, returns,
        mask)``: the whole ``[T, B]`` segments for a recurrent policy (it unrolls its memory
        through them; the mask marks the steps trained on), or the valid ``(t, b)`` transitions,
        gathered once as ``[1, N]`` in row-major order, for a feed-forward one (mask None: every
        one of them is trained on)."""
        if self._policy.default_policy_state is not None:
            return batch, advantages, returns, mask
        t, b = (i[None] for i in mask[..., 0].nonzero(as_tuple=True))
        return batch[t, b], advantages[t, b], returns[t, b], None

    def _batch_stats(self, advantages, returns, old_value, mask) -> dict[str, float]:
        """The batch's diagnostics. ``explained_variance`` is left out of a batch whose returns
        do not vary (every reward 0 and the values equal, as early in a sparse-reward task):
        it is undefined there, and a NaN among the stats ends the run as a diverged loss."""
        valid = mask.bool()
        ret, val = returns[valid], old_value[valid]
        var = ret.var() if ret.numel() > 1 else torch.tensor(0.0)
        stats = {
            "advantage_mean": float(advantages[valid].mean()) if ret.numel() else 0.0,
            "return_mean": float(ret.mean()) if ret.numel() else 0.0,
            "valid_fraction": float(mask.mean()),
        }
        if var > 0:
            stats["explained_variance"] = float(1.0 - (ret - val).var() / var)
        return stats
