"""Observation encoders: from a gymnasium observation space to a flat feature vector.

:class:`ObservationEncoder` handles every space the built-in environments use:

* ``Box`` with 3 dimensions and dtype uint8: an image ``[H, W, C]``, through a small CNN;
* any other ``Box``: flattened;
* ``Discrete``: one-hot;
* ``Dict``: each key by the rules above, features concatenated in key order. The key
  ``action_mask`` is skipped: it constrains the action distribution, it is not an input.

The per-key features then go through an MLP of ``hidden_sizes``; ``out_features`` is its width.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from algorithm.modules.init import orthogonal_init

ACTION_MASK_KEY = "action_mask"

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "gelu": nn.GELU}


def activation_class(name: str) -> type[nn.Module]:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation '{name}'; choose one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def mlp(in_features: int, hidden_sizes: Sequence[int], activation: str = "tanh") -> nn.Sequential:
    """Linear + activation layers, orthogonally initialised with gain sqrt(2)."""
    layers: list[nn.Module] = []
    act = activation_class(activation)
    for size in hidden_sizes:
        layers += [orthogonal_init(nn.Linear(in_features, size)), act()]
        in_features = size
    return nn.Sequential(*layers)


def is_image_space(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and space.dtype == np.uint8


class CNNEncoder(nn.Module):
    """Two stride-2 convolutions for small ``[H, W, C]`` uint8 images (scaled to [0, 1])."""

    def __init__(self, shape: tuple[int, int, int], activation: str = "relu"):
        super().__init__()
        act = activation_class(activation)
        height, width, channels = shape
        self.net = nn.Sequential(
            orthogonal_init(nn.Conv2d(channels, 16, 3, stride=2, padding=1)),
            act(),
            orthogonal_init(nn.Conv2d(16, 32, 3, stride=2, padding=1)),
            act(),
            nn.Flatten(),
        )
        with torch.no_grad():
            self.out_features = self.net(torch.zeros(1, channels, height, width)).shape[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-3]
        x = x.reshape(-1, *x.shape[-3:]).permute(0, 3, 1, 2).float() / 255.0
        return self.net(x).reshape(*lead, -1)


class _Flat(nn.Module):
    def __init__(self, space: gym.spaces.Box):
        super().__init__()
        self.ndim = len(space.shape)
        self.out_features = int(np.prod(space.shape)) if space.shape else 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[: x.dim() - self.ndim]
        return x.float().reshape(*lead, self.out_features)


class _OneHot(nn.Module):
    def __init__(self, space: gym.spaces.Discrete):
        super().__init__()
        self.n, self.start = int(space.n), int(space.start)
        self.out_features = self.n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.long()
        if x.dim() > 1 and x.shape[-1] == 1:
            x = x.squeeze(-1)
        return nn.functional.one_hot(x - self.start, self.n).float()


def _key_encoder(space: gym.Space, key: str) -> nn.Module:
    if is_image_space(space):
        return CNNEncoder(space.shape)
    if isinstance(space, gym.spaces.Box):
        return _Flat(space)
    if isinstance(space, gym.spaces.Discrete):
        return _OneHot(space)
    raise TypeError(
        f"observation{f' key {key!r}' if key else ''}: unsupported space {space}; use Box, "
        "Discrete or a Dict of them (or write your own encoder)"
    )


class ObservationEncoder(nn.Module):
    """Observation (array, dict or NamedArray of tensors ``[N, ...]``) to features ``[N, F]``."""

    def __init__(self, space: gym.Space, hidden_sizes: Sequence[int], activation: str = "tanh"):
        super().__init__()
        if isinstance(space, gym.spaces.Dict):
            self.keys = [k for k in space.spaces if k != ACTION_MASK_KEY]
            self.parts = nn.ModuleDict({k: _key_encoder(space.spaces[k], k) for k in self.keys})
        else:
            self.keys = []
            self.parts = nn.ModuleDict({"obs": _key_encoder(space, "")})
        width = sum(p.out_features for p in self.parts.values())
        self.trunk = mlp(width, hidden_sizes, activation)
        self.out_features = hidden_sizes[-1] if hidden_sizes else width

    def forward(self, obs: Any) -> torch.Tensor:
        if self.keys:
            features = torch.cat([self.parts[k](obs[k]) for k in self.keys], dim=-1)
        else:
            features = self.parts["obs"](obs)
        return self.trunk(features)
