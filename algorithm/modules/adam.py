"""Adam as the trainers build it: the fastest implementation this torch has for the
parameters, and checkpoints that load whichever implementation wrote them.

All of torch's implementations (the per-parameter loop, ``foreach``, ``fused``) compute the same
update up to float rounding. For the small networks of CartPole-sized tasks the per-parameter
loop costs more than the update itself: measured for cartpole-dqn's network (8 tensors, 4.5k
values) on one core, 202 us a step for the loop, 168 for ``foreach`` and 60 for ``fused``.
"""

from __future__ import annotations

from typing import Any

import torch


def adam_impl(params: list[torch.Tensor], fused: bool) -> dict[str, bool]:
    """How Adam runs: ``foreach`` (a few kernels for all parameters), or ``fused`` (one) when
    asked and this torch has it for the parameters' device and dtype (CPU since torch 2.4).

    With torch 2.13, building any Adam imports torch's compiler stack (0.97-0.99 s on an idle
    core, whichever implementation: measured), and the first step then takes 1-3 ms, so
    ``fused`` (and its probe) costs nothing extra at start-up. The off-policy trainers (DQN,
    SAC) ask for it. PPO and IMPALA keep ``foreach`` unless asked (``fused_adam``): their
    figures in BENCHMARKS.md and their learning tests were measured with it. Fused is faster
    (cartpole-ppo's two 64x64 bodies: 73 us a step against 218, on one core) but rounds
    differently, and a serial run follows another path: with fused as PPO's default,
    the Pendulum learning check (then on pendulum-ppo's earlier config, discount 0.9 and raw
    rewards) had a seed train to -200 and play -360 greedily (2026-11-27).
    """
    if not fused:
        return {"fused": False, "foreach": True}
    for dtype, device in {(p.dtype, p.device) for p in params}:
        probe = torch.zeros(1, dtype=dtype, device=device, requires_grad=True)
        probe.grad = torch.zeros_like(probe)
        try:
            # older torch refuses in the constructor, newer ones on the first step
            torch.optim.Adam([probe], fused=True).step()
        except RuntimeError:
            return {"fused": False, "foreach": True}
    return {"fused": True, "foreach": False}


def make_adam(params: list[torch.Tensor], fused: bool, **settings: Any) -> torch.optim.Adam:
    """An Adam over ``params`` run by :func:`adam_impl`; ``settings``: ``lr``, ``eps``, ..."""
    return torch.optim.Adam(params, **settings, **adam_impl(params, fused))


def load_adam_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a checkpoint's Adam state, keeping the implementation this optimizer runs (the
    checkpoint may come from another torch or device, or from a run that used another one).
    Set before loading: fused and capturable Adam need their step counters on the device."""
    impl = {k: optimizer.param_groups[0][k] for k in ("fused", "foreach", "capturable")}
    groups = [{**group, **impl} for group in state["param_groups"]]
    optimizer.load_state_dict({**state, "param_groups": groups})
