"""A numpy copy of a feed-forward actor-critic or Q network, for acting on the CPU.

Why: a policy worker answers thousands of small requests a second, and for a small network almost
all of a torch forward pass is per-operation dispatch, not arithmetic. Measured on this project's
2-core VM for cartpole-ppo's 2x64 actor and critic at 32 rows: 98 us a forward pass through torch
with warm caches and 253 us with cold ones (a policy worker wakes for each request, its caches
cold from the other processes), against 26 us and 63 us through numpy; ``torch.multinomial``
alone took 19-107 us. Board games pay the same toll many times over: connect four's network
(a Dict observation, two 3x3 convolutions over the board, a mirror pass) runs some forty torch
operations for a handful of rows. So :class:`~algorithm.actor_critic_policies.policy.
ActorCriticPolicy` acts through this copy where it applies, and trains through torch:

- observations: Box and MultiBinary (flattened), Discrete and MultiDiscrete (one-hot),
  boards through ``grid_channels``
  convolutions (as matrix products over 3x3 patches), and Dicts of these (action masks
  included); not images (their strided CNNs stay torch's);
- MLP trunks of ``tanh`` or ``relu``, no GRU, the CPU;
- the mirror of a symmetric network (:mod:`algorithm.modules.mirror`): the same two passes in
  one batch and the same fold.

:class:`~algorithm.q_policies.policy.QPolicy` acts through :class:`NumpyQNet` the same way: on
cartpole-dqn's 2-core runs its policy worker took a third of a core, mostly torch's dispatch.

The copy is exact up to float rounding: the same layers, the same log-softmax, the same masked
logit. Sampling draws from its own numpy generator (Gumbel-max for categoricals), so actions
follow the same distribution as the torch path, not the same random stream.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from algorithm.modules.encoders import (
    ACTION_MASK_KEY,
    GridEncoder,
    ObservationEncoder,
    _DictEncoder,
    _Flat,
    _MultiOneHot,
    _OneHot,
)

_ACTIVATIONS = {
    nn.Tanh: np.tanh,
    nn.ReLU: lambda x: np.maximum(x, 0.0, out=x),
}
ILLEGAL_LOGIT = np.float32(-1e8)
"""What a masked action's logit becomes: the torch path's value
(:mod:`algorithm.modules.distributions`)."""


def supports(net: nn.Module, observation_space: gym.Space, device: torch.device) -> bool:
    """Whether :class:`NumpyActorCritic` can stand in for ``net`` (an ``ActorCriticNet``)."""
    if device.type != "cpu":
        return False
    bodies = [b for b in (net.actor_body, net.critic_body) if b is not None]
    return all(b.rnn is None and _encoder_supported(b.encoder) for b in bodies)


def _encoder_supported(encoder: ObservationEncoder) -> bool:
    parts_ok = all(_part_layers(part) is not None for part in encoder.parts.values())
    return parts_ok and _mlp_layers(encoder.trunk) is not None


def _part_layers(part: nn.Module) -> list[tuple[nn.Module, Any]] | None:
    """A key's encoder as the numpy path runs it: [] for a flat box or a one-hot, the (conv,
    activation) pairs of a board's convolutions; None for what only torch runs (images)."""
    if isinstance(part, (_Flat, _OneHot, _MultiOneHot)):
        return []
    if isinstance(part, _DictEncoder):  # a Dict in the Dict: numpy if all its keys are
        return [] if all(_part_layers(p) is not None for p in part.parts.values()) else None
    if isinstance(part, GridEncoder):
        modules = [m for m in part.net if not isinstance(m, nn.Flatten)]
        return _pairs(modules, nn.Conv2d)
    return None


def _mlp_layers(trunk: nn.Sequential) -> list[tuple[nn.Linear, Any]] | None:
    """The trunk as (linear, numpy activation) pairs; None if it is not a plain MLP."""
    return _pairs(list(trunk), nn.Linear)


def _pairs(modules: list[nn.Module], layer: type) -> list[tuple[Any, Any]] | None:
    pairs = []
    for module, act in zip(modules[::2], modules[1::2], strict=False):
        if not isinstance(module, layer) or type(act) not in _ACTIVATIONS:
            return None
        pairs.append((module, _ACTIVATIONS[type(act)]))
    return pairs if 2 * len(pairs) == len(modules) else None


def _weights(linear: nn.Linear) -> tuple[np.ndarray, np.ndarray]:
    """``x @ w + b`` form: the transpose copied contiguous, so the matmul reads rows."""
    w = linear.weight.detach().cpu().numpy().T.copy()
    return w, linear.bias.detach().cpu().numpy().copy()


