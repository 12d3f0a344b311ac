"""``SingleModelPytorchPolicy``: the base class for a policy that is one torch ``nn.Module``.

It does the bookkeeping every such policy needs: device placement, the version counter, checkpoints,
train/eval switches and data-parallel wrapping. A subclass says only how to act and how to analyse.

Writing your own policy
-----------------------
1. Build your network as one ``nn.Module`` whose ``forward`` is what training differentiates
   through (under data-parallel training only calls through ``self.net`` synchronise gradients).
2. Subclass and pass the module to ``super().__init__(model, device=device)``.
3. Implement the three methods of ``api.policy.Policy``:

   * ``default_policy_state``: ``None`` for a memoryless policy, else a NamedArray whose leaves have
     a leading batch dimension of 1 (an agent that has just spawned).
   * ``rollout(request)``: under ``torch.no_grad()``, turn ``request.obs`` ``[B, ...]`` into
     actions ``[B, ...]`` (use :meth:`to_tensor` once on the inputs and :meth:`to_numpy` on the
     outputs), play greedily where ``request.is_evaluation`` is set, reset the memory of the rows
     where ``request.on_reset`` is set, and return an ``api.policy.RolloutResult`` with
     ``policy_output`` holding what your trainer needs later (PPO: ``log_prob`` and ``value``,
     ``[B, 1]`` each).
   * ``analyze(sample, target)``: re-evaluate a ``SampleBatch`` (every field ``[T, B, ...]``)
     through ``self.net`` *with* gradients and return the trainer's declared ``AnalyzedResult``
     (``algorithm.ppo.trainer.PPOTrainer.AnalyzedResult`` for PPO).

A minimal feed-forward PPO policy for a Discrete action space::

    import torch
    from algorithm.actor_critic_policies.policy import ActorCriticOutput
    from algorithm.modules.distributions import Categorical
    from algorithm.policy import SingleModelPytorchPolicy
    from algorithm.ppo.trainer import PPOTrainer
    from api.policy import RolloutResult

    class MyPolicy(SingleModelPytorchPolicy):
        def __init__(self, observation_space, action_space, device="cpu"):
            net = MyNet(observation_space.shape[0], action_space.n)  # returns (logits, value)
            super().__init__(net, device=device)

        def rollout(self, request, **kwargs):
            with torch.no_grad():
                logits, value = self.module(self.to_tensor(request.obs))
                dist = Categorical(logits)
                greedy = self.to_tensor(request.is_evaluation).reshape(-1)
                action = torch.where(greedy, dist.mode(), dist.sample())
                out = ActorCriticOutput(log_prob=dist.log_prob(action), value=value)
            return RolloutResult(action=self.to_numpy(action), policy_output=self.to_numpy(out))

        def analyze(self, sample, target="ppo", **kwargs):
            obs = self.to_tensor(sample.obs)
            steps, batch = obs.shape[:2]
            logits, value = self.net(obs.flatten(0, 1))
            dist = Categorical(logits)
            action = self.to_tensor(sample.action).flatten()
            old = self.to_tensor(sample.policy_output)
            return PPOTrainer.AnalyzedResult(
                new_log_prob=dist.log_prob(action).view(steps, batch, 1),
                old_log_prob=old.log_prob,
                entropy=dist.entropy().view(steps, batch, 1),
                value=value.view(steps, batch, 1),
                old_value=old.value,
            )

Register it (``api.policy.register("my-policy", "my_package.policies:MyPolicy")``) and check it
with ``api.testing.test_pipeline("CartPole-v1", "my-policy", "ppo")``.

``get_checkpoint`` returns ``{"version": int, "model": state_dict}``; a subclass holding more than
the module (e.g. running normalisation statistics) extends both checkpoint methods.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from api.namedarray import NamedArray
from api.policy import Policy

# Observations arrive as read-only views of received messages and shared-memory slots, which
# torch.as_tensor shares without a copy (and warns about, once per process, in every worker's
# log). A policy reads its inputs and never writes them in place, so the warning says nothing.
warnings.filterwarnings(
    "ignore", message="The given NumPy array is not writable", category=UserWarning
)


def resolve_device(device: str | torch.device) -> torch.device:
    """The device to use: ``"cuda"`` without an available GPU falls back to the CPU."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        return torch.device("cpu")
    if device.type == "cuda":
        tune_cuda()
    return device


def wait_for_gpu(device: torch.device) -> None:
    """Sleep until the GPU has done the work queued on it so far (no-op on the CPU).

    Reading a GPU result (``.cpu()``, ``.tolist()``) waits for it as well, but CUDA's default
    wait spins a CPU core for as long as the GPU works. A policy worker reads hundreds of
    batches a second and a trainer its statistics after every step, so on a machine whose
    cores also step environments that spinning takes them from the actors (and from their
    hyperthread siblings). A blocking event sleeps until the GPU signals it instead; it costs
    some microseconds of wake-up, against milliseconds of a core.
    """
    if device.type == "cuda":
        event = torch.cuda.Event(blocking=True)
        event.record(torch.cuda.current_stream(device))
        event.synchronize()


