"""``SACPolicy`` (registered as ``sac-policy``): soft actor-critic networks for a Box action space.

* Observations are read as :class:`~algorithm.modules.encoders.ObservationEncoder` reads them,
  without its MLP: a Box flattened, a Discrete or MultiDiscrete one-hot, a MultiBinary as it
  is, a Dict (a goal-conditioned task's ``observation``, ``desired_goal``, ...) key by key side
  by side. That step has no weights, so the actor and critics below see the same features and
  a Box observation's checkpoints are as before. Observations holding images go through a
  trained encoder instead, as SAC from pixels needs one (:mod:`algorithm.sac.pixels`: CNNs to
  ``feature_dim`` features trained by the critics alone, a target copy, random shifts of the
  training images by up to ``shift_pad`` pixels).
* The actor maps the features to the mean and log-std of a diagonal Gaussian
  over ``u``; the action is ``tanh(u)`` rescaled from ``[-1, 1]`` to the Box's bounds, so every
  action is legal. Its log-probability takes the change of variables into account::

      log pi(a|s) = log N(u; mean, std) - sum log(1 - tanh(u)^2) - sum log(scale)

  (``scale`` is half the width of the Box; the tanh term is computed in a stable form).
* Twin Q critics ``Q1, Q2(s, a)`` take the observation and the action normalised to ``[-1, 1]``;
  their target copies (frozen, moved by Polyak averaging with :meth:`update_target`) live in the
  same module, so a checkpoint carries everything.
* Exploration is the Gaussian's own noise; ``warmup_frames`` training rows are acted uniformly at
  random first (counted as the q-network's epsilon schedule is, across restarts and resumes:
  :mod:`algorithm.modules.exploration`), each random
  action held for ``warmup_hold`` of its agent's steps: a task that needs momentum (a car in a
  valley) is never solved by a fresh random push every step, and always by pushes held long
  enough. Evaluation rows act with ``tanh(mean)``.
* ``policy_output.log_prob``: the chosen action's log-probability ``[B, 1]`` (for statistics).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from algorithm.modules.encoders import ObservationEncoder, mlp
from algorithm.modules.exploration import CountsExploration
from algorithm.modules.init import orthogonal_init
from algorithm.policy import SingleModelPytorchPolicy
from algorithm.sac.pixels import PixelFeatures, has_image, polyak, shift_images
from algorithm.sac.trainer import SACAnalyzedResult
from api.namedarray import namedarray
from api.policy import RolloutRequest, RolloutResult
from api.replay import require_transitions
from api.spaces import HybridBox

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
"""The actor's log-std range: wide enough to explore, narrow enough to keep log-probs finite."""


@namedarray
class SACOutput:
    """What a SAC policy reports from rollout: ``log_prob`` ``[B, 1]``."""

    log_prob: np.ndarray


def _critic(in_features: int, hidden_sizes: Sequence[int], activation: str) -> nn.Module:
    width = hidden_sizes[-1] if hidden_sizes else in_features
    return nn.Sequential(
        mlp(in_features, hidden_sizes, activation), orthogonal_init(nn.Linear(width, 1), 1.0)
    )


class LossInputs(NamedTuple):
    """What :class:`SACNetworks` needs beyond ``obs`` to compute the loss terms (``[B, ...]``)."""

    action: torch.Tensor
    """The taken actions, normalised to ``[-1, 1]``."""
    next_obs: Any
    """The observations after the transitions (a NamedArray for a Dict), as ``obs``."""
    noise: torch.Tensor
    """Standard normal noise of the fresh action at ``obs``."""
    next_noise: torch.Tensor
    """Standard normal noise of the fresh action at ``next_obs``."""


class LossTerms(NamedTuple):
    """The network outputs of one SAC step (``u`` is a fresh action before its tanh)."""

    q1: torch.Tensor
    q2: torch.Tensor
    next_q_target: torch.Tensor
    next_u: torch.Tensor
    next_log_std: torch.Tensor
    u: torch.Tensor
    log_std: torch.Tensor
    q_new: torch.Tensor


