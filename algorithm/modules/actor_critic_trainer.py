"""What the actor-critic trainers on sample segments (PPO, IMPALA) have in common.

Both train a ``SingleModelPytorchPolicy`` with one Adam over its trainable parameters, may decay
the learning rate linearly over the run, split each batch into shuffled minibatches with one
clipped gradient step each, average the per-minibatch statistics once a step, and checkpoint
the optimizer with their step count. :class:`ActorCriticTrainer` holds that once, so the two
trainers differ only in their targets and losses (their ``step`` and ``_update``).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import numpy as np
import torch

from algorithm.modules.adam import load_adam_state, make_adam
from algorithm.policy import wait_for_gpu
from api.policy import Policy
from api.trainer import Trainer, set_learning_rate

logger = logging.getLogger(__name__)

PRECISIONS = ("float32", "bfloat16")
"""The precisions a trainer's forward and backward passes may run at (its ``precision`` arg)."""
LR_SCHEDULES = ("constant", "linear")
"""A trainer's learning-rate schedules; each trainer's signature spells them as a ``Literal``
(read from the source by the config check, which resolves no imported alias), so that a config
naming another is refused before launch and ``show-config`` lists them."""


def masked_mean(mask: torch.Tensor | None):
    """The loss's mean over valid steps. ``mask=None`` means every step is valid (feed-forward
    minibatches are drawn from valid transitions only), which saves the masking ops."""
    if mask is None:
        # an empty minibatch (no valid transition at all) gives 0, as the masked version does
        return lambda x: x.mean() if x.numel() else x.sum()
    valid = mask.bool()
    denom = mask.sum().clamp(min=1.0)

    def mean(x: torch.Tensor) -> torch.Tensor:
        # where, not a product: a masked-out step must not leak inf or nan (an untrained step's
        # log-prob may be -inf) into the loss
        return torch.where(valid, x, torch.zeros_like(x)).sum() / denom

    return mean


def _has_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes in bfloat16 natively: a GPU from Ampere on, a CPU whose oneDNN
    has bfloat16 kernels (AMX, AVX-512 BF16). True when it cannot tell."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return True
    return _cpu_has_bf16()


def _cpu_has_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return True