def _conv_weights(conv: nn.Conv2d) -> tuple[np.ndarray, np.ndarray]:
    """A 3x3 convolution as ``patches @ w + b``: ``w`` is ``[9 * in, out]``, rows ordered as
    :func:`_patches` lays a patch out (row offset, column offset, then input channel)."""
    weight = conv.weight.detach().cpu().numpy()  # [out, in, 3, 3]
    w = weight.transpose(2, 3, 1, 0).reshape(-1, weight.shape[0]).copy()
    return w, conv.bias.detach().cpu().numpy().copy()


class _Part:
    """One observation key's encoder in numpy: ``[N, ...]`` to features ``[N, F]``."""

    def __init__(self, module: nn.Module, layers: list[tuple[Any, Any]]):
        self.module = module
        self.convs = [(*_conv_weights(conv), act) for conv, act in layers]
        if isinstance(module, _DictEncoder):
            self.inner = {k: _Part(m, _part_layers(m)) for k, m in module.parts.items()}

    def __call__(self, x: np.ndarray) -> np.ndarray:
        module = self.module
        if isinstance(module, _DictEncoder):
            return np.concatenate([self.inner[k](x[k]) for k in module.keys], axis=-1)
        if isinstance(module, _OneHot):
            index = np.asarray(x, dtype=np.int64).reshape(len(x)) - module.start
            return np.eye(module.n, dtype=np.float32)[index]
        if isinstance(module, _Flat):
            return np.asarray(x, dtype=np.float32).reshape(len(x), module.out_features)
        if isinstance(module, _MultiOneHot):
            index = np.asarray(x, dtype=np.int64).reshape(len(x), len(module.nvec))
            return np.concatenate(
                [np.eye(n, dtype=np.float32)[index[:, i] - start]
                 for i, (n, start) in enumerate(zip(module.nvec, module.start, strict=True))],
                axis=-1,
            )  # fmt: skip
        board = np.asarray(x, dtype=np.float32)  # a GridEncoder: boards [N, H, W, C]
        if module.channels_first:
            board = board.transpose(0, 2, 3, 1)
        for w, b, act in self.convs:
            board = act(_patches(board) @ w + b)
        # torch flattens [N, C, H, W]: channel by channel.
        return board.transpose(0, 3, 1, 2).reshape(len(board), -1)


def _patches(board: np.ndarray) -> np.ndarray:
    """``[N, H, W, 9 * C]``: each cell's 3x3 neighbourhood (zero-padded at the edges)."""
    n, h, w, c = board.shape
    padded = np.zeros((n, h + 2, w + 2, c), dtype=np.float32)
    padded[:, 1:-1, 1:-1] = board
    return np.concatenate(
        [padded[:, dy : dy + h, dx : dx + w] for dy in range(3) for dx in range(3)], axis=-1
    )


class _Body:
    """An encoder and its MLP trunk in numpy."""

    def __init__(self, body: nn.Module):
        encoder = body.encoder
        self.keys = list(encoder.keys)
        self.parts = {k: _Part(m, _part_layers(m)) for k, m in encoder.parts.items()}
        self.trunk = [(*_weights(linear), act) for linear, act in _mlp_layers(encoder.trunk)]

    def __call__(self, obs: Any) -> np.ndarray:
        if self.keys:
            x = np.concatenate([self.parts[k](obs[k]) for k in self.keys], axis=-1)
        else:
            x = self.parts["obs"](obs)
        return _run(self.trunk, x)


class _NumpyCopy:
    """A numpy copy of a torch network's parameters, kept in step with it.

    Build it once; call :meth:`refresh` with the policy's version before acting: it copies the
    torch parameters again when the version or any parameter's in-place version counter moved.
    Both are needed: ``load_state_dict`` bumps the counters but may keep the version number, and
    a fused optimiser step changes parameters without bumping their counters (the trainer then
    bumps the policy's version).
    """

    def __init__(self, net: nn.Module):
        self.net = net
        # Listed once: walking the module tree costs more than a forward pass. Parameters are
        # updated in place (optimisers, load_state_dict), never replaced, so the list holds.
        self._params = list(net.parameters())
        self._seen: tuple[int, ...] | None = None

    def refresh(self, version: int) -> None:
        seen = (version, *(p._version for p in self._params))
        if seen != self._seen:
            self._copy()
            self._seen = seen

    def _copy(self) -> None:
        raise NotImplementedError


