"""Building blocks shared by policies and trainers: distributions, GAE, encoders, init."""

from algorithm.modules.distributions import (
    ActionDistribution,
    Categorical,
    DiagGaussian,
    MultiDiscrete,
)
from algorithm.modules.encoders import CNNEncoder, NatureCNN, ObservationEncoder, mlp
from algorithm.modules.gae import gae_advantages
from algorithm.modules.init import orthogonal_init

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
]
