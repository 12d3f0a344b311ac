"""DQN (Mnih et al., 2015) with double Q-learning, n-step targets and prioritised replay weights.

One :meth:`DQNTrainer.step` takes a :class:`~api.replay.TransitionBatch` sampled from a replay
buffer (``system.replay``), whose n-step returns are already summed::

    a*      = argmax_a Q_online(next_obs, a)      (double DQN; plain DQN: argmax of Q_target)
    y       = reward + discount * Q_target(next_obs, a*)
    loss    = mean(weight * huber(Q_online(obs, action) - y))

then clips the gradient norm, takes an Adam step, moves the target network every
``target_update_every`` steps (``tau=1``: a copy; ``tau<1``: Polyak averaging) and calls
``policy.inc_version()``. ``discount`` is ``gamma ** k`` (0 at a terminal), so the trainer has no
``gamma`` of its own: the buffer's ``n_step`` and ``gamma`` define the target.

After each step :attr:`DQNTrainer.priorities` holds ``|y - Q|`` per transition, row for row the
batch: hand them to ``ReplayBuffer.update_priorities(batch.key, trainer.priorities)``.

A policy serves this trainer by returning :class:`DQNAnalyzedResult` from ``analyze(transitions,
target="dqn")`` and providing ``parameters()``, ``update_target(tau)`` and ``inc_version()``
(``algorithm.q_policies.policy.QPolicy`` does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from algorithm.modules.adam import load_adam_state, make_adam
from algorithm.modules.device_batch import on_device
from algorithm.policy import wait_for_gpu
from api.policy import Policy
from api.replay import TransitionBatch, require_transitions
from api.trainer import Trainer, TrainerStepResult


@dataclass
class DQNAnalyzedResult:
    """What ``policy.analyze(transitions, target="dqn")`` returns, for a batch of ``B``."""

    q: torch.Tensor
    """``[B, A]`` online Q-values at ``obs`` (with gradient)."""
    action: torch.Tensor
    """``[B]`` int64: the actions taken, counted from 0 (as columns of ``q``)."""
    next_q_online: torch.Tensor
    """``[B, A]`` online Q-values at ``next_obs`` (no gradient; double DQN's argmax)."""
    next_q_target: torch.Tensor
    """``[B, A]`` target-network Q-values at ``next_obs`` (no gradient)."""


class DQNTrainer(Trainer):
    """Double DQN on replayed n-step transitions.

    Args:
        policy: the Q policy to train (see the module docstring for what it must provide).
        lr: Adam learning rate.
        double: pick the bootstrap action with the online network (double DQN).
        target_update_every: trainer steps between target-network updates.
        tau: how far each update moves the target towards the online network (1.0: a copy).
        huber_delta: where the Huber loss turns from quadratic to linear.
        max_grad_norm: global gradient-norm clip (None: no clip).
        adam_eps: Adam's epsilon.
    """

    AnalyzedResult = DQNAnalyzedResult
    analyze_target = "dqn"
    needs_replay = True
    accepts_device_batches = True
    learning_rates = {"lr": "optimizer"}
    arg_ranges = {
        "lr": "(0, inf)", "target_update_every": "[1, inf)", "tau": "(0, 1]",
        "huber_delta": "(0, inf)", "max_grad_norm": "(0, inf)", "adam_eps": "(0, inf)",
    }  # fmt: skip

    def __init__(
        self,
        policy: Policy,
        lr: float = 2.5e-4,
        double: bool = True,
        target_update_every: int = 500,
        tau: float = 1.0,
        huber_delta: float = 1.0,
        max_grad_norm: float | None = 10.0,
        adam_eps: float = 1e-8,
    ):
        if target_update_every < 1:
            raise ValueError(f"target_update_every must be at least 1, got {target_update_every}")
        if not 0.0 < tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {tau}")
        if not callable(getattr(policy, "update_target", None)):
            raise TypeError(
                f"DQNTrainer needs a policy with update_target(tau); {type(policy).__name__} has "
                "none. Use the q-network policy or give yours a target network."
            )
        self._policy = policy
        self.double, self.tau = double, tau
        self.target_update_every = target_update_every
        self.huber_delta, self.max_grad_norm = huber_delta, max_grad_norm
        self._params = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = make_adam(self._params, fused=True, lr=lr, eps=adam_eps)
        self._steps = 0
        self.priorities: np.ndarray | None = None
        """``[B]`` new priorities (absolute TD errors) of the last step's batch."""

    @property
    def policy(self) -> Policy:
        return self._policy

    def step(self, samples: TransitionBatch) -> TrainerStepResult:
        require_transitions(samples, "DQNTrainer")
        device = getattr(self._policy, "device", torch.device("cpu"))
        batch = on_device(samples, device)
        self._policy.train_mode()
        out: DQNAnalyzedResult = self._policy.analyze(batch, target=self.analyze_target)
        with torch.no_grad():
            chooser = out.next_q_online if self.double else out.next_q_target
            best = chooser.argmax(dim=-1, keepdim=True)
            bootstrap = out.next_q_target.gather(-1, best)
            target = batch.reward.float() + batch.discount.float() * bootstrap
        q = out.q.gather(-1, out.action.reshape(-1, 1))
        huber = F.huber_loss(q, target, reduction="none", delta=self.huber_delta)
        loss = huber.mean() if batch.weight is None else (batch.weight.float() * huber).mean()
        for p in self._params:
            p.grad = None
        loss.backward()
        grad_norm = self._clip()
        self.optimizer.step()
        self._steps += 1
        if self._steps % self.target_update_every == 0:
            self._policy.update_target(self.tau)
        # No policy lag: replayed samples are old by design. The trainer worker reports how
        # old (``sample_age_versions``, from its replay source).
        self._policy.inc_version()
        with torch.no_grad():
            error = (q - target).abs().reshape(-1)
            # one device-to-host read for all the statistics
            means = torch.stack([loss, q.mean(), target.mean(), error.mean(), grad_norm])
        wait_for_gpu(error.device)  # asleep, not spinning, while the step's kernels run
        self.priorities = error.cpu().numpy()
        names = ("loss", "q_mean", "target_mean", "td_abs_mean", "grad_norm")
        stats = dict(zip(names, means.double().tolist(), strict=True))
        # No epsilon here: this copy of the policy acts on nothing, so its schedule never
        # moves (it read 0.9998 at 29k frames); the policy workers report the one they use.
        return TrainerStepResult(stats=stats, step=self._steps)

    def _clip(self) -> torch.Tensor:
        """The global gradient norm before clipping (clipped to ``max_grad_norm`` if set)."""
        limit = float("inf") if self.max_grad_norm is None else self.max_grad_norm
        return torch.nn.utils.clip_grad_norm_(self._params, limit)

    def get_checkpoint(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "steps": self._steps}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        load_adam_state(self.optimizer, checkpoint["optimizer"])
        self._steps = int(checkpoint["steps"])
