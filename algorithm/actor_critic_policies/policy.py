"""``ActorCriticPolicy`` (registered as ``actor-critic``): the policy for PPO and IMPALA.

The network is built from the agent's gymnasium spaces, which the runtime passes as
``observation_space`` and ``action_space``:

* observations go through :class:`~algorithm.modules.encoders.ObservationEncoder` (MLP for
  vectors, a CNN for uint8 images (the Nature CNN from 36x36 up), per-key features for Dict spaces);
* ``shared_backbone=False`` (default): the actor and the critic each have their own encoder (and
  GRU): no parameter is shared. ``True``: one backbone feeds a policy head and a value head;
* ``rnn_hidden > 0`` adds a GRU after the encoder; the policy state is
  ``PolicyState(hx=[B, n * rnn_layers, rnn_hidden])`` where ``n`` is 2 for separate backbones
  (the actor's layers first, then the critic's) and 1 for a shared one;
* the action distribution follows the action space: ``Discrete`` -> Categorical, actions int64
  ``[B]``; ``MultiDiscrete`` -> independent Categoricals, int64 ``[B, *shape]`` (a
  ``MultiBinary`` is a MultiDiscrete of two-way choices: Bernoullis); ``Box`` -> diagonal
  Gaussian with a state-independent log-std, float32 ``[B, *shape]``, the raw sample *unclipped*
  (the environment adapter clips to bounds); a ``HybridBox`` -> both, float32 ``[B, k + d]``.
  ``policy_output.log_prob`` is the joint log-prob, ``[B, 1]``.
* a Dict observation with an ``action_mask`` key (True or 1 = legal, laid end to end for
  MultiDiscrete) restricts the Categorical(s): an illegal action is never chosen.
* ``normalize_obs`` (Box observations) standardises observations by their running mean and
  std; ``normalize_returns`` divides rewards by the running std of discounted returns before
  the trainer computes advantages. Both statistics are buffers of the module, so checkpoints
  carry them; the trainer updates them once a batch through :meth:`normalize_batch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from algorithm.actor_critic_policies.network import (
    ActorCriticNet,
    ActorCriticOutput,
    PolicyState,
    add_normalizers,
    mirror_for,
)
from algorithm.impala.trainer import ImpalaAnalyzedResult
from algorithm.modules import cuda_graphs
from algorithm.modules import numpy_inference as numpy_inference_lib
from algorithm.modules.distributions import (
    ActionDistribution,
    Categorical,
    DiagGaussian,
    Hybrid,
    MultiDiscrete,
    as_choices,
)
from algorithm.modules.encoders import ACTION_MASK_KEY
from algorithm.modules.normalization import discounted_returns
from algorithm.policy import SingleModelPytorchPolicy
from algorithm.ppo.trainer import PPOAnalyzedResult
from api.namedarray import NamedArray
from api.policy import RolloutRequest, RolloutResult, SampleBatch
from api.spaces import HybridBox


class ActorCriticPolicy(SingleModelPytorchPolicy):
    """Actor-critic policy for PPO; see the module docstring for the architecture.

    Args:
        observation_space: the agent's observation space (filled in by the runtime).
        action_space: the agent's action space (filled in by the runtime).
        hidden_sizes: widths of the encoder MLP.
        shared_backbone: one backbone for actor and critic (True) or two separate ones.
        rnn_hidden: GRU width after the encoder; 0 for a feed-forward policy.
        rnn_layers: GRU layers.
        activation: ``tanh``, ``relu``, ``elu`` or ``gelu``.
        device: ``cpu`` or ``cuda`` (falls back to the CPU when no GPU is available).
        seed: seeds parameter initialisation and action sampling (None: torch's global RNG).
        numpy_inference: act through a numpy copy of the network where it applies (vectors,
            boards and Dicts of them, no image, no GRU, CPU; see
            :mod:`algorithm.modules.numpy_inference`): the same
            outputs up to float rounding, for several times less CPU a request. Training always
            goes through torch.
        normalize_obs: standardise Box observations by their running mean and std.
        normalize_returns: scale rewards by the running std of discounted returns.
        grid_channels: 3x3 convolutions (their output channels) over board observations (a
            3-dimensional Box that is not a uint8 image, such as connect four's piece planes)
            before the MLP; empty: boards are flattened. See
            :class:`algorithm.modules.encoders.GridEncoder`.
        mirror_actions: for a game that is the same reflected left to right (connect four:
            ``[6, 5, 4, 3, 2, 1, 0]``), each action's mirror action, counted from 0: the
            network is then symmetric by construction, so a pattern learnt on one side of the
            board holds on the other (:mod:`algorithm.modules.mirror`). Empty: no symmetry.
        cuda_graphs: on a GPU, act through CUDA graphs, one per padded batch size (one launch
            a batch instead of some thirty; :mod:`algorithm.modules.cuda_graphs`). For a
            feed-forward network with one Discrete action and one observation array; ignored
            on the CPU. Training always goes through torch.
        actor_keys: the keys of a Dict observation the actor reads; the critic reads every
            key. Empty: both read all. A centralised critic (MAPPO's): a PettingZoo game made
            with ``global_state=True`` gives each agent ``{"obs": own, "state": the game's}``,
            and ``actor_keys=["obs"]`` acts from the agent's own observation alone while the
            value is learned from the whole state (``--algo mappo`` sets both).
    """

    arg_ranges = {
        "hidden_sizes": "[1, inf)", "rnn_hidden": "[0, inf)", "rnn_layers": "[1, inf)",
        "grid_channels": "[1, inf)", "seed": "[0, inf)",
    }  # fmt: skip

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        hidden_sizes: Sequence[int] = (64, 64),
        shared_backbone: bool = False,
        rnn_hidden: int = 0,
        rnn_layers: int = 1,
        activation: str = "tanh",
        device: str = "cpu",
        seed: int | None = None,
        numpy_inference: bool = True,
        normalize_obs: bool = False,
        normalize_returns: bool = False,
        grid_channels: Sequence[int] = (),
        mirror_actions: Sequence[int] = (),
        cuda_graphs: bool = False,
        actor_keys: Sequence[str] = (),
    ):
        action_space = as_choices(action_space)
        self.observation_space, self.action_space = observation_space, action_space
        mirror = mirror_for(
            observation_space, action_space, mirror_actions, rnn_hidden, normalize_obs, actor_keys
        )
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            net = ActorCriticNet(
                observation_space,
                action_space,
                tuple(hidden_sizes),
                shared_backbone,
                rnn_hidden,
                rnn_layers,
                activation,
                tuple(grid_channels),
                mirror,
                tuple(actor_keys),
            )
        add_normalizers(net, observation_space, normalize_obs, normalize_returns)
        super().__init__(net, device=device)
        self._generator = None
        if seed is not None:
            self._generator = torch.Generator(device=self.device).manual_seed(seed)
        # Distributions count actions from 0; a (Multi)Discrete space may start elsewhere.
        start = 0 if isinstance(action_space, gym.spaces.Box) else _action_start(action_space)
        self._action_offset = torch.as_tensor(start, device=self.device) if np.any(start) else None
        self._state_shape = None
        if rnn_hidden > 0:
            self._state_shape = ((1 if shared_backbone else 2) * rnn_layers, rnn_hidden)
        self._numpy = None
        numpy_inference &= not isinstance(action_space, HybridBox)  # torch draws its parts
        if numpy_inference and numpy_inference_lib.supports(net, observation_space, self.device):
            self._numpy = numpy_inference_lib.NumpyActorCritic(self.module)
            self._rng = np.random.default_rng(seed if seed is not None else torch.initial_seed())
        self._graphed = None
        if cuda_graphs:
            self._graphed = _graphed_rollout(net, observation_space, action_space, self.device)

    @property
    def default_policy_state(self) -> PolicyState | None:
        if self._state_shape is None:
            return None
        return PolicyState(hx=np.zeros((1, *self._state_shape), dtype=np.float32))

    # ----------------------------------------------------------------- acting
    def rollout(self, request: RolloutRequest, **kwargs: Any) -> RolloutResult:
        if self._numpy is not None:
            return self._rollout_numpy(request)
        if self._graphed is not None:
            result = self._rollout_graphed(request)
            if result is not None:
                return result
        obs = self._normalized(self.to_tensor(request.obs))
        batch = len(request.obs)
        with torch.no_grad():
            params, value, hx = self.module(
                _add_time(obs),
                self._initial_hx(request.policy_state, batch),
                self._flags(request.on_reset, batch)[None],
            )
            dist = self._distribution(params[0], _mask_of(obs))
            action = dist.sample(self._generator)
            if request.is_evaluation is not None and request.is_evaluation.any():
                greedy = self.to_tensor(request.is_evaluation).bool()
                mode = dist.mode()
                action = torch.where(greedy.reshape(-1, *[1] * (action.dim() - 1)), mode, action)
            output = ActorCriticOutput(log_prob=dist.log_prob(action), value=value[0])
        return RolloutResult(
            action=self._env_action(action),
            policy_state=None if hx is None else PolicyState(hx=self.to_numpy(hx)),
            policy_output=self.to_numpy(output),
            client_id=request.client_id,
            request_id=request.request_id,
        )

    def _rollout_graphed(self, request: RolloutRequest) -> RolloutResult | None:
        """``rollout`` through the captured graphs; None for a batch they do not take."""
        out = self._graphed.act(request.obs, request.is_evaluation, self._generator)
        if out is None:
            return None
        action, log_prob, value = out
        return RolloutResult(
            action=action + _action_start(self.action_space),
            policy_output=ActorCriticOutput(log_prob=log_prob, value=value),
            client_id=request.client_id,
            request_id=request.request_id,
        )

    def _rollout_numpy(self, request: RolloutRequest) -> RolloutResult:
        """``rollout`` through the numpy copy of the network (refreshed if the weights moved)."""
        net = self._numpy
        net.refresh(self._version)
        obs = request.obs
        if self.module.obs_norm is not None:
            obs = self.to_numpy(self._normalized(self.to_tensor(obs)))
        params, value = net.forward(obs)
        greedy = request.is_evaluation
        greedy = None if greedy is None or not greedy.any() else greedy.reshape(-1)
        if isinstance(self.action_space, gym.spaces.Box):
            action, log_prob = self._gaussian_numpy(params, greedy)
        else:
            mask = numpy_inference_lib.action_mask(obs)
            action, log_prob = self._categorical_numpy(params, greedy, mask)
        return RolloutResult(
            action=action,
            policy_output=ActorCriticOutput(log_prob=log_prob, value=value),
            client_id=request.client_id,
            request_id=request.request_id,
        )

    def _categorical_numpy(self, params, greedy: np.ndarray | None, mask: np.ndarray | None):
        lib, space = numpy_inference_lib, self.action_space
        sizes = [int(space.n)] if isinstance(space, gym.spaces.Discrete) else self._nvec
        actions, log_prob, start = [], 0.0, 0
        for n in sizes:
            part = None if mask is None else mask[:, start : start + n]
            log_probs = lib.log_softmax(lib.masked(params[:, start : start + n], part))
            action = lib.categorical_sample(log_probs, self._rng)
            if greedy is not None:
                action = np.where(greedy, log_probs.argmax(axis=-1), action)
            actions.append(action)
            log_prob = log_prob + lib.gather(log_probs, action)
            start += n
        action = actions[0] if isinstance(space, gym.spaces.Discrete) else np.stack(actions, -1)
        action = action.astype(np.int64) + _action_start(space)
        return action.reshape(-1, *space.shape), log_prob

    def _gaussian_numpy(self, mean: np.ndarray, greedy: np.ndarray | None):
        log_std = np.broadcast_to(self._numpy.log_std, mean.shape)
        noise = self._rng.standard_normal(mean.shape, dtype=np.float32)
        action = mean + noise * np.exp(log_std)
        if greedy is not None:
            action = np.where(greedy[:, None], mean, action)
        log_prob = numpy_inference_lib.gaussian_log_prob(action, mean, log_std)
        return action.reshape(-1, *self.action_space.shape), log_prob

    @property
    def _nvec(self) -> list[int]:
        return [int(n) for n in self.action_space.nvec.reshape(-1)]

    # ----------------------------------------------------------------- training
    def analyze(self, sample: SampleBatch, target: str = "ppo", **kwargs: Any) -> PPOAnalyzedResult:
        """For ``ppo``: :class:`PPOAnalyzedResult`; for ``impala``: its subset, IMPALA's."""
        if target == "impala":
            out = self.analyze(sample, target="ppo")
            return ImpalaAnalyzedResult(out.new_log_prob, out.old_log_prob, out.entropy, out.value)
        if target != "ppo":
            raise ValueError(
                f"ActorCriticPolicy analyzes for targets 'ppo' and 'impala', got '{target}'"
            )
        obs = self._normalized(self.to_tensor(sample.obs))
        steps, batch = sample.reward.shape[:2]
        hx = None
        if self._state_shape is not None:
            hx = self.to_tensor(sample.policy_state.hx)[0].float()
        on_reset = self._flags(sample.on_reset, (steps, batch))
        params, value, _ = self.net(obs, hx, on_reset.reshape(steps, batch, 1))
        mask = _mask_of(obs)
        dist = self._distribution(
            params.flatten(0, 1), None if mask is None else mask.flatten(0, 1)
        )
        action = self.to_tensor(sample.action).flatten(0, 1)
        if isinstance(self.action_space, gym.spaces.MultiDiscrete):
            action = action.reshape(len(action), -1)  # [N, k] whatever the space's shape
        if self._action_offset is not None:
            action = action - self._action_offset
        policy_output = self.to_tensor(sample.policy_output)
        return PPOAnalyzedResult(
            new_log_prob=dist.log_prob(action).reshape(steps, batch, 1),
            old_log_prob=policy_output.log_prob.float().reshape(steps, batch, 1),
            entropy=dist.entropy().reshape(steps, batch, 1),
            value=value,
            old_value=policy_output.value.float().reshape(steps, batch, 1),
        )

    # ----------------------------------------------------------------- normalisation
    def normalize_batch(self, batch: SampleBatch, gamma: float) -> torch.Tensor:
        """Update the running statistics with a training batch (tensors ``[T, B, ...]``) and
        return its rewards ``[T, B, 1]``, scaled when ``normalize_returns`` is on. Trainers
        call this once per batch, before computing advantages."""
        reward = batch.reward.float()
        if self.module.obs_norm is not None:
            self.module.obs_norm.update(batch.obs.flatten(0, 1))
        norm = self.module.return_norm
        if norm is None:
            return reward
        ended = batch.done.bool() | batch.truncated.bool()
        norm.update(discounted_returns(reward, ended, gamma))
        return reward / norm.std().to(reward.dtype)

    def _normalized(self, obs: Any) -> Any:
        norm = self.module.obs_norm
        return obs if norm is None else norm.normalize(obs)

    # ----------------------------------------------------------------- helpers
    def _distribution(self, params: torch.Tensor, mask: torch.Tensor | None) -> ActionDistribution:
        space = self.action_space
        if isinstance(space, HybridBox):
            return Hybrid.of(params, space.nvec.tolist(), self.module.log_std, mask)
        if isinstance(space, gym.spaces.Discrete):
            return Categorical(params, mask)
        if isinstance(space, gym.spaces.MultiDiscrete):
            return MultiDiscrete(params, [int(n) for n in space.nvec.reshape(-1)], mask)
        return DiagGaussian(params, self.module.log_std)

    def _env_action(self, action: torch.Tensor) -> np.ndarray:
        space = self.action_space
        if isinstance(space, gym.spaces.Box):
            return self.to_numpy(action).astype(np.float32).reshape(-1, *space.shape)
        action = self.to_numpy(action).astype(np.int64) + _action_start(space)
        return action.reshape(-1, *space.shape)  # a 2-d MultiDiscrete's choices as laid out

    def _initial_hx(self, state: NamedArray | None, batch: int) -> torch.Tensor | None:
        if self._state_shape is None:
            return None
        if state is None:
            return torch.zeros(batch, *self._state_shape, device=self.device)
        return self.to_tensor(state.hx).float()

    def _flags(self, flags: Any, lead: int | tuple[int, ...]) -> torch.Tensor:
        """Bool flags ``[*lead, 1]`` as a tensor; all False when absent."""
        if flags is None:
            lead = (lead,) if isinstance(lead, int) else lead
            return torch.zeros(*lead, 1, dtype=torch.bool, device=self.device)
        return self.to_tensor(flags).bool()


def _graphed_rollout(net, observation_space, action_space, device):
    """The graphed rollout on a GPU (None on the CPU); a clear error where it cannot apply."""
    missing = cuda_graphs.unsupported(net, observation_space, action_space)
    if missing:
        raise ValueError(f"cuda_graphs=True needs {missing}; set cuda_graphs=False")
    if device.type != "cuda":
        return None  # no GPU (a "cuda" policy falls back to the CPU): the eager way
    return cuda_graphs.GraphedRollout(net, observation_space, int(action_space.n), device)


def _action_start(space: gym.Space) -> np.ndarray | int:
    """The smallest action of a (Multi)Discrete space: distributions count from 0."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.start)
    return np.asarray(space.start, dtype=np.int64).reshape(-1)


def _add_time(obs: Any) -> Any:
    if isinstance(obs, NamedArray):
        return obs.apply(lambda x: x.unsqueeze(0))
    return obs.unsqueeze(0)


def _mask_of(obs: Any) -> torch.Tensor | None:
    if isinstance(obs, NamedArray) and ACTION_MASK_KEY in obs:
        return obs[ACTION_MASK_KEY].bool()
    if isinstance(obs, dict) and ACTION_MASK_KEY in obs:
        return obs[ACTION_MASK_KEY].bool()
    return None
