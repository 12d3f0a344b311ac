"""V-trace (Espeholt et al., 2018, "IMPALA"): off-policy value targets and policy-gradient
advantages for samples that an older policy (the behaviour policy ``mu``) chose.

Same segment convention as :mod:`algorithm.modules.gae` (see ``api.policy.SampleBatch``): step
``t`` holds ``obs[t]``, the reward that led to it and whether it is terminal (``done``) or cut
short (``truncated``); its action is trained on only when ``t < T - 1`` and the step is neither
done nor truncated. With ``rho[t] = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))`` and
``c[t] = lambda * min(c_bar, pi / mu)``, for every such step::

    delta[t] = rho[t] * (reward[t+1] + gamma * V[t+1] * (1 - done[t+1]) - V[t])
    vs[t]    = V[t] + delta[t] + gamma * c[t] * (1 - done[t+1]) * (1 - truncated[t+1])
                                 * (vs[t+1] - V[t+1])
    pg_adv[t] = rho_pg[t] * (reward[t+1] + gamma * vs[t+1] * (1 - done[t+1]) - V[t])

and ``vs[t] = V[t]``, ``pg_adv[t] = 0`` on the steps that are not trained on. So ``vs[T-1] =
V[T-1]``: the segment's last step only bootstraps, and a truncated step bootstraps through the
value of the real final observation, exactly as GAE does. With ``pi = mu`` (ratios 1) and
``rho_bar, c_bar >= 1`` V-trace is the on-policy lambda-return: ``vs`` equals GAE's returns.
"""

from __future__ import annotations

import torch


def vtrace_targets(
    reward: torch.Tensor,
    value: torch.Tensor,
    done: torch.Tensor,
    truncated: torch.Tensor,
    log_rho: torch.Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float | None = None,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Value targets ``vs``, policy-gradient advantages and the loss mask, all ``[T, B, 1]``.

    ``log_rho`` is ``log pi(a_t|x_t) - log mu(a_t|x_t)`` (target minus behaviour log-prob) for
    every step; its value on steps that are not trained on is ignored, whatever it is (inf, nan).
    ``pg_rho_bar`` clips the ratio in the advantages (default: ``rho_bar``). Call under
    ``torch.no_grad()`` or on detached inputs: the targets are constants of the loss.
    """
    value = value.float()
    done, truncated = done.bool(), truncated.bool()
    valid = ~(done | truncated)
    valid[-1] = False  # the last step only bootstraps
    mask = valid.float()
    # where, not a product: a masked-out ratio may be inf or nan (an action never taken)
    ratio = torch.where(valid, log_rho.float(), torch.zeros_like(value)).exp()
    rho = ratio.clamp(max=rho_bar) * mask
    pg_rho = ratio.clamp(max=rho_bar if pg_rho_bar is None else pg_rho_bar) * mask
    c = lam * ratio.clamp(max=c_bar) * mask
    not_done = (~done).float()
    alive = not_done * (~truncated).float()
    # Everything but the recursion for all t < T - 1 at once; the loop runs backwards over time,
    # one multiply and one add per step, each vectorised over the batch.
    delta = (rho[:-1] * (reward[1:] + gamma * value[1:] * not_done[1:] - value[:-1])).unbind(0)
    carry = (gamma * c[:-1] * alive[1:]).unbind(0)
    next_correction = torch.zeros_like(value[0])  # vs[T-1] - V[T-1]
    backwards = [next_correction]
    for t in range(reward.shape[0] - 2, -1, -1):
        next_correction = delta[t] + carry[t] * next_correction
        backwards.append(next_correction)
    vs = value + torch.stack(backwards[::-1])
    pg_adv = torch.zeros_like(value)
    pg_adv[:-1] = pg_rho[:-1] * (reward[1:] + gamma * vs[1:] * not_done[1:] - value[:-1])
    return vs, pg_adv, mask
