"""``QPolicy`` (registered as ``q-network``): action values for a Discrete action space.

* The network: :class:`~algorithm.modules.encoders.ObservationEncoder` (MLP, CNN for images,
  Dict per key) and a head with one output per action; with ``dueling=True`` the head is split
  into a state value and action advantages, ``Q = V + A - mean(A)`` (Wang et al., 2016).
* A target network, a frozen copy of the online one, lives in the same module, so checkpoints
  carry it and a resumed run keeps its targets; the trainer moves it with :meth:`update_target`.
* Exploration is epsilon-greedy: a uniformly random action with probability ``epsilon``, which
  falls linearly from ``start`` to ``end`` over ``decay_frames`` frames that *this policy* has
  acted on (it counts the training rows of every ``rollout``; evaluation rows are greedy and not
  counted). The trainer's copy follows the replay worker's count of the run's frames, and the
  count travels in checkpoints, so every policy worker, a restarted one and a resumed run's
  too, follows one schedule (:mod:`algorithm.modules.exploration`).
* Held exploration (``explore_hold`` > 1): a random action, once drawn, is repeated for that
  many of its agent's steps before epsilon is asked again (per request client id: environment
  and agent). One random step at a time dithers in place; a held push is what carries a car up
  a hill (MountainCar-v0), as in temporally extended epsilon-greedy (Dabney et al., 2021).
* A Dict observation with an ``action_mask`` key (True or 1 = legal) restricts every choice:
  the greedy action is the best legal one, an exploratory one is uniform over the legal ones,
  and the bootstrap of :meth:`QPolicy.analyze` maximises over ``next_obs``'s legal actions (a
  row with no legal action falls back to all of them). A board game ends on an illegal move.
* ``policy_output.q``: the online Q-value of the chosen action, ``[B, 1]`` (for statistics).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from algorithm.dqn.trainer import DQNAnalyzedResult
from algorithm.modules import numpy_inference as numpy_inference_lib
from algorithm.modules.encoders import ACTION_MASK_KEY, ObservationEncoder
from algorithm.modules.exploration import CountsExploration
from algorithm.modules.init import orthogonal_init
from algorithm.policy import SingleModelPytorchPolicy
from api import namedarray as namedarray_lib
from api.namedarray import namedarray
from api.policy import RolloutRequest, RolloutResult
from api.replay import require_transitions

ILLEGAL_Q = -1e8
"""What an illegal action's Q-value becomes in the bootstrap: finite, so a discount of 0 times
it stays 0."""


@dataclass
class EpsilonSchedule:
    """Linear epsilon decay over the frames a policy has acted on."""

    start: float = 1.0
    """Epsilon at frame 0."""
    end: float = 0.05
    """Epsilon from ``decay_frames`` on."""
    decay_frames: int = 10_000
    """Frames over which epsilon falls from ``start`` to ``end``."""

    def __post_init__(self):
        for name in ("start", "end"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"epsilon.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.decay_frames < 0:
            raise ValueError(f"epsilon.decay_frames must be >= 0, got {self.decay_frames}")

    def value(self, frames: int) -> float:
        if frames >= self.decay_frames:
            return self.end
        return self.start + (self.end - self.start) * frames / self.decay_frames


@namedarray
class QOutput:
    """What a Q policy reports from rollout: ``q`` ``[B, 1]``, the chosen action's value."""

    q: np.ndarray


class QNet(nn.Module):
    """``forward(obs [N, ...]) -> Q [N, actions]``, plain or dueling."""

    def __init__(self, observation_space, actions, hidden_sizes, activation, dueling):
        super().__init__()
        self.encoder = ObservationEncoder(observation_space, hidden_sizes, activation)
        width = self.encoder.out_features
        self.dueling = dueling
        self.head = orthogonal_init(nn.Linear(width, actions), gain=1.0)
        self.value = orthogonal_init(nn.Linear(width, 1), gain=1.0) if dueling else None

    def forward(self, obs: Any) -> torch.Tensor:
        features = self.encoder(obs)
        q = self.head(features)
        if self.value is None:
            return q
        # centring the advantages makes V and A identifiable (otherwise any constant can move)
        return self.value(features) + q - q.mean(dim=-1, keepdim=True)


class QNetworks(nn.Module):
    """The online network and its target, as one module (one checkpoint)."""

    def __init__(self, online: QNet):
        super().__init__()
        self.online = online
        self.target = copy.deepcopy(online).requires_grad_(False)

    def forward(self, obs: Any) -> torch.Tensor:
        return self.online(obs)


