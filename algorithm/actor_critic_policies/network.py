"""The actor-critic network: encoder bodies (optionally with a GRU), a policy head and a value
head, and the arrays the policy keeps per step (its rollout output and recurrent state).

:mod:`algorithm.actor_critic_policies.policy` wraps it as a :class:`~api.policy.Policy`; the
module docstring there explains backbones, memory and normalisation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from algorithm.modules.encoders import ACTION_MASK_KEY, ObservationEncoder
from algorithm.modules.init import orthogonal_init
from algorithm.modules.mirror import Mirror
from algorithm.modules.normalization import RunningMeanStd
from api.namedarray import NamedArray, namedarray
from api.spaces import HybridBox


@namedarray
class ActorCriticOutput:
    """What PPO keeps from rollout: ``[B, 1]`` each."""

    log_prob: np.ndarray
    value: np.ndarray


@namedarray
class PolicyState:
    """A recurrent actor-critic's memory: GRU hidden states ``[B, layers, hidden]``."""

    hx: np.ndarray


class _Body(nn.Module):
    """Encoder, then an optional GRU: observations ``[T*B, ...]`` (time and batch flattened) to
    features ``[T*B, F]``. The encoder reads only ``space``'s keys of a Dict observation."""

    def __init__(self, space, hidden_sizes, activation, rnn_hidden, rnn_layers, grid_channels=()):
        super().__init__()
        self.encoder = ObservationEncoder(space, hidden_sizes, activation, grid_channels)
        self.out_features = self.encoder.out_features
        self.rnn = None
        if rnn_hidden > 0:
            self.rnn = orthogonal_init(
                nn.GRU(self.out_features, rnn_hidden, num_layers=rnn_layers), gain=1.0
            )
            self.out_features = rnn_hidden

    def forward(self, obs, hx, on_reset):
        x = self.encoder(obs)
        if self.rnn is None:
            return x, None
        x = x.reshape(*on_reset.shape[:2], x.shape[-1])  # the GRU runs along time
        # hx: [layers, B, H]; on_reset: [T, B, 1] -> zero memory before the step that starts.
        keep = (~on_reset.bool()).float()
        if not bool(on_reset[1:].any()):
            out, hx = self.rnn(x, hx * keep[0][None])
            return out.flatten(0, 1), hx
        outs = []
        for t in range(x.shape[0]):
            out, hx = self.rnn(x[t : t + 1], hx * keep[t][None])
            outs.append(out)
        return torch.cat(outs).flatten(0, 1), hx


class ActorCriticNet(nn.Module):
    """``forward(obs [T,B,...], hx [B, n*layers, H] | None, on_reset [T,B,1])`` ->
    ``(distribution parameters [T,B,P], value [T,B,1], hx after)``."""

    def __init__(
        self,
        observation_space,
        action_space,
        hidden_sizes,
        shared_backbone,
        rnn_hidden,
        rnn_layers,
        activation,
        grid_channels=(),
        mirror: Mirror | None = None,
        actor_keys: Sequence[str] = (),
    ):
        super().__init__()
        self.rnn_layers = rnn_layers
        self.mirror = mirror  # no parameters: checkpoints load with or without it
        body = (hidden_sizes, activation, rnn_hidden, rnn_layers, grid_channels)
        self.actor_body = _Body(actor_space(observation_space, actor_keys, shared_backbone), *body)
        self.critic_body = None if shared_backbone else _Body(observation_space, *body)
        width = self.actor_body.out_features
        self.policy_head = orthogonal_init(nn.Linear(width, _param_count(action_space)), 0.01)
        self.value_head = orthogonal_init(nn.Linear(width, 1), 1.0)
        self.log_std = None
        if isinstance(action_space, gym.spaces.Box):
            self.log_std = nn.Parameter(torch.zeros(_continuous_count(action_space)))

    def forward(self, obs, hx, on_reset):
        steps, batch = on_reset.shape[:2]
        # The layers see [T*B, ...]: a Linear on a 3-D input adds a reshape each way, in the
        # forward pass and again in the backward pass.
        obs = _flatten_time(obs)
        if self.mirror is not None:  # feed-forward only: no memory to reflect
            obs = self.mirror.with_reflection(obs)
        actor_hx = critic_hx = None
        if hx is not None:
            hx = hx.transpose(0, 1).contiguous()  # [n*layers, B, H]
            actor_hx, critic_hx = hx[: self.rnn_layers], hx[self.rnn_layers :]
        features, actor_hx = self.actor_body(obs, actor_hx, on_reset)
        if self.critic_body is None:
            value_features, new_hx = features, actor_hx
        else:
            value_features, critic_hx = self.critic_body(obs, critic_hx, on_reset)
            new_hx = None if actor_hx is None else torch.cat([actor_hx, critic_hx])
        new_hx = None if new_hx is None else new_hx.transpose(0, 1)
        params, value = self._heads(features, value_features)
        if self.mirror is not None:
            params, value = self.mirror.fold(params, value)
        params = params.reshape(steps, batch, self.policy_head.out_features)
        return params, value.reshape(steps, batch, 1), new_hx

    def _heads(self, features, value_features):
        """Distribution parameters and values, in float32 even when the bodies ran in a lower
        precision (a trainer's bfloat16 autocast). On the batches of
        tests/algorithm/test_precision.py, a Nature CNN's log-probabilities moved from
        float32's by up to 7.8e-3-1.1e-2 with bfloat16 heads (a tenth of PPO's clip, before any
        update), and by up to 1.9e-3 with float32 heads on the same bfloat16 features."""
        device_type = features.device.type
        if not _autocast_on(device_type):
            return self.policy_head(features), self.value_head(value_features)
        with torch.autocast(device_type, enabled=False):
            return self.policy_head(features.float()), self.value_head(value_features.float())