class SACNetworks(nn.Module):
    """Actor, twin critics and their targets. ``forward(obs)`` is the actor: ``(mean, log_std)``;
    ``forward(obs, LossInputs(...))`` computes everything one training step differentiates."""

    def __init__(
        self,
        observation_space: gym.Space,
        act_dim: int,
        hidden_sizes: Sequence[int],
        activation: str,
        feature_dim: int = 50,
    ):
        super().__init__()
        self.pixels = has_image(observation_space)
        self.features: nn.Module = ObservationEncoder(observation_space, (), activation)
        """Observation to features: weightless, or with images a trained encoder (see the
        module docstring)."""
        if self.pixels:
            self.features = PixelFeatures(observation_space, feature_dim)
            self.features_target = copy.deepcopy(self.features).requires_grad_(False)
        obs_dim = self.features.out_features
        width = hidden_sizes[-1] if hidden_sizes else obs_dim
        self.actor = mlp(obs_dim, hidden_sizes, activation)
        self.mean = orthogonal_init(nn.Linear(width, act_dim), 0.01)
        self.log_std = orthogonal_init(nn.Linear(width, act_dim), 0.01)
        self.q1 = _critic(obs_dim + act_dim, hidden_sizes, activation)
        self.q2 = _critic(obs_dim + act_dim, hidden_sizes, activation)
        self.q1_target = copy.deepcopy(self.q1).requires_grad_(False)
        self.q2_target = copy.deepcopy(self.q2).requires_grad_(False)

    def forward(
        self, obs: Any, losses: LossInputs | None = None
    ) -> tuple[torch.Tensor, torch.Tensor] | LossTerms:
        """The actor, ``(mean, log_std)`` at features ``obs`` (:attr:`features` of an
        observation); or, given ``losses``, every network output the SAC losses need at the
        observations ``obs`` and ``losses.next_obs``, in this one call. Training calls it
        through the policy's ``net``: under data-parallel training that is the DDP wrapper,
        whose gradient averaging covers what one forward through it computes (so neither the
        critics nor the encoder may be called on the side)."""
        if losses is None:
            return self._actor(obs)
        return self._loss_terms(obs, losses)

    def _actor(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.actor(obs)
        # a smooth squash of the log-std into its range (a clamp would stop its gradient)
        log_std = torch.tanh(self.log_std(features))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1.0)
        return self.mean(features), log_std

    def _loss_terms(self, obs: Any, x: LossInputs) -> LossTerms:
        features = self.features(obs)  # with images: trained here, by the critics' loss alone
        seen = features.detach()  # what the actor reads
        with torch.no_grad():
            next_features = self.features(x.next_obs)
            target_features = self.features_target(x.next_obs) if self.pixels else next_features
            next_mean, next_log_std = self._actor(next_features)
            next_u = next_mean + next_log_std.exp() * x.next_noise
            pair = torch.cat([target_features, torch.tanh(next_u)], -1)
            next_q = torch.min(self.q1_target(pair), self.q2_target(pair))
        mean, log_std = self._actor(seen)
        u = mean + log_std.exp() * x.noise
        with _frozen(self.q1, self.q2):  # the actor's loss must not move the critics
            fresh = torch.cat([seen, torch.tanh(u)], -1)
            q_new = torch.min(self.q1(fresh), self.q2(fresh))
        taken = torch.cat([features, x.action], -1)
        return LossTerms(
            q1=self.q1(taken),
            q2=self.q2(taken),
            next_q_target=next_q,
            next_u=next_u,
            next_log_std=next_log_std,
            u=u,
            log_std=log_std,
            q_new=q_new,
        )


@contextmanager
def _frozen(*modules: nn.Module):
    """Parameters treated as constants by autograd inside the block (gradients flow through the
    modules to their inputs, but not into them)."""
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