class QPolicy(CountsExploration, SingleModelPytorchPolicy):
    """Q-network policy for DQN; see the module docstring.

    Args:
        observation_space: the agent's observation space (filled in by the runtime).
        action_space: the agent's action space, Discrete (filled in by the runtime).
        hidden_sizes: widths of the encoder MLP.
        activation: ``relu``, ``tanh``, ``elu`` or ``gelu``.
        dueling: split the head into state value and action advantages.
        epsilon: the exploration schedule, an :class:`EpsilonSchedule` or a dict of its fields.
        device: ``cpu`` or ``cuda`` (falls back to the CPU when no GPU is available).
        seed: seeds parameter initialisation and exploration.
        numpy_inference: act through a numpy copy of the online network where it applies
            (vector, one-hot and board observations, MLP trunks, the CPU;
            :mod:`algorithm.modules.numpy_inference`): the same Q-values up to float rounding,
            at a fraction of torch's per-call cost on small batches.
        explore_hold: steps a random exploratory action is held for its agent (1: a fresh
            epsilon draw every step, plain epsilon-greedy). Epsilon is then the chance that a
            hold starts, so more than epsilon of the steps are random: about
            ``h * e / (1 - e + h * e)`` for a hold of ``h`` and epsilon ``e``.
    """

    arg_ranges = {"hidden_sizes": "[1, inf)", "seed": "[0, inf)", "explore_hold": "[1, inf)"}

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        hidden_sizes: Sequence[int] = (120, 84),
        activation: str = "relu",
        dueling: bool = False,
        epsilon: EpsilonSchedule | dict | None = None,
        device: str = "cpu",
        seed: int | None = None,
        numpy_inference: bool = True,
        explore_hold: int = 1,
    ):
        if not isinstance(action_space, gym.spaces.Discrete):
            raise TypeError(
                f"q-network needs a Discrete action space, got {action_space}; for Box actions "
                "use sac-policy (or actor-critic)"
            )
        self.observation_space, self.action_space = observation_space, action_space
        self.epsilon = _schedule(epsilon)
        if int(explore_hold) < 1:
            raise ValueError(f"explore_hold must be 1 or more (steps), got {explore_hold!r}")
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            online = QNet(
                observation_space, int(action_space.n), tuple(hidden_sizes), activation, dueling
            )
        super().__init__(QNetworks(online), device=device)
        self._rng = np.random.default_rng(seed)
        self.explore_frames = 0
        self.explore_hold = int(explore_hold)
        self._held: dict[Any, tuple[int, int]] = {}
        """Per client id: the exploratory action it holds and the steps it has left."""
        self._numpy = None
        if numpy_inference and numpy_inference_lib.supports_q(self.module.online, self.device):
            self._numpy = numpy_inference_lib.NumpyQNet(self.module.online)

    # ----------------------------------------------------------------- acting
    def rollout(self, request: RolloutRequest, **kwargs: Any) -> RolloutResult:
        q = self._q_values(request.obs)
        legal = _legal(numpy_inference_lib.action_mask(request.obs))
        action = (q if legal is None else np.where(legal, q, -np.inf)).argmax(axis=-1)
        explore = np.ones(len(action), dtype=bool)
        if request.is_evaluation is not None:
            explore = ~np.asarray(request.is_evaluation, dtype=bool).reshape(-1)
        random = explore & (self._rng.random(len(action)) < self.current_epsilon)
        if legal is None:
            fresh = self._rng.integers(q.shape[-1], size=len(action))
        else:  # uniform over each row's legal actions
            fresh = np.where(legal, self._rng.random(legal.shape), -1.0).argmax(axis=-1)
        if self.explore_hold > 1 and request.client_id is not None:
            random, fresh = self._hold(request.client_id, explore, random, fresh, legal)
        action = np.where(random, fresh, action)
        self.explore_frames += int(explore.sum())
        return RolloutResult(
            action=action.astype(np.int64) + int(self.action_space.start),
            policy_output=QOutput(q=np.take_along_axis(q, action[:, None], axis=-1)),
            client_id=request.client_id,
            request_id=request.request_id,
        )

    def _hold(
        self, client_id: Any, explore, random, fresh, legal=None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows whose client still holds an exploratory action repeat it (while it is legal);
        a row that starts one (``random``) holds its ``fresh`` action for ``explore_hold``
        steps."""
        random, fresh = random.copy(), fresh.copy()
        for i, client in enumerate(np.asarray(client_id).reshape(-1).tolist()):
            if not explore[i]:
                continue
            held, left = self._held.get(client, (0, 0))
            if left > 0 and (legal is None or legal[i, held]):
                random[i], fresh[i] = True, held
                self._held[client] = (held, left - 1)
            elif random[i]:
                self._held[client] = (int(fresh[i]), self.explore_hold - 1)
        return random, fresh

    def _q_values(self, obs: Any) -> np.ndarray:
        """The online network's ``[B, actions]``: through its numpy copy where it applies
        (refreshed if the weights moved), else through torch."""
        if self._numpy is not None:
            self._numpy.refresh(self._version)
            return self._numpy.forward(obs)
        with torch.no_grad():
            return self.to_numpy(self.module.online(self.to_tensor(obs)))

    @property
    def current_epsilon(self) -> float:
        return self.epsilon.value(self.explore_frames)

    # ----------------------------------------------------------------- training
    def analyze(self, sample: Any, target: str = "dqn", **kwargs: Any) -> DQNAnalyzedResult:
        """Q-values of a :class:`~api.replay.TransitionBatch`: online at ``obs`` (with
        gradient), online and target at ``next_obs`` (without).

        The online network sees ``obs`` and ``next_obs`` in one pass: at replay batch sizes a
        pass costs its layers' fixed overhead more than its rows. Only the ``obs`` half reaches
        the loss, so only it is learned from; under data-parallel training the pass goes
        through ``self.net`` as before.
        """
        if target != "dqn":
            raise ValueError(f"QPolicy analyzes for target 'dqn' only, got '{target}'")
        require_transitions(sample, "QPolicy")
        obs, next_obs = self.to_tensor(sample.obs), self.to_tensor(sample.next_obs)
        rows = len(sample.action)
        both = self.net(_concatenate(obs, next_obs))
        q, next_q_online = both[:rows], both[rows:].detach()
        with torch.no_grad():
            next_q_target = self.module.target(next_obs)
            if not isinstance(next_obs, torch.Tensor) and ACTION_MASK_KEY in next_obs:
                # the bootstrap maximises over the legal actions alone
                illegal = ~_legal(next_obs[ACTION_MASK_KEY].bool().reshape(rows, -1))
                next_q_online = next_q_online.masked_fill(illegal, ILLEGAL_Q)
                next_q_target = next_q_target.masked_fill(illegal, ILLEGAL_Q)
        action = self.to_tensor(sample.action).long().reshape(-1) - int(self.action_space.start)
        return DQNAnalyzedResult(
            q=q,
            action=action,
            next_q_online=next_q_online,
            next_q_target=next_q_target,
        )

    def parameters(self):
        """The online network's parameters: what the optimiser updates."""
        return self.module.online.parameters()

    @torch.no_grad()
    def update_target(self, tau: float = 1.0) -> None:
        """``target <- tau * online + (1 - tau) * target`` (1.0: a copy)."""
        online, target = self.module.online.parameters(), self.module.target.parameters()
        for o, t in zip(online, target, strict=True):
            t.lerp_(o, tau)


def _legal(mask: Any) -> Any:
    """``[B, n]`` legal actions from an action mask (numpy or torch), a row with none legal
    taken as all legal; None for no mask."""
    if mask is None:
        return None
    if isinstance(mask, np.ndarray):
        return mask | ~mask.any(-1, keepdims=True)
    return mask | ~mask.any(dim=-1, keepdim=True)


def _concatenate(first: Any, second: Any) -> Any:
    """Two batches of observations as one: tensors, or NamedArrays of them (Dict spaces)."""
    if isinstance(first, torch.Tensor):
        return torch.cat([first, second])
    return namedarray_lib.concatenate([first, second])


def _schedule(epsilon: EpsilonSchedule | dict | None) -> EpsilonSchedule:
    if epsilon is None:
        return EpsilonSchedule()
    if isinstance(epsilon, EpsilonSchedule):
        return epsilon
    try:
        return EpsilonSchedule(**epsilon)
    except TypeError as e:
        raise ValueError(
            f"epsilon must be a dict of start, end, decay_frames; got {epsilon!r} ({e})"
        ) from e
