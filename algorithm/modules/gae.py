"""Generalised advantage estimation over time-major segments that overlap by one step.

The convention (see ``api.policy.SampleBatch``): step ``t`` holds ``obs[t]``, the reward that led
to it, and whether it is terminal (``done``) or cut short (``truncated``). Its action is trained on
only when ``t < T - 1`` and the step is neither done nor truncated. Then::

    delta[t] = reward[t+1] + gamma * V[t+1] * (1 - done[t+1]) - V[t]
    A[t]     = delta[t] + gamma * lambda * (1 - done[t+1]) * (1 - truncated[t+1]) * A[t+1]

with ``A[T-1] = 0`` (the last step only bootstraps through ``V[T-1]``). When ``truncated[t+1]``
the actor still asked the policy about the real final observation, so ``V[t+1]`` bootstraps the
cut-short episode exactly.
"""

from __future__ import annotations

import torch


def gae_advantages(
    reward: torch.Tensor,
    value: torch.Tensor,
    done: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Advantages, returns and the loss mask, all ``[T, B, 1]`` like the inputs.

    ``reward`` and ``value`` are float tensors, ``done`` and ``truncated`` bool (or 0/1) tensors.
    Rows ``T-1`` and every done or truncated step have advantage 0, return ``V`` and mask 0.
    The loop runs backwards over time only; each iteration is vectorised over the batch.
    """
    value = value.float()
    done_f = done.float()
    ended = (done.bool() | truncated.bool()).float()
    steps = reward.shape[0]
    advantages = torch.zeros_like(value)
    next_advantage = torch.zeros_like(value[0])
    for t in range(steps - 2, -1, -1):
        not_done = 1.0 - done_f[t + 1]
        delta = reward[t + 1] + gamma * value[t + 1] * not_done - value[t]
        carry = gamma * gae_lambda * not_done * (1.0 - truncated[t + 1].float())
        next_advantage = (delta + carry * next_advantage) * (1.0 - ended[t])
        advantages[t] = next_advantage
    mask = 1.0 - ended
    mask[-1] = 0.0
    return advantages, advantages + value, mask