class SACPolicy(CountsExploration, SingleModelPytorchPolicy):
    """Soft actor-critic networks for Box actions; see the module docstring.

    Args:
        observation_space: the agent's observation space: a Box (an image too), Discrete,
            MultiDiscrete, MultiBinary or a Dict of them (filled in by the runtime).
        action_space: the agent's action space, a bounded Box (filled in by the runtime).
        hidden_sizes: widths of the actor's and each critic's MLP.
        activation: ``relu``, ``tanh``, ``elu`` or ``gelu``.
        warmup_frames: training rows acted uniformly at random before the actor takes over.
        warmup_hold: steps each warm-up action is held for an agent (its request's client id:
            the environment and agent number), 1: a new one every step.
        feature_dim: with images, the width of the trained encoder's features.
        shift_pad: with images, the most pixels a training image is shifted by at random, each
            way (0: no shifts).
        device: ``cpu`` or ``cuda`` (falls back to the CPU when no GPU is available).
        seed: seeds parameter initialisation, action sampling and the shifts.
    """

    arg_ranges = {
        "hidden_sizes": "[1, inf)", "warmup_frames": "[0, inf)", "warmup_hold": "[1, inf)",
        "feature_dim": "[1, inf)", "shift_pad": "[0, inf)", "seed": "[0, inf)",
    }  # fmt: skip

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        hidden_sizes: Sequence[int] = (256, 256),
        activation: str = "relu",
        warmup_frames: int = 0,
        warmup_hold: int = 1,
        feature_dim: int = 50,
        shift_pad: int = 4,
        device: str = "cpu",
        seed: int | None = None,
    ):
        _check_actions(action_space)
        self.observation_space, self.action_space = observation_space, action_space
        self.act_dim = int(np.prod(action_space.shape))
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            net = SACNetworks(
                observation_space, self.act_dim, tuple(hidden_sizes), activation, feature_dim
            )
        super().__init__(net, device=device)
        low = np.asarray(action_space.low, np.float32).reshape(-1)
        high = np.asarray(action_space.high, np.float32).reshape(-1)
        self._center = torch.as_tensor((high + low) / 2, device=self.device)
        self._scale = torch.as_tensor((high - low) / 2, device=self.device)
        self.log_scale = float(torch.log(self._scale).sum())
        """``sum log(scale)``: what the rescale from ``[-1, 1]`` adds to an action's entropy."""
        self.warmup_frames = warmup_frames
        self.warmup_hold = warmup_hold
        self._held: dict[int, tuple[torch.Tensor, int]] = {}
        """Per client id: the warm-up action it holds and the steps it has left."""
        self.explore_frames = 0
        self._generator = torch.Generator(device=self.device)
        self._generator.manual_seed(seed if seed is not None else torch.initial_seed())
        self.shift_pad = shift_pad if net.pixels else 0
        self._shifts = torch.Generator().manual_seed(self._generator.initial_seed() + 1)
        """Draws the training images' shifts (on the CPU: a few numbers a batch)."""

    # ----------------------------------------------------------------- the actor
    def sample(self, obs: torch.Tensor, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action in ``[-1, 1]`` and its log-probability ``[N, 1]`` (in the
        Box's units: the rescale's Jacobian included). For acting: it calls the bare module, so
        training differentiates through :meth:`analyze` instead."""
        mean, log_std = self.module(obs)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device)
        u = mean + log_std.exp() * noise
        return torch.tanh(u), self._log_prob(u, noise, log_std)

    def log_prob_of(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``log pi(action|obs)`` ``[N, 1]`` of given Box actions (strictly inside the bounds)."""
        mean, log_std = self.module(obs)
        u = torch.atanh(self.from_env(action).clamp(-1.0 + 1e-6, 1.0 - 1e-6))
        return self._log_prob(u, (u - mean) / log_std.exp(), log_std)

    def _log_prob(self, u: torch.Tensor, noise: torch.Tensor, log_std: torch.Tensor):
        gaussian = (-0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        # log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)), exact and stable for large |u|
        squash = (2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1)
        return (gaussian - squash - self.log_scale)[:, None]

    def to_env(self, action: torch.Tensor) -> torch.Tensor:
        """``[-1, 1]`` actions to the Box's units."""
        return self._center + self._scale * action

    def from_env(self, action: torch.Tensor) -> torch.Tensor:
        """Box actions to ``[-1, 1]`` (what the critics take)."""
        return ((action.reshape(len(action), -1) - self._center) / self._scale).clamp(-1.0, 1.0)

    # ----------------------------------------------------------------- acting
    def rollout(self, request: RolloutRequest, **kwargs: Any) -> RolloutResult:
        with torch.no_grad():
            obs = self.module.features(self.to_tensor(request.obs))
            greedy = torch.zeros(len(obs), 1, dtype=torch.bool, device=self.device)
            if request.is_evaluation is not None:
                greedy = self.to_tensor(request.is_evaluation).bool().reshape(-1, 1)
            action, log_prob = self.sample(obs, self._generator)
            action = torch.where(greedy, torch.tanh(self.module(obs)[0]), action)
            if self.explore_frames < self.warmup_frames:
                random = self._warmup_actions(request.client_id, action.shape)
                action = torch.where(greedy, action, random.to(self.device))
        self.explore_frames += int((~greedy).sum())
        env_action = self.to_numpy(self.to_env(action)).reshape(-1, *self.action_space.shape)
        return RolloutResult(
            action=env_action.astype(np.float32),
            policy_output=SACOutput(log_prob=self.to_numpy(log_prob)),
            client_id=request.client_id,
            request_id=request.request_id,
        )

    def _warmup_actions(self, client_id: Any, shape: torch.Size) -> torch.Tensor:
        """Uniform actions in ``[-1, 1]``, each drawn anew once its client has held the last
        one for ``warmup_hold`` steps."""
        fresh = torch.rand(shape, generator=self._generator) * 2.0 - 1.0
        if self.warmup_hold == 1 or client_id is None:
            return fresh
        rows = []
        for i, client in enumerate(np.asarray(client_id).reshape(-1).tolist()):
            held, left = self._held.get(client, (fresh[i], 0))
            if left <= 0:
                held, left = fresh[i], self.warmup_hold
            self._held[client] = (held, left - 1)
            rows.append(held)
        return torch.stack(rows)

    # ----------------------------------------------------------------- training
    def analyze(self, sample: Any, target: str = "sac", **kwargs: Any) -> SACAnalyzedResult:
        """Evaluate a :class:`~api.replay.TransitionBatch` for the SAC losses (see
        :class:`~algorithm.sac.trainer.SACAnalyzedResult` for what carries gradients)."""
        if target != "sac":
            raise ValueError(f"SACPolicy analyzes for target 'sac' only, got '{target}'")
        require_transitions(sample, "SACPolicy")
        obs, next_obs = (
            shift_images(self.to_tensor(o), self.observation_space, self.shift_pad, self._shifts)
            for o in (sample.obs, sample.next_obs)
        )
        shape = (len(sample.action), self.act_dim)
        next_noise = torch.randn(shape, device=self.device)
        inputs = LossInputs(
            action=self.from_env(self.to_tensor(sample.action).float()),
            next_obs=next_obs,
            noise=torch.randn(shape, device=self.device),
            next_noise=next_noise,
        )
        out: LossTerms = self.net(obs, inputs)
        return SACAnalyzedResult(
            q1=out.q1,
            q2=out.q2,
            next_q_target=out.next_q_target,
            next_log_prob=self._log_prob(out.next_u, next_noise, out.next_log_std),
            log_prob=self._log_prob(out.u, inputs.noise, out.log_std),
            q_new=out.q_new,
        )

    def actor_parameters(self) -> Iterator[nn.Parameter]:
        net = self.module
        for part in (net.actor, net.mean, net.log_std):
            yield from part.parameters()

    def critic_parameters(self) -> Iterator[nn.Parameter]:
        """The critics', and with images the encoder's: the critics' loss alone trains it."""
        yield from self.module.q1.parameters()
        yield from self.module.q2.parameters()
        if self.module.pixels:
            yield from self.module.features.parameters()

    def parameters(self) -> Iterator[nn.Parameter]:
        """Actor and critics: everything an optimiser updates (the targets are not)."""
        yield from self.actor_parameters()
        yield from self.critic_parameters()

    @torch.no_grad()
    def update_target(self, tau: float) -> None:
        """``target <- tau * critic + (1 - tau) * target`` for both critics (and the encoder)."""
        net = self.module
        targets = [*net.q1_target.parameters(), *net.q2_target.parameters()]
        if net.pixels:
            targets += net.features_target.parameters()
        polyak(targets, self.critic_parameters(), tau)


def _check_actions(action_space: gym.Space) -> None:
    if not isinstance(action_space, gym.spaces.Box) or isinstance(action_space, HybridBox):
        raise TypeError(
            f"sac-policy needs a Box action space, got {action_space}; for Discrete actions "
            "use q-network or actor-critic, for discrete choices with continuous values "
            "actor-critic"
        )
    if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
        raise ValueError(
            "sac-policy squashes actions into the Box's bounds, so they must be finite; got "
            f"low={action_space.low}, high={action_space.high}"
        )