class NumpyQNet(_NumpyCopy):
    """``forward(obs [B, ...]) -> Q [B, actions]`` in numpy, as ``algorithm.q_policies``'s
    ``QNet`` (plain or dueling); ``obs`` an array, or a mapping of arrays for a Dict space."""

    def _copy(self) -> None:
        net = self.net
        self.body = _Body(net)
        self.head = _weights(net.head)
        self.value = None if net.value is None else _weights(net.value)

    def forward(self, obs: Any) -> np.ndarray:
        features = self.body(obs)
        q = features @ self.head[0] + self.head[1]
        if self.value is None:
            return q
        value = features @ self.value[0] + self.value[1]
        return value + q - q.mean(axis=-1, keepdims=True)


def supports_q(net: nn.Module, device: torch.device) -> bool:
    """Whether :class:`NumpyQNet` can stand in for ``net`` (a ``QNet``)."""
    return device.type == "cpu" and _encoder_supported(net.encoder)


class NumpyActorCritic(_NumpyCopy):
    """``forward(obs [B, ...]) -> (distribution parameters [B, P], value [B, 1])`` in numpy;
    ``obs`` an array, or a mapping of arrays for a Dict space."""

    def __init__(self, net: nn.Module):
        super().__init__(net)
        self.mirror = None
        if net.mirror is not None:
            self.mirror = (dict(net.mirror.widths), net.mirror.index.numpy().copy())

    def _copy(self) -> None:
        net = self.net
        self.actor = _Body(net.actor_body)
        self.critic = None if net.critic_body is None else _Body(net.critic_body)
        self.policy_head = _weights(net.policy_head)
        self.value_head = _weights(net.value_head)
        self.log_std = None
        if net.log_std is not None:
            self.log_std = net.log_std.detach().cpu().numpy().copy()

    def forward(self, obs: Any) -> tuple[np.ndarray, np.ndarray]:
        if self.mirror is not None:
            obs = _with_reflection(obs, self.mirror[0])
        features = self.actor(obs)
        value_features = features if self.critic is None else self.critic(obs)
        params = features @ self.policy_head[0] + self.policy_head[1]
        value = value_features @ self.value_head[0] + self.value_head[1]
        if self.mirror is not None:  # as Mirror.fold
            n = len(params) // 2
            params = (params[:n] + params[n:][:, self.mirror[1]]) / 2
            value = (value[:n] + value[n:]) / 2
        return params, value


def _with_reflection(obs: Any, widths: dict[str, int]) -> Any:
    """``[2N, ...]``: the observations, then their reflections, as ``Mirror.with_reflection``."""
    if "" in widths:
        return np.concatenate([obs, np.flip(obs, widths[""])])
    return {k: np.concatenate([obs[k], np.flip(obs[k], axis)]) for k, axis in widths.items()}


def action_mask(obs: Any) -> np.ndarray | None:
    """A Dict observation's ``action_mask`` ``[N, n]`` as bools, or None."""
    if isinstance(obs, np.ndarray) or ACTION_MASK_KEY not in obs:
        return None
    return np.asarray(obs[ACTION_MASK_KEY]).astype(bool).reshape(len(obs[ACTION_MASK_KEY]), -1)


def _run(layers: list[tuple[np.ndarray, np.ndarray, Any]], x: np.ndarray) -> np.ndarray:
    for w, b, act in layers:
        x = x @ w
        x += b
        x = act(x)
    return x


# ---------------------------------------------------------------------- distributions
def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Normalised log-probabilities ``[N, n]``, as ``torch.log_softmax``."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def masked(logits: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Illegal actions' logits set as the torch path sets them (a row with no legal action
    keeps all of them)."""
    if mask is None:
        return logits
    mask = mask | ~mask.any(axis=-1, keepdims=True)
    return np.where(mask, logits, ILLEGAL_LOGIT)


def categorical_sample(log_probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One draw per row, by Gumbel-max: argmax of log-probabilities plus Gumbel noise."""
    u = rng.random(log_probs.shape, dtype=np.float32)
    return np.argmax(log_probs - np.log(-np.log(u)), axis=-1)


def gather(log_probs: np.ndarray, action: np.ndarray) -> np.ndarray:
    """``[N, 1]``: the log-probability of each row's action."""
    return np.take_along_axis(log_probs, action.reshape(-1, 1).astype(np.int64), axis=-1)


def gaussian_log_prob(action: np.ndarray, mean: np.ndarray, log_std: np.ndarray) -> np.ndarray:
    """``[N, 1]``: the joint log-density of a diagonal Gaussian."""
    z = (action - mean) * np.exp(-log_std)
    per_dim = -0.5 * z * z - log_std - np.float32(0.5 * math.log(2 * math.pi))
    return per_dim.sum(axis=-1, keepdims=True, dtype=np.float32)
