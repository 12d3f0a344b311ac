"""What a replay buffer hands an off-policy trainer (DQN, SAC): a batch of transitions.

Actors send trajectory segments (``api.policy.SampleBatch``) into a replay buffer; the buffer
samples single transitions from them, with their n-step returns already summed, and an
off-policy trainer's ``step`` learns from a :class:`TransitionBatch`. Every field is batched along
axis 0: ``[B, ...]``.

The trainer's target is ``reward + discount * max_a' Q(next_obs, a')`` (or its soft version):
``discount`` is ``gamma ** k`` for a return summed over ``k`` steps, and 0 when the episode
terminated inside them, so one formula serves 1-step, n-step and episode ends.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from api.errors import ConfigError
from api.namedarray import NamedArray, namedarray


@namedarray
class TransitionBatch:
    """Sampled transitions, batched along axis 0."""

    obs: Any
    """Observations ``[B, ...]`` (or a NamedArray of them) where the action was taken."""
    action: Any
    """Actions taken there, ``[B, ...]``."""
    reward: np.ndarray
    """``[B, 1]`` float32: the discounted sum of the next ``k`` rewards (``k <= n``)."""
    discount: np.ndarray
    """``[B, 1]`` float32: ``gamma ** k``, or 0 when the episode terminated within the k steps."""
    next_obs: Any
    """Observations ``k`` steps later, ``[B, ...]``: the state the target bootstraps from."""
    weight: np.ndarray | None = None
    """``[B, 1]`` float32: importance-sampling weights of prioritised replay (1 for uniform)."""
    key: np.ndarray | None = None
    """``[B]`` int64: the buffer's keys of these transitions, to update their priorities."""
    policy_version: np.ndarray | None = None
    """``[B, 1]`` int64: the policy version that chose the action."""
    extras: NamedArray | None = None
    """``[B, ...]`` each: the fields actor callbacks added to the segments (``segment_fields``,
    :mod:`api.episode`) at the step the action was taken; None when none declares any."""


def require_transitions(samples: Any, trainer: str) -> None:
    """Fail clearly when an off-policy trainer is handed trajectory segments, not transitions."""
    if not isinstance(samples, NamedArray) or "discount" not in samples:
        raise ConfigError(
            [
                f"{trainer} learns from replayed transitions (api.replay.TransitionBatch, "
                "sampled from a system.replay.buffer.ReplayBuffer), got "
                f"{type(samples).__name__}; it cannot train on the actors' segments directly: "
                "put a replay buffer between actors and trainer"
            ]
        )
