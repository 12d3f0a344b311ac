"""Policy lag: how stale the samples a trainer learns from are.

Every step of a ``SampleBatch`` carries ``policy_version``, the version of the parameters that
chose its action (the policy worker's at that moment). A trainer about to update from version
``v`` learns from actions that are ``v - policy_version`` versions old; on-policy methods (PPO)
degrade as that grows, V-trace corrects for it.
"""

from __future__ import annotations

import torch


def policy_lag_stats(
    current_version: int, sample_versions: torch.Tensor | None, mask: torch.Tensor
) -> dict[str, float]:
    """How many versions behind the current parameters the trained-on actions were chosen:
    ``policy_lag_mean`` and ``policy_lag_max`` over the steps where ``mask`` is set.

    Call before the step's update (``current_version`` is the version being trained from).
    Samples without versions give no statistics.
    """
    if sample_versions is None:
        return {}
    lag = current_version - sample_versions.float()[mask.bool()]
    if not lag.numel():
        return {"policy_lag_mean": 0.0, "policy_lag_max": 0.0}
    return {"policy_lag_mean": float(lag.mean()), "policy_lag_max": float(lag.max())}
