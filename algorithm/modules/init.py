"""Orthogonal initialisation, the usual choice for on-policy actor-critic networks."""

from __future__ import annotations

import math

from torch import nn


def orthogonal_init(layer: nn.Module, gain: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    """Orthogonal weights scaled by ``gain`` and constant biases, for Linear / Conv / GRU layers.

    Policy heads use a small gain (0.01) so the first policy is close to uniform; value heads use
    gain 1; hidden layers sqrt(2). Returns the layer so it can wrap a constructor call.
    """
    for name, param in layer.named_parameters(recurse=False):
        if "weight" in name and param.dim() >= 2:
            nn.init.orthogonal_(param, gain)
        elif "bias" in name:
            nn.init.constant_(param, bias)
    return layer
