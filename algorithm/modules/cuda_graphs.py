"""An actor-critic rollout replayed as CUDA graphs: one launch a batch instead of dozens.

Why: a policy worker on a GPU answers hundreds of small batches a second, and each rollout of a
Nature CNN is some thirty kernels (the scaling of the pixels, three convolutions, the linear
layers, the softmax, the sampling, the copies back), each costing the CPU Python and driver time
to launch while the GPU finishes it in microseconds. On a 16-core H200 machine the two policy
workers of ``pong-ppo-gpu`` took 1.78 cores, cores its actors lacked (BENCHMARKS.md, issue 23).
A captured graph replays the whole rollout with one launch.

How:

* one graph per **bucket** of rows, the powers of two from :data:`MIN_BUCKET` up to
  ``max_rows``, captured the first time a batch of that size comes; a batch is copied into its
  bucket's static input and padded with whatever rows were there before. In evaluation mode the
  rows of a feed-forward network are independent (no batch statistics), so the padding rows'
  outputs are computed and dropped, and never touch the real rows'. A batch larger than the
  largest bucket goes the eager way;
* **Gumbel-max sampling**: ``argmax(log p + g)`` with ``g = -log(-log u)``, ``u`` uniform, is a
  draw from the categorical ``p``. ``u`` is drawn before the replay, outside the graph, from the
  policy's own generator, so a seeded policy stays reproducible and the graph holds no random
  state. Rows flagged greedy (evaluation) take ``argmax(log p)``;
* the **weights are read in place**: ``load_state_dict`` copies a new version into the same
  tensors, so a policy worker's new parameters need no new capture;
* the action, its log-probability and the value leave the GPU as **one** ``[rows, 3]`` float32
  copy (actions are small integers: exact in float32);
* every copy goes through **pinned** host buffers, queued without waiting, and the batch ends in
  one sleeping wait. A copy from ordinary (pageable) memory makes the CPU wait for the GPU, and
  CUDA's default wait spins: py-spy put 22% of a policy worker's time in the two such copies
  of an earlier version, on the H200 machine.

What applies: a feed-forward network (no GRU), one ``Discrete`` action, an observation that is
one array (not a Dict: no action mask), no observation normalisation, no mirror, on a GPU.
:func:`unsupported` says what is missing; elsewhere the policy acts the eager way.

Without a GPU the same buckets, static buffers and padding run as plain calls (``capture=False``),
which is how the tests on a CPU check everything but the capture itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from algorithm.policy import wait_for_gpu

MIN_BUCKET = 8
"""The smallest bucket: a batch of 1-8 rows replays the 8-row graph."""


def unsupported(net: nn.Module, observation_space: gym.Space, action_space: gym.Space) -> str:
    """Why :class:`GraphedRollout` cannot act for this network and these spaces ("" if it can)."""
    if not isinstance(action_space, gym.spaces.Discrete):
        return f"one Discrete action, not {type(action_space).__name__}"
    if not isinstance(observation_space, gym.spaces.Box):
        return f"one observation array (a Box), not {type(observation_space).__name__}"
    if getattr(net.actor_body, "rnn", None) is not None:
        return "a feed-forward network (rnn_hidden=0)"
    if getattr(net, "obs_norm", None) is not None:
        return "observations as they come (normalize_obs=False)"
    if getattr(net, "mirror", None) is not None:
        return "no mirror (mirror_actions empty)"
    return ""


def sample_rows(
    net: nn.Module, obs: torch.Tensor, uniform: torch.Tensor, greedy: torch.Tensor
) -> torch.Tensor:
    """One rollout of ``rows`` observations: ``[rows, 3]`` of action, log-prob and value.

    ``uniform`` ``[rows, actions]`` in [0, 1) is the sampling noise; ``greedy`` ``[rows]`` bool
    picks the most likely action instead. No operation here waits on the GPU, so it can be
    captured."""
    rows = obs.shape[0]
    flags = torch.zeros(1, rows, 1, dtype=torch.bool, device=obs.device)
    params, value, _ = net(obs.unsqueeze(0), None, flags)
    log_probs = torch.log_softmax(params[0].float(), dim=-1)
    gumbel = -torch.log(-torch.log(uniform))
    action = torch.where(greedy, log_probs.argmax(-1), (log_probs + gumbel).argmax(-1))
    log_prob = log_probs.gather(-1, action[:, None])
    return torch.cat([action[:, None].float(), log_prob, value[0].float()], dim=1)


@dataclass
class _Bucket:
    """The static buffers of one bucket and, on a GPU, the graph that reads and writes them."""

    obs: torch.Tensor
    uniform: torch.Tensor
    greedy: torch.Tensor
    host_obs: np.ndarray
    """Staging for ``obs`` (pinned on a GPU): a numpy view, filled without torch's dispatch."""
    host_greedy: np.ndarray
    host_out: torch.Tensor
    out: torch.Tensor | None = None
    graph: torch.cuda.CUDAGraph | None = None