class ActorCriticTrainer(Trainer):
    """Base of :class:`~algorithm.ppo.trainer.PPOTrainer` and
    :class:`~algorithm.impala.trainer.ImpalaTrainer`; a subclass implements ``step``.

    Args:
        policy: the policy to train; it must expose ``parameters()`` (any
            ``algorithm.policy.SingleModelPytorchPolicy`` does).
        lr: Adam learning rate (the starting one under ``lr_schedule="linear"``).
        minibatches: gradient steps per pass over a batch.
        max_grad_norm: global gradient-norm clip.
        lr_schedule: ``"constant"`` or ``"linear"`` (to zero at ``total_steps`` trainer steps).
        total_steps: trainer steps of the whole run; needed by the linear schedule.
        adam_eps: Adam's epsilon.
        fused_adam: Adam's fused kernel (faster steps; see
            :func:`algorithm.modules.adam.adam_impl`).
        precision: ``"bfloat16"`` runs the policy's ``analyze`` (forward and backward) under
            autocast, so that convolutions and matrix products take bfloat16 inputs; weights,
            optimizer state and losses stay float32, and Troupe's actor-critic network keeps
            its heads (logits, values) in float32. Rollouts are unchanged. It pays on GPUs and
            on CPUs with bfloat16 units (AMX, AVX-512 BF16); elsewhere it is slower.
        seed: seeds the minibatch shuffling (None: derived from torch's current seed, so a run
            that seeds torch before building its trainer shuffles reproducibly).
        capturable: on a GPU, build Adam so that its step can be captured in a CUDA graph (its
            step counts on the device, its learning rate a device tensor that :meth:`_set_lr`
            fills); see :mod:`algorithm.modules.graphed_minibatches`. Ignored elsewhere.
    """

    accepts_device_batches = True

    def __init__(
        self,
        policy: Policy,
        *,
        lr: float,
        minibatches: int,
        max_grad_norm: float,
        lr_schedule: Literal["constant", "linear"] = "constant",
        total_steps: int | None = None,
        adam_eps: float = 1e-5,
        fused_adam: bool = False,
        precision: Literal["float32", "bfloat16"] = "float32",
        seed: int | None = None,
        capturable: bool = False,
    ):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be 'float32' or 'bfloat16', got '{precision}'")
        if lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be 'constant' or 'linear', got '{lr_schedule}'")
        if lr_schedule == "linear" and not total_steps:
            raise ValueError("lr_schedule='linear' needs total_steps (trainer steps of the run)")
        if minibatches < 1:
            raise ValueError(f"minibatches must be at least 1, got {minibatches}")
        if not callable(getattr(policy, "parameters", None)):
            raise TypeError(
                f"{type(self).__name__} needs a policy with parameters(); "
                f"{type(policy).__name__} has none. "
                "Subclass algorithm.policy.SingleModelPytorchPolicy."
            )
        self._policy = policy
        self.lr, self.lr_schedule, self.total_steps = lr, lr_schedule, total_steps
        self.minibatches, self.max_grad_norm = minibatches, max_grad_norm
        self._params = [p for p in policy.parameters() if p.requires_grad]
        self.capturable = capturable and self._device().type == "cuda"
        adam_lr = torch.tensor(lr, device=self._device()) if self.capturable else lr
        extra = {"capturable": True} if self.capturable else {}
        self.optimizer = make_adam(self._params, fused_adam, lr=adam_lr, eps=adam_eps, **extra)
        self._steps = 0
        self._rng = np.random.default_rng(torch.initial_seed() if seed is None else seed)
        self.precision = precision
        if precision == "bfloat16" and not _has_bf16(self._device()):
            logger.warning(
                "precision='bfloat16' on a %s without bfloat16 units: training will be slower "
                "than in float32",
                self._device().type.upper(),
            )

    @property
    def policy(self) -> Policy:
        return self._policy

    def _device(self) -> torch.device:
        return getattr(self._policy, "device", torch.device("cpu"))

    def _analyze(self, batch: Any) -> Any:
        """``policy.analyze(batch, target=analyze_target)`` at the trainer's ``precision``. The
        backward pass of what it returns follows the same casts."""
        device = self._device()
        with torch.autocast(
            device.type,
            torch.bfloat16,
            enabled=self.precision == "bfloat16",
            cache_enabled=not self.capturable,  # a graph must not keep autocast's cached casts
        ):
            return self._policy.analyze(batch, target=self.analyze_target)

    def _set_lr(self) -> float:
        """Set this step's learning rate on the optimizer and return it."""
        lr = self.lr
        if self.lr_schedule == "linear":
            lr = self.lr * max(0.0, 1.0 - self._steps / self.total_steps)
        set_learning_rate(self.optimizer, lr)  # in place if a captured Adam step reads it
        return lr

    def _minibatch_indices(
        self, count: int, device: torch.device, sort: bool = False, passes: int = 1
    ) -> list[torch.Tensor]:
        """:meth:`_minibatch_chunks` as index tensors on ``device``.

        Every pass's indices reach the device in **one** copy: PyTorch's copy from ordinary host
        memory to a GPU waits for the stream to drain, so one copy a minibatch would stop the
        trainer from queueing a minibatch's kernels while the GPU still runs the previous one's
        (on an H200 a Pong trainer spends its step launching kernels, BENCHMARKS.md)."""
        chunks = self._minibatch_chunks(count, sort, passes)
        flat = torch.as_tensor(np.concatenate(chunks), device=device)
        return list(flat.split([len(c) for c in chunks]))

    def _minibatch_chunks(self, count: int, sort: bool = False, passes: int = 1) -> list:
        """``passes`` passes, each a shuffle of ``count`` entries split into ``minibatches``
        numpy index arrays (fewer if there are fewer entries), each ascending if ``sort``."""
        chunks = []
        for _ in range(passes):
            order = self._rng.permutation(count)
            split = np.array_split(order, min(self.minibatches, max(count, 1)))
            chunks += [np.sort(c) if sort else c for c in split]
        return chunks

    def _gradient_step(self, loss: torch.Tensor) -> torch.Tensor:
        """Backpropagate ``loss``, clip the global gradient norm, step Adam; the norm before
        clipping."""
        for p in self._params:  # zero_grad(set_to_none=True) without the optimizer's overhead
            p.grad = None
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self._params, self.max_grad_norm)
        self.optimizer.step()
        return grad_norm

    @staticmethod
    def _mean_update_stats(rows: list[torch.Tensor], names: tuple[str, ...]) -> dict[str, float]:
        """Average the per-minibatch statistics rows (one tensor each, in ``names``' order) with
        one device-to-host read."""
        if not rows:
            return {}
        wait_for_gpu(rows[0].device)  # asleep: the step's kernels may still be running
        means = torch.stack(rows).double().mean(dim=0).tolist()
        return dict(zip(names, means, strict=True))

    def _finish_step(self) -> int:
        """One trainer step is one version: count it, return the step number."""
        self._policy.inc_version()
        self._steps += 1
        return self._steps

    # ----------------------------------------------------------------- checkpoints
    def get_checkpoint(self) -> dict[str, Any]:
        state = self.optimizer.state_dict()
        # a capturable Adam's learning rate is a device tensor; a checkpoint holds the number
        groups = [{**g, "lr": float(g["lr"])} for g in state["param_groups"]]
        return {"optimizer": {**state, "param_groups": groups}, "steps": self._steps}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        load_adam_state(self.optimizer, checkpoint["optimizer"])
        if self.capturable:
            for group in self.optimizer.param_groups:
                group["lr"] = torch.tensor(float(group["lr"]), device=self._device())
        self._steps = int(checkpoint["steps"])