def _on_cuda(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cuda"


def _leaves_to_numpy(value: Any) -> Any:
    if isinstance(value, NamedArray):
        return value.apply(_leaves_to_numpy)
    return value.detach().cpu().numpy()


def tune_cuda() -> None:
    """Let matrix products run in TF32, the tensor cores' float32 format (10-bit mantissa: an RL
    loss does not notice; several times the float32 rate on Ampere and later), as PyTorch
    already lets convolutions. A process-wide switch, hence set once here, where a process
    picks a GPU. (cuDNN's autotuner stays off: a policy worker's batches come in dozens of
    sizes, and each new one would stall it while the algorithms are timed.)"""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


class SingleModelPytorchPolicy(Policy):
    """A policy made of one ``nn.Module``; see the module docstring for how to subclass it."""

    def __init__(self, model: nn.Module, device: str | torch.device = "cpu"):
        self._device = resolve_device(device)
        self._module = model.to(self._device)
        self._net: nn.Module = self._module
        self._version = 0

    # ----------------------------------------------------------------- the model
    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def module(self) -> nn.Module:
        """The bare module: use it for inference and state dicts."""
        return self._module

    @property
    def net(self) -> nn.Module:
        """The module to differentiate through: the data-parallel wrapper once set up."""
        return self._net

    def parameters(self) -> Iterator[nn.Parameter]:
        """Trainable parameters (what a trainer's optimiser updates)."""
        return self._module.parameters()

    @property
    def parameter_count(self) -> int:
        return sum(p.numel() for p in self._module.parameters())

    def distributed_setup(self, process_group: Any = None) -> None:
        """Wrap the module for data-parallel training across the trainers of one policy.

        Call after ``torch.distributed.init_process_group`` (or pass a group). Gradients are then
        averaged across the group during ``backward`` of anything computed through :attr:`net`;
        :attr:`module` stays the unwrapped model for rollout and checkpoints.
        """
        device_ids = [self._device.index or 0] if self._device.type == "cuda" else None
        self._net = nn.parallel.DistributedDataParallel(
            self._module, device_ids=device_ids, process_group=process_group
        )

    def distributed_teardown(self) -> None:
        """Drop the data-parallel wrapper; :attr:`net` is the plain module again.

        Call before ``torch.distributed.destroy_process_group``: the wrapper's reducer holds the
        process group, and a group freed with the wrapper after it was destroyed joins gloo's
        threads in its destructor, which once never returned (a hung CI run)."""
        self._net = self._module

    # ----------------------------------------------------------------- conversions
    def to_tensor(self, value: Any) -> Any:
        """numpy arrays (or NamedArrays of them, or None) to tensors on this policy's device."""
        if value is None:
            return None
        if isinstance(value, NamedArray):
            return value.apply(self.to_tensor)
        if isinstance(value, torch.Tensor):
            return value.to(self._device)
        return torch.as_tensor(np.asarray(value), device=self._device)

    @staticmethod
    def to_numpy(value: Any) -> Any:
        """Tensors (or NamedArrays of them, or None) back to numpy arrays; from a GPU, after one
        sleeping wait for the work queued there (:func:`wait_for_gpu`)."""
        if value is None:
            return None
        leaves = [v for _, v in value.flatten()] if isinstance(value, NamedArray) else [value]
        cuda = next((leaf for leaf in leaves if _on_cuda(leaf)), None)
        if cuda is not None:
            wait_for_gpu(cuda.device)
        return _leaves_to_numpy(value)

    # ----------------------------------------------------------------- Policy contract
    @property
    def version(self) -> int:
        return self._version

    def inc_version(self) -> None:
        self._version += 1

    def get_checkpoint(self) -> dict[str, Any]:
        return {
            "version": self._version,
            "model": {k: v.detach().cpu().clone() for k, v in self._module.state_dict().items()},
        }

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Parameters that crossed a socket arrive as numpy arrays: make them tensors again.
        state = {k: torch.as_tensor(v) for k, v in checkpoint["model"].items()}
        self._module.load_state_dict(state)
        self._version = int(checkpoint["version"])

    def train_mode(self) -> None:
        # Trainers call this every step: walking the module tree costs more than a small
        # network's backward pass (5% of a cartpole-dqn trainer's time), so only on a change.
        if not self._module.training:
            self._module.train()

    def eval_mode(self) -> None:
        if self._module.training:
            self._module.eval()
