"""Building blocks shared by policies and trainers: distributions, GAE, V-trace, encoders, init."""

from algorithm.modules.distributions import (
    ActionDistribution,
    Categorical,
    DiagGaussian,
    MultiDiscrete,
)
from algorithm.modules.encoders import CNNEncoder, NatureCNN, ObservationEncoder, mlp
from algorithm.modules.gae import gae_advantages
from algorithm.modules.init import orthogonal_init
from algorithm.modules.policy_lag import policy_lag_stats
from algorithm.modules.vtrace import vtrace_targets

__all__ = [
    "ActionDistribution",
    "CNNEncoder",
    "Categorical",
    "DiagGaussian",
    "MultiDiscrete",
    "NatureCNN",
    "ObservationEncoder",
    "gae_advantages",
    "mlp",
    "orthogonal_init",
    "policy_lag_stats",
    "vtrace_targets",
]
