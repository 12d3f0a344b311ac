"""Left-right mirror symmetry: a network that plays the reflection of a board as the reflection
of its play.

Why: a board game such as connect four is the same game reflected left to right, each column's
move becoming its mirror column's. A network that does not know this learns every pattern (a
threat in column 1, a win in column 5) once per side; a symmetric one learns both sides from
either, so each game teaches it twice as much. :class:`Mirror` makes a feed-forward actor-critic
symmetric by construction, not by augmenting data: the network runs on the board ``x`` and on its
reflection ``F(x)`` in one batch and averages,

    logits(x)[a] = (f(x)[a] + f(F(x))[P(a)]) / 2,    value(x) = (v(x) + v(F(x))) / 2,

where ``P`` maps each action to its mirror action. Then ``logits(F(x))[P(a)] = logits(x)[a]``
exactly, for any weights, from the first update on, and log-probabilities stay exact for PPO's
ratios (data augmentation would need the behaviour policy's probability of the mirrored move,
which it never computed). The price: each forward pass sees twice the rows.

Boards and images (3-dimensional Boxes) are reflected along their width: ``[H, W, C]`` or
``[C, H, W]``, told apart as the encoders do. Any other observation has no reflection this
module could know, so it is refused, as are GRU policies (their memory would need reflecting).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import torch

from algorithm.modules.encoders import ACTION_MASK_KEY, channels_first


class Mirror:
    """Reflects batches of observations ``[N, ...]`` and folds the network's outputs on the
    reflections back into its outputs on the originals.

    Args:
        observation_space: a 3-dimensional Box, or a Dict whose keys are (``action_mask`` apart).
        action_space: Discrete.
        actions: ``actions[a]`` is the mirror action of ``a`` (connect four's 7 columns:
            ``[6, 5, 4, 3, 2, 1, 0]``); reflecting twice must give ``a`` back.
    """

    def __init__(
        self, observation_space: gym.Space, action_space: gym.Space, actions: Sequence[int]
    ):
        self.widths = _width_axes(observation_space)
        self.index = torch.as_tensor(_involution(action_space, actions), dtype=torch.long)

    def with_reflection(self, obs: Any) -> Any:
        """``[2N, ...]``: the ``N`` observations, then their reflections (only the keys the
        encoder reads; the action mask is applied to the folded logits as it is)."""
        if "" in self.widths:
            return torch.cat([obs, obs.flip(self.widths[""])])
        return {k: torch.cat([obs[k], obs[k].flip(axis)]) for k, axis in self.widths.items()}

    def fold(self, params: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs on ``[2N]`` rows (originals, reflections) to the symmetric outputs on ``N``."""
        n = params.shape[0] // 2
        reflected = params[n:].index_select(-1, self.index.to(params.device))
        return (params[:n] + reflected) / 2, (value[:n] + value[n:]) / 2


def _width_axes(space: gym.Space) -> dict[str, int]:
    """The width axis of each key's batched ``[N, ...]`` tensor ("" for a plain Box)."""
    if isinstance(space, gym.spaces.Dict):
        spaces = {k: s for k, s in space.spaces.items() if k != ACTION_MASK_KEY}
    else:
        spaces = {"": space}
    axes = {}
    for key, sub in spaces.items():
        if not (isinstance(sub, gym.spaces.Box) and len(sub.shape) == 3):
            where = f"observation key {key!r}" if key else "the observation"
            raise ValueError(
                f"mirror_actions reflects boards and images (3-dimensional Boxes) along their "
                f"width; {where} is {sub}, which has no width to reflect"
            )
        axes[key] = -1 if channels_first(sub.shape) else -2
    return axes


def _involution(space: gym.Space, actions: Sequence[int]) -> list[int]:
    if not isinstance(space, gym.spaces.Discrete):
        raise ValueError(f"mirror_actions needs a Discrete action space, got {space}")
    actions, n = [int(a) for a in actions], int(space.n)
    if sorted(actions) != list(range(n)):
        raise ValueError(
            f"mirror_actions must list each of the {n} actions once (action a's mirror at "
            f"position a), got {actions}"
        )
    if any(actions[actions[a]] != a for a in range(n)):
        raise ValueError(
            f"mirror_actions must map each action's mirror back to it (reflecting twice is no "
            f"reflection), got {actions}"
        )
    return actions
