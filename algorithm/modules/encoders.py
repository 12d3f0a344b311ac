"""Observation encoders: from a gymnasium observation space to a flat feature vector.

:class:`ObservationEncoder` handles every space the built-in environments use:

* ``Box`` with 3 dimensions and dtype uint8: an image, scaled by 1/255 inside the model (so it
  travels and is stored as uint8). Channels come first (``[C, H, W]``, e.g. Atari's stacked
  ``[4, 84, 84]``) when the first dimension is smaller than the last, else last (``[H, W, C]``).
  Images of at least 36x36 go through the Nature-DQN CNN (:class:`NatureCNN`, 512 features);
  smaller ones, for which its 8x8 stride-4 first layer is too coarse, through a small CNN;
* a 3-dimensional ``Box`` of another dtype (a board of piece planes, e.g. connect four's
  ``[6, 7, 2]``): flattened, or, when ``grid_channels`` is given, through 3x3 convolutions that
  keep the board's size (:class:`GridEncoder`);
* any other ``Box``: flattened;
* ``Discrete``: one-hot;
* ``Dict``: each key by the rules above (a Dict in it likewise, recursively), features
  concatenated in key order. The key ``action_mask`` is skipped: it constrains the action
  distribution, it is not an input.

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

ENCODED_SPACES = (
    gym.spaces.Box,
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
)
"""The spaces :class:`ObservationEncoder` reads, alone or in Dicts (nested or not)."""

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


def channels_first(shape: Sequence[int]) -> bool:
    """Whether an image of this shape is ``[C, H, W]`` (else ``[H, W, C]``): channels are the
    smaller of the two outer dimensions."""
    return shape[0] < shape[-1]


NATURE_MIN_SIZE = 36
"""Smallest height and width the Nature CNN takes (its three layers leave 1x1 at 36x36)."""


class _ImageEncoder(nn.Module):
    """uint8 images ``[..., C, H, W]`` or ``[..., H, W, C]`` to features ``[..., F]``: the
    subclass's ``self.net`` sees float ``[N, C, H, W]`` in [0, 1]."""

    net: nn.Module

    def __init__(self, shape: Sequence[int]):
        super().__init__()
        self.channels_first = channels_first(shape)
        channels, height, width = shape if self.channels_first else (shape[2], *shape[:2])
        self.chw = (int(channels), int(height), int(width))

    def _finish(self) -> None:
        with torch.no_grad():
            self.out_features = int(self.net(torch.zeros(1, *self.chw)).shape[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-3]
        x = x.reshape(-1, *x.shape[-3:])
        if not self.channels_first:
            x = x.permute(0, 3, 1, 2)
        if x.device.type == "cpu" and torch.is_grad_enabled():
            # A trainer on the CPU: oneDNN's convolution gradients run faster on channels-last
            # (NHWC) inputs; a pong-ppo trainer step took 0.71x the CPU (BENCHMARKS.md). Not for
            # inference, where small batches got slower, nor on a GPU, where it was not
            # measured. Laid out while still uint8 (a quarter of the bytes); the features are
            # the same in any layout.
            x = x.contiguous(memory_format=torch.channels_last)
        # Scaled here, not in the actor: observations stay uint8 on the wire and in batches.
        x = x.float() * (1.0 / 255.0)
        return self.net(x).reshape(*lead, -1)


class CNNEncoder(_ImageEncoder):
    """Two stride-2 convolutions, for small uint8 images."""

    def __init__(self, shape: Sequence[int], activation: str = "relu"):
        super().__init__(shape)
        act = activation_class(activation)
        self.net = nn.Sequential(
            orthogonal_init(nn.Conv2d(self.chw[0], 16, 3, stride=2, padding=1)),
            act(),
            orthogonal_init(nn.Conv2d(16, 32, 3, stride=2, padding=1)),
            act(),
            nn.Flatten(),
        )
        self._finish()


class NatureCNN(_ImageEncoder):
    """The DQN Nature paper's encoder (Mnih et al., 2015), as Atari PPO uses it: convolutions of
    32 8x8 stride 4, 64 4x4 stride 2, 64 3x3 stride 1, then a 512-unit linear layer, ReLU after
    each; orthogonal initialisation with gain sqrt(2). 84x84 inputs give 3136 conv features."""

    def __init__(self, shape: Sequence[int], features: int = 512):
        super().__init__(shape)
        convs = nn.Sequential(
            orthogonal_init(nn.Conv2d(self.chw[0], 32, 8, stride=4)),
            nn.ReLU(),
            orthogonal_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            orthogonal_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = int(convs(torch.zeros(1, *self.chw)).shape[-1])
        self.net = nn.Sequential(convs, orthogonal_init(nn.Linear(flat, features)), nn.ReLU())
        self._finish()


class GridEncoder(nn.Module):
    """3x3 convolutions of stride 1 that keep the board's height and width, one per entry of
    ``channels``, then flattened: a pattern (three in a row, a threat) is detected by the same
    weights wherever it is on the board, which an MLP over the flat board must learn once per
    place. Boards ``[..., H, W, planes]`` or ``[..., planes, H, W]``, any numeric dtype, taken
    as they are (not scaled)."""

    def __init__(self, shape: Sequence[int], channels: Sequence[int], activation: str = "relu"):
        super().__init__()
        self.channels_first = channels_first(shape)
        planes, height, width = shape if self.channels_first else (shape[2], *shape[:2])
        act = activation_class(activation)
        layers: list[nn.Module] = []
        for out in channels:
            layers += [orthogonal_init(nn.Conv2d(planes, out, 3, padding=1)), act()]
            planes = out
        self.net = nn.Sequential(*layers, nn.Flatten())
        self.out_features = int(planes * height * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-3]
        x = x.reshape(-1, *x.shape[-3:]).float()
        if not self.channels_first:
            x = x.permute(0, 3, 1, 2)
        return self.net(x).reshape(*lead, -1)


def image_encoder(shape: Sequence[int]) -> _ImageEncoder:
    """The Nature CNN for images of at least 36x36, the small CNN for smaller ones."""
    height, width = shape[1:] if channels_first(shape) else shape[:2]
    if min(height, width) >= NATURE_MIN_SIZE:
        return NatureCNN(shape)
    return CNNEncoder(shape)


class _Flat(nn.Module):
    """A Box's or a MultiBinary's values as they are, flattened."""

    def __init__(self, space: gym.spaces.Box | gym.spaces.MultiBinary):
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


class _MultiOneHot(nn.Module):
    """A MultiDiscrete's components, each one-hot, side by side: a component is a category
    (a cell's contents, a card), not a quantity, so its values are not scaled as a Box's."""

    def __init__(self, space: gym.spaces.MultiDiscrete):
        super().__init__()
        self.ndim = len(space.shape)
        self.nvec = [int(n) for n in np.asarray(space.nvec).reshape(-1)]
        self.start = [int(s) for s in np.asarray(space.start).reshape(-1)]
        self.out_features = sum(self.nvec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[: x.dim() - self.ndim]
        x = x.long().reshape(*lead, len(self.nvec))
        return torch.cat(
            [nn.functional.one_hot(x[..., i] - s, n) for i, (n, s) in
             enumerate(zip(self.nvec, self.start, strict=True))], dim=-1,
        ).float()  # fmt: skip


class _DictEncoder(nn.Module):
    """A Dict nested in the observation's Dict: its keys' features side by side, in key
    order, by the same rules as the top level's."""

    def __init__(
        self, space: gym.spaces.Dict, key: str, grid_channels: Sequence[int], activation: str
    ):
        super().__init__()
        self.keys, self.parts = _key_parts(space, key, grid_channels, activation)
        self.out_features = sum(p.out_features for p in self.parts.values())

    def forward(self, obs: Any) -> torch.Tensor:
        return torch.cat([self.parts[k](obs[k]) for k in self.keys], dim=-1)


def _key_parts(
    space: gym.spaces.Dict, key: str, grid_channels: Sequence[int], activation: str
) -> tuple[list[str], nn.ModuleDict]:
    """A Dict's keys in order (``action_mask`` left out: it is no input) and an encoder each;
    ``key`` is the Dict's own place, for messages (``""`` at the top)."""
    keys = [k for k in space.spaces if k != ACTION_MASK_KEY]
    return keys, nn.ModuleDict({
        k: _key_encoder(space.spaces[k], f"{key}.{k}" if key else k, grid_channels, activation)
        for k in keys
    })  # fmt: skip


def _key_encoder(
    space: gym.Space, key: str, grid_channels: Sequence[int] = (), activation: str = "relu"
) -> nn.Module:
    if is_image_space(space):
        return image_encoder(space.shape)
    if grid_channels and isinstance(space, gym.spaces.Box) and len(space.shape) == 3:
        return GridEncoder(space.shape, grid_channels, activation)
    if isinstance(space, (gym.spaces.Box, gym.spaces.MultiBinary)):
        return _Flat(space)
    if isinstance(space, gym.spaces.Discrete):
        return _OneHot(space)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return _MultiOneHot(space)
    if isinstance(space, gym.spaces.Dict):  # a Dict inside a Dict (a Tuple of Tuples, keyed)
        return _DictEncoder(space, key, grid_channels, activation)
    if isinstance(space, gym.spaces.Tuple):  # what a gymnasium env's adapter does for it
        raise TypeError(
            f"observation{f' key {key!r}' if key else ''}: a Tuple space ({space}); declare a "
            "Dict of its parts instead, keyed by name (gymnasium environments' Tuples are "
            "keyed item0, item1, ... for you: api.spaces.dict_of_tuples)"
        )
    raise TypeError(
        f"observation{f' key {key!r}' if key else ''}: unsupported space {space}; use Box, "
        "Discrete, MultiDiscrete, MultiBinary or a Dict of them, nested or not (or write your own "
        "encoder)"
    )


class ObservationEncoder(nn.Module):
    """Observation (array, dict or NamedArray of tensors ``[N, ...]``) to features ``[N, F]``.

    ``grid_channels``: the convolutions of :class:`GridEncoder` for 3-dimensional non-image
    boxes (boards); empty: such boxes are flattened."""

    def __init__(
        self,
        space: gym.Space,
        hidden_sizes: Sequence[int],
        activation: str = "tanh",
        grid_channels: Sequence[int] = (),
    ):
        super().__init__()
        grid = tuple(grid_channels)
        if isinstance(space, gym.spaces.Dict):
            self.keys, self.parts = _key_parts(space, "", grid, activation)
        else:
            self.keys = []
            self.parts = nn.ModuleDict({"obs": _key_encoder(space, "", grid, activation)})
        width = sum(p.out_features for p in self.parts.values())
        self.trunk = mlp(width, hidden_sizes, activation)
        self.out_features = hidden_sizes[-1] if hidden_sizes else width

    def forward(self, obs: Any) -> torch.Tensor:
        if self.keys:
            features = torch.cat([self.parts[k](obs[k]) for k in self.keys], dim=-1)
        else:
            features = self.parts["obs"](obs)
        return self.trunk(features)
