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
    Everything but the recursion is computed for all steps at once; the loop that remains runs
    backwards over time, one multiply and one add per step, each vectorised over the batch.
    """
    value = value.float()
    done, truncated = done.bool(), truncated.bool()
    mask = (~(done | truncated)).float()
    mask[-1] = 0.0  # the last step only bootstraps
    not_done, not_truncated = (~done).float(), (~truncated).float()
    # All but the recursion, for every t < T - 1 at once. The mask is 0 or 1, so folding it
    # into both terms gives exactly (delta + carry * A[t+1]) * mask.
    delta = reward[1:] + gamma * value[1:] * not_done[1:] - value[:-1]
    carry = gamma * gae_lambda * not_done[1:] * not_truncated[1:]
    step_delta, step_carry = (delta * mask[:-1]).unbind(0), (carry * mask[:-1]).unbind(0)
    next_advantage = torch.zeros_like(value[0])
    backwards = []
    for t in range(reward.shape[0] - 2, -1, -1):
        next_advantage = step_delta[t] + step_carry[t] * next_advantage
        backwards.append(next_advantage)
    advantages = torch.stack([*backwards[::-1], torch.zeros_like(value[0])])
    return advantages, advantages + value, mask
