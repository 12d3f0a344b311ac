"""Action distributions with a batch of parameters in, actions and joint log-probabilities out.

Every ``log_prob`` and ``entropy`` has a trailing dimension of 1 (``[N, 1]``): for a
multi-component action (MultiDiscrete, a Box of several dimensions) it is the joint value, the sum
over components, because PPO's ratio is about the whole action. Illegal actions of a masked
Categorical get a logit so low that they are never sampled nor chosen by ``mode``.
"""

from __future__ import annotations

import abc
import math

import gymnasium as gym
import numpy as np
import torch

_ILLEGAL_LOGIT = -1e8  # finite, so that entropy's p * log p stays 0 * finite = 0


class ActionDistribution(abc.ABC):
    """A batch of distributions over actions."""

    @abc.abstractmethod
    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        """A random action per row."""

    @abc.abstractmethod
    def mode(self) -> torch.Tensor:
        """The most likely action per row (what evaluation plays)."""

    @abc.abstractmethod
    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        """``[N, 1]``: joint log-probability of ``action``."""

    @abc.abstractmethod
    def entropy(self) -> torch.Tensor:
        """``[N, 1]``: joint entropy."""


class Categorical(ActionDistribution):
    """One discrete choice per row; actions are int64 ``[N]``. ``mask`` ``[N, n]`` is True where
    the action is legal (a row with no legal action falls back to all legal)."""

    def __init__(self, logits: torch.Tensor, mask: torch.Tensor | None = None):
        if mask is not None:
            mask = mask.bool()
            mask = mask | ~mask.any(dim=-1, keepdim=True)
            logits = logits.masked_fill(~mask, _ILLEGAL_LOGIT)
        self.logits = torch.log_softmax(logits, dim=-1)  # normalised: log-probabilities

    def sample(self, generator=None):
        probs = self.logits.exp()
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

    def mode(self):
        return self.logits.argmax(dim=-1)

    def log_prob(self, action):
        return self.logits.gather(-1, action.long().reshape(-1, 1))

    def entropy(self):
        return -(self.logits.exp() * self.logits).sum(dim=-1, keepdim=True)


class MultiDiscrete(ActionDistribution):
    """Independent discrete choices; ``logits`` ``[N, sum(nvec)]``, actions int64 ``[N, k]``.

    ``mask`` (optional) is ``[N, sum(nvec)]``, the per-component masks laid end to end.
    """

    def __init__(self, logits: torch.Tensor, nvec: list[int], mask: torch.Tensor | None = None):
        masks = mask.split(nvec, dim=-1) if mask is not None else [None] * len(nvec)
        self.parts = [
            Categorical(lg, m) for lg, m in zip(logits.split(nvec, dim=-1), masks, strict=True)
        ]

    def sample(self, generator=None):
        return torch.stack([p.sample(generator) for p in self.parts], dim=-1)

    def mode(self):
        return torch.stack([p.mode() for p in self.parts], dim=-1)

    def log_prob(self, action):
        action = action.reshape(-1, len(self.parts))
        return sum(p.log_prob(action[:, i]) for i, p in enumerate(self.parts))

    def entropy(self):
        return sum(p.entropy() for p in self.parts)


class DiagGaussian(ActionDistribution):
    """A diagonal Gaussian ``[N, d]``; ``log_std`` broadcasts (state-independent: ``[d]``).

    ``sample`` returns the raw, unclipped value: its log-probability is what PPO needs. Clipping
    to the action space's bounds is the environment adapter's job.
    """

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor):
        self.mean = mean
        self.log_std = log_std.expand_as(mean)

    def sample(self, generator=None):
        noise = torch.randn(
            self.mean.shape, generator=generator, device=self.mean.device, dtype=self.mean.dtype
        )
        return self.mean + noise * self.log_std.exp()

    def mode(self):
        return self.mean

    def log_prob(self, action):
        action = action.reshape(self.mean.shape)
        z = (action - self.mean) * torch.exp(-self.log_std)
        per_dim = -0.5 * z.pow(2) - self.log_std - 0.5 * math.log(2 * math.pi)
        return per_dim.sum(dim=-1, keepdim=True)

    def entropy(self):
        per_dim = 0.5 + 0.5 * math.log(2 * math.pi) + self.log_std
        return per_dim.sum(dim=-1, keepdim=True)


class Hybrid(ActionDistribution):
    """Discrete choices and continuous values drawn together (a :class:`~api.spaces.HybridBox`):
    actions float32 ``[N, k + d]``, the ``k`` choices' indices first; the joint log-probability
    and entropy are the parts' sums, as for any multi-component action."""

    def __init__(self, choices: MultiDiscrete, values: DiagGaussian):
        self.choices, self.values = choices, values
        self.k = len(choices.parts)

    @classmethod
    def of(cls, params: torch.Tensor, nvec: list[int], log_std: torch.Tensor, mask=None):
        """From a network's parameters ``[N, sum(nvec) + d]``: logits, then the means."""
        logits = sum(nvec)
        choices = MultiDiscrete(params[:, :logits], nvec, mask)
        return cls(choices, DiagGaussian(params[:, logits:], log_std))

    def sample(self, generator=None):
        picked = self.choices.sample(generator).to(self.values.mean.dtype)
        return torch.cat([picked, self.values.sample(generator)], dim=-1)

    def mode(self):
        return torch.cat([self.choices.mode().to(self.values.mean.dtype), self.values.mode()], -1)

    def log_prob(self, action):
        action = action.reshape(len(self.values.mean), -1)
        picked = torch.round(action[:, : self.k]).long()
        return self.choices.log_prob(picked) + self.values.log_prob(action[:, self.k :])

    def entropy(self):
        return self.choices.entropy() + self.values.entropy()


def as_choices(space: gym.Space) -> gym.Space:
    """A MultiBinary action space as the MultiDiscrete of as many two-way choices, which a
    policy acts in through :class:`MultiDiscrete` (a Categorical over {0, 1} each: a
    Bernoulli); any other space as it is."""
    if isinstance(space, gym.spaces.MultiBinary):
        return gym.spaces.MultiDiscrete(np.full(space.shape, 2, dtype=np.int64))
    return space
