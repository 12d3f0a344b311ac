"""Running mean and variance of observations and of returns, kept as module buffers.

The statistics are buffers of an ``nn.Module``, so they are part of the policy's state dict: a
checkpoint carries them, policy workers receive them with the weights, and evaluation and
``load_policy`` normalise exactly as training did. Trainers update them once per batch
(``ActorCriticPolicy.normalize_batch``), never at acting time: policy workers are many and
their updates would be lost.
"""

from __future__ import annotations

import torch
from torch import nn


class RunningMeanStd(nn.Module):
    """Mean and variance of everything :meth:`update` has seen (Chan's parallel formula)."""

    def __init__(self, shape: tuple[int, ...] = (), clip: float = 10.0, epsilon: float = 1e-8):
        super().__init__()
        self.clip, self.epsilon = clip, epsilon
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Add a batch ``[N, *shape]``."""
        x = x.detach().to(torch.float64).reshape(-1, *self.mean.shape)
        if x.shape[0] == 0:
            return
        mean, var, n = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta, total = mean - self.mean, self.count + n
        m2 = self.var * self.count + var * n + delta**2 * self.count * n / total
        self.mean.add_(delta * n / total)
        self.var.copy_(m2 / total)
        self.count.fill_(float(total))

    def std(self) -> torch.Tensor:
        return torch.sqrt(self.var + self.epsilon)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """``(x - mean) / std``, clipped to ``[-clip, clip]``; float32 out."""
        mean, std = self.mean.to(torch.float32), self.std().to(torch.float32)
        return torch.clamp((x.float() - mean) / std, -self.clip, self.clip)


def discounted_returns(reward: torch.Tensor, ended: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted sums of rewards ``[T, B, 1]`` from the start of each segment or episode:
    the quantity whose spread return normalisation divides rewards by."""
    out = torch.empty_like(reward, dtype=torch.float64)
    running = torch.zeros_like(reward[0], dtype=torch.float64)
    for t in range(reward.shape[0]):
        running = running * gamma + reward[t].double()
        out[t] = running
        running = running * (~ended[t].bool()).double()
    return out