def mirror_for(
    obs_space, action_space, actions, rnn_hidden, normalize_obs, actor_keys=()
) -> Mirror | None:
    """The mirror of a symmetric network (``mirror_actions``), or None for none."""
    if not len(actions):
        return None
    if len(actor_keys):
        raise ValueError(
            "actor_keys and mirror_actions: one or the other (a mirror reflects the whole "
            "observation)"
        )
    if rnn_hidden > 0 or normalize_obs:
        raise ValueError(
            "mirror_actions needs a feed-forward policy (rnn_hidden=0) without normalize_obs: a "
            "GRU's memory and per-cell running statistics have no reflection"
        )
    return Mirror(obs_space, action_space, actions)


def add_normalizers(
    net: nn.Module, observation_space: gym.Space, observations: bool, returns: bool
) -> None:
    """Running statistics as submodules of ``net``: the state dict (checkpoints) holds them."""
    if observations and not (
        isinstance(observation_space, gym.spaces.Box) and observation_space.dtype != np.uint8
    ):
        raise ValueError(
            f"normalize_obs needs a Box observation space of numbers (not images), got "
            f"{observation_space}; set normalize_obs=False"
        )
    net.obs_norm = RunningMeanStd(tuple(observation_space.shape)) if observations else None
    net.return_norm = RunningMeanStd(()) if returns else None


def actor_space(space: gym.Space, keys: Sequence[str], shared_backbone: bool) -> gym.Space:
    """What the actor reads of ``space``: all of it, or only ``keys`` of a Dict (the critic
    reads all: a centralised critic sees the game's global state that the actor, acting from
    its own observation, does not)."""
    if not keys:
        return space
    if shared_backbone:
        raise ValueError("actor_keys needs shared_backbone=False: one backbone reads one input")
    if not isinstance(space, gym.spaces.Dict):
        raise ValueError(f"actor_keys names keys of a Dict observation; this one is {space}")
    unknown = [k for k in keys if k not in space.spaces or k == ACTION_MASK_KEY]
    if unknown:
        known = ", ".join(k for k in space.spaces if k != ACTION_MASK_KEY)
        raise ValueError(f"actor_keys: the observation has no input {unknown}; it has {known}")
    mask = {ACTION_MASK_KEY: space[ACTION_MASK_KEY]} if ACTION_MASK_KEY in space.spaces else {}
    return gym.spaces.Dict({**{k: space[k] for k in keys}, **mask})


def _autocast_on(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch before 2.4: no device argument
        if device_type == "cpu":
            return torch.is_autocast_cpu_enabled()
        return torch.is_autocast_enabled()


def _continuous_count(space: gym.spaces.Box) -> int:
    """A Box's values, less a HybridBox's leading choices."""
    return int(np.prod(space.shape)) - (space.choices if isinstance(space, HybridBox) else 0)


def _param_count(space: gym.Space) -> int:
    if isinstance(space, HybridBox):  # logits for every choice, then the values' means
        return int(np.sum(space.nvec)) + _continuous_count(space)
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    raise TypeError(
        f"actor-critic supports Discrete, MultiDiscrete, MultiBinary, Box and HybridBox action "
        f"spaces (and Dicts or Tuples of their parts, flattened), got {space}"
    )


def _flatten_time(obs: Any) -> Any:
    """``[T, B, ...]`` observations (a tensor or a NamedArray of them) to ``[T*B, ...]``."""
    if isinstance(obs, NamedArray):
        return obs.apply(lambda x: x.flatten(0, 1))
    return obs.flatten(0, 1)