class GraphedRollout:
    """Acts for a feed-forward actor-critic network through one captured graph per bucket.

    Args:
        net: the policy's module (in evaluation mode when acting).
        observation_space: a Box: the static input's shape and dtype.
        actions: the number of discrete actions.
        max_rows: the largest bucket; larger batches are refused (:meth:`act` returns None).
        capture: capture CUDA graphs (on a GPU); False runs the same buffers as plain calls.
    """

    def __init__(
        self,
        net: nn.Module,
        observation_space: gym.spaces.Box,
        actions: int,
        device: torch.device,
        max_rows: int = 1024,
        capture: bool = True,
    ):
        self.net, self.device, self.actions = net, device, int(actions)
        self.obs_shape = tuple(observation_space.shape)
        self.obs_dtype = torch.from_numpy(np.zeros(0, dtype=observation_space.dtype)).dtype
        self.max_rows = max(MIN_BUCKET, 1 << (max(int(max_rows), 1) - 1).bit_length())
        self.capture = bool(capture) and device.type == "cuda"
        self.buckets: dict[int, _Bucket] = {}
        self._pool = None  # one memory pool shared by every bucket's graph

    def act(
        self, obs: np.ndarray, greedy: np.ndarray | None, generator: torch.Generator | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Actions ``[rows]`` int64 (counted from 0), log-probs and values ``[rows, 1]``
        float32; None when this batch cannot go through a graph (eager instead)."""
        rows = len(obs)
        if (
            rows == 0
            or rows > self.max_rows
            or not isinstance(obs, np.ndarray)
            or obs.shape[1:] != self.obs_shape
        ):
            return None
        bucket = self._bucket(max(MIN_BUCKET, 1 << (rows - 1).bit_length()))
        self._stage(bucket, obs, greedy)
        torch.rand(bucket.uniform.shape, generator=generator, out=bucket.uniform)
        self._run(bucket)
        out = self._fetch(bucket, rows)
        return out[:, 0].astype(np.int64), out[:, 1:2].copy(), out[:, 2:3].copy()

    def _stage(self, bucket: _Bucket, obs: np.ndarray, greedy: np.ndarray | None) -> None:
        """Queue the batch's copies to the device (through the pinned buffers: no wait)."""
        rows = len(obs)
        np.copyto(bucket.host_obs[:rows], obs)
        bucket.obs[:rows].copy_(torch.from_numpy(bucket.host_obs[:rows]), non_blocking=True)
        if greedy is None:
            bucket.greedy.zero_()
            return
        np.copyto(bucket.host_greedy[:rows], np.asarray(greedy).reshape(-1), casting="unsafe")
        staged = torch.from_numpy(bucket.host_greedy[:rows])
        bucket.greedy[:rows].copy_(staged, non_blocking=True)

    def _fetch(self, bucket: _Bucket, rows: int) -> np.ndarray:
        """The first ``rows`` outputs, after one sleeping wait (see :func:`wait_for_gpu`); a view
        of the bucket's host buffer, valid until its next batch."""
        host = bucket.host_out[:rows]
        host.copy_(bucket.out[:rows], non_blocking=True)
        wait_for_gpu(self.device)
        return host.numpy()

    def _bucket(self, size: int) -> _Bucket:
        bucket = self.buckets.get(size)
        if bucket is None:
            bucket = self.buckets[size] = self._new_bucket(size)
        return bucket

    def _new_bucket(self, size: int) -> _Bucket:
        device, pin = self.device, self.device.type == "cuda"
        bucket = _Bucket(
            obs=torch.zeros((size, *self.obs_shape), dtype=self.obs_dtype, device=device),
            uniform=torch.full((size, self.actions), 0.5, device=device),
            greedy=torch.zeros(size, dtype=torch.bool, device=device),
            host_obs=_host((size, *self.obs_shape), self.obs_dtype, pin).numpy(),
            host_greedy=_host((size,), torch.bool, pin).numpy(),
            host_out=_host((size, 3), torch.float32, pin),
        )
        if self.capture:
            self._capture(bucket)
        return bucket

    def _capture(self, bucket: _Bucket) -> None:
        """Record the rollout into a graph, after warm-up passes on a side stream (cuDNN and
        the caching allocator settle there, as capture requires)."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.no_grad(), torch.cuda.stream(stream):
            for _ in range(2):
                sample_rows(self.net, bucket.obs, bucket.uniform, bucket.greedy)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph, pool=self._pool):
            bucket.out = sample_rows(self.net, bucket.obs, bucket.uniform, bucket.greedy)
        self._pool = graph.pool()
        bucket.graph = graph

    def _run(self, bucket: _Bucket) -> None:
        if bucket.graph is not None:
            bucket.graph.replay()
            return
        with torch.no_grad():
            bucket.out = sample_rows(self.net, bucket.obs, bucket.uniform, bucket.greedy)


def _host(shape: tuple[int, ...], dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """A host buffer, page-locked when it feeds a GPU (asynchronous copies need that)."""
    return torch.zeros(shape, dtype=dtype, pin_memory=pin)
