"""A numpy copy of a feed-forward actor-critic network, for acting on the CPU.

Why: a policy worker answers thousands of small requests a second, and for a small MLP almost
all of a torch forward pass is per-operation dispatch, not arithmetic. Measured on this project's
2-core VM for cartpole-ppo's 2x64 actor and critic at 32 rows: 98 us a forward pass through torch
with warm caches and 253 us with cold ones (a policy worker wakes for each request, its caches
cold from the other processes), against 26 us and 63 us through numpy; ``torch.multinomial``
alone took 19-107 us. So :class:`~algorithm.actor_critic_policies.policy.ActorCriticPolicy` acts
through this copy where it applies (vector observations, no GRU, CPU), and trains through torch.

The copy is exact up to float rounding: the same layers, the same log-softmax. Sampling draws
from its own numpy generator (Gumbel-max for categoricals), so actions follow the same
distribution as the torch path, not the same random stream.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from algorithm.modules.encoders import ObservationEncoder, _Flat

_ACTIVATIONS = {
    nn.Tanh: np.tanh,
    nn.ReLU: lambda x: np.maximum(x, 0.0, out=x),
}


def supports(net: nn.Module, observation_space: gym.Space, device: torch.device) -> bool:
    """Whether :class:`NumpyActorCritic` can stand in for ``net`` (an ``ActorCriticNet``)."""
    if device.type != "cpu" or not isinstance(observation_space, gym.spaces.Box):
        return False
    if net.mirror is not None:  # the symmetric network's two passes are torch's only
        return False
    bodies = [b for b in (net.actor_body, net.critic_body) if b is not None]
    return all(b.rnn is None and _mlp_layers(b.encoder) is not None for b in bodies)


def _mlp_layers(encoder: ObservationEncoder) -> list[tuple[nn.Linear, Any]] | None:
    """The encoder's trunk as (linear, numpy activation) pairs; None if it is not a plain MLP."""
    if encoder.keys or not isinstance(encoder.parts["obs"], _Flat):
        return None
    modules = list(encoder.trunk)
    layers = []
    for linear, act in zip(modules[::2], modules[1::2], strict=False):
        if not isinstance(linear, nn.Linear) or type(act) not in _ACTIVATIONS:
            return None
        layers.append((linear, _ACTIVATIONS[type(act)]))
    return layers if 2 * len(layers) == len(modules) else None


def _weights(linear: nn.Linear) -> tuple[np.ndarray, np.ndarray]:
    """``x @ w + b`` form: the transpose copied contiguous, so the matmul reads rows."""
    w = linear.weight.detach().cpu().numpy().T.copy()
    return w, linear.bias.detach().cpu().numpy().copy()


class NumpyActorCritic:
    """``forward(obs [B, ...]) -> (distribution parameters [B, P], value [B, 1])`` in numpy.

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
        if seen == self._seen:
            return
        net = self.net
        self.actor = self._body(net.actor_body)
        self.critic = None if net.critic_body is None else self._body(net.critic_body)
        self.policy_head = _weights(net.policy_head)
        self.value_head = _weights(net.value_head)
        self.log_std = None
        if net.log_std is not None:
            self.log_std = net.log_std.detach().cpu().numpy().copy()
        self.flat = net.actor_body.encoder.parts["obs"].out_features
        self._seen = seen

    @staticmethod
    def _body(body: nn.Module) -> list[tuple[np.ndarray, np.ndarray, Any]]:
        return [(*_weights(linear), act) for linear, act in _mlp_layers(body.encoder)]

    def forward(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(obs, dtype=np.float32).reshape(len(obs), self.flat)
        features = _run(self.actor, x)
        value_features = features if self.critic is None else _run(self.critic, x)
        params = features @ self.policy_head[0] + self.policy_head[1]
        value = value_features @ self.value_head[0] + self.value_head[1]
        return params, value


def _run(layers: list[tuple[np.ndarray, np.ndarray, Any]], x: np.ndarray) -> np.ndarray:
    for w, b, act in layers:
        x = x @ w
        x += b
        x = act(x)
    return x


# ---------------------------------------------------------------------- distributions
def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Normalised log-probabilities ``[N, n]``, as ``torch.log_softmax``.

    (No action masks here: they come in Dict observations, which act through torch.)
    """
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


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
