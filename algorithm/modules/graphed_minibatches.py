"""A trainer's minibatch steps replayed as CUDA graphs: one launch a gradient step.

Why: on a 16-core H200 machine, ``pong-ppo-gpu``'s trainer was busy 100% of the time at 7-8 ms
a 512-transition minibatch, and the GPU was busy 31% of the call (BENCHMARKS.md, issue 23). By
arithmetic, a Nature CNN's forward and backward passes on 512 frames are about 29 GFLOP: under a
millisecond even at the H200's plain float32 rate. So the step's time most likely goes to its
core dispatching, one by one, the operations of a minibatch: the gather, the forward pass, the
loss, the backward pass, the norm clip and Adam (``torch.profiler`` on the 2-core VM counts 236
top-level ATen operators a PPO minibatch of ``pong-ppo``'s network, views included). Captured once
as a graph, a minibatch replays with one launch.

How:

* **fixed shapes**: each step copies its training pool (the valid transitions, ``[1, N, ...]``)
  into static buffers, and every minibatch is padded to the largest seen so far (``ceil(N /
  minibatches)`` rows of the largest pool). Padding rows repeat row 0 with weight 0. The
  trainer's losses are masked means over the real rows, so a padded minibatch trains as the
  unpadded one would, up to the order of float sums. ``N`` changes from batch to batch (a step
  that ends an episode is not trained on), so padding to the largest keeps one size, and one
  graph, for the run;
* **one graph per minibatch size** (a run usually has one), captured after :data:`WARMUP` eager
  minibatches of that size on a side stream, as CUDA graph capture needs: cuBLAS and cuDNN
  choose their algorithms, Adam builds its state. Those are real gradient steps, on real
  minibatches;
* **Adam runs capturable**: its step counts live on the device, and its learning rate is a device
  tensor the trainer fills each step, so the linear schedule needs no new capture
  (:class:`~algorithm.modules.actor_critic_trainer.ActorCriticTrainer`, ``capturable``);
* **gradients live in the graph's memory**, which nothing outside the graph touches;
* a loaded optimizer state (a restart, PBT's exploit) consists of new tensors: :meth:`reset`
  drops the graphs, and the next steps capture them again;
* a capture that fails is logged once, and the trainer goes on eagerly.

What applies: a feed-forward policy on a GPU, trained by one process (under data-parallel
training DDP averages gradients with hooks of its own, so the trainer stays eager). Without a GPU
the same static buffers and padded minibatches run as plain calls, which is how the tests on a
CPU check everything but the capture itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from api.namedarray import NamedArray

logger = logging.getLogger(__name__)

WARMUP = 3
"""Eager minibatches of a size, on a side stream, before its graph is captured."""

Update = Callable[[NamedArray, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``update(minibatch, advantages, returns, mask)`` -> the statistics row of one gradient step;
every argument ``[1, rows, ...]``, the mask 1.0 for a real row and 0.0 for padding."""


@dataclass
class _Size:
    """The static index and mask of one minibatch size and, once captured, its graph."""

    index: torch.Tensor
    mask: torch.Tensor
    warm: int = 0
    graph: torch.cuda.CUDAGraph | None = None
    out: torch.Tensor | None = None


def padded_minibatches(chunks: list[np.ndarray], rows: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(index, weight)``, both ``[len(chunks), rows]`` (at least the longest chunk): each
    chunk's entries, then index 0 with weight 0.0 up to ``rows``."""
    rows = max(rows, *(len(c) for c in chunks))
    index = np.zeros((len(chunks), rows), dtype=np.int64)
    weight = np.zeros((len(chunks), rows), dtype=np.float32)
    for i, chunk in enumerate(chunks):
        index[i, : len(chunk)] = chunk
        weight[i, : len(chunk)] = 1.0
    return index, weight


class GraphedMinibatches:
    """Runs a trainer step's minibatches through static buffers, replayed as CUDA graphs.

    Args:
        update: one gradient step on a padded minibatch (see :data:`Update`); with ``capture``
            it must not read a value back to the host (no ``.item()``, no data-dependent shape).
        device: where the pool and the graphs live.
        capture: capture CUDA graphs (on a GPU only); False runs the same buffers as plain calls.
    """

    def __init__(self, update: Update, device: torch.device, capture: bool = True):
        self.update, self.device = update, device
        self.capture = bool(capture) and device.type == "cuda"
        self._pool: tuple[NamedArray, torch.Tensor, torch.Tensor] | None = None
        self._capacity, self._layout = 0, ()
        self._sizes: dict[int, _Size] = {}
        self._rows = 0  # the rows every minibatch is padded to: the most seen
        self._side: torch.cuda.Stream | None = None

    @property
    def graphs(self) -> int:
        """How many minibatch sizes have a captured graph."""
        return sum(s.graph is not None for s in self._sizes.values())

    def reset(self) -> None:
        """Drop every graph (the optimizer's state tensors were replaced); the next minibatches
        of each size warm up and capture again."""
        self._sizes.clear()

    def run(
        self,
        pool: NamedArray,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        chunks: list[np.ndarray],
    ) -> list[torch.Tensor]:
        """One gradient step per chunk of pool indices, in order; the statistics row of each.

        ``pool``, ``advantages`` and ``returns`` are ``[1, N, ...]`` on :attr:`device`; every
        chunk is a non-empty array of indices below ``N``."""
        self._load(pool, advantages, returns)
        index, weight = padded_minibatches(chunks, self._rows)
        self._rows = index.shape[1]
        index_d = torch.as_tensor(index, device=self.device)
        weight_d = torch.as_tensor(weight, device=self.device)
        size = self._size(index.shape[1])
        rows = []
        for i in range(len(chunks)):
            size.index.copy_(index_d[i])
            size.mask.copy_(weight_d[i].view(size.mask.shape))
            rows.append(self._step(size).clone())
        return rows

    def _load(self, pool: NamedArray, advantages: torch.Tensor, returns: torch.Tensor) -> None:
        """Copy the step's pool into the static one, made anew (graphs dropped) when it is too
        small or its leaves changed."""
        count = advantages.shape[1]
        layout = _layout((pool, advantages, returns))
        if self._pool is None or count > self._capacity or layout != self._layout:
            self._pool = _empty_like_rows((pool, advantages, returns), count)
            self._capacity, self._layout = count, layout
            self.reset()
        for static, value in zip(_leaves(self._pool), _leaves((pool, advantages, returns))):
            static[:, :count].copy_(value)

    def _size(self, rows: int) -> _Size:
        if rows not in self._sizes:
            index = torch.zeros(rows, dtype=torch.int64, device=self.device)
            mask = torch.zeros(1, rows, 1, dtype=torch.float32, device=self.device)
            self._sizes[rows] = _Size(index, mask)
        return self._sizes[rows]

    def _body(self, size: _Size) -> torch.Tensor:
        """The minibatch step itself: gather the rows, train on them. What a graph captures."""
        pool, advantages, returns = self._pool
        index = size.index
        minibatch = pool.apply(lambda leaf: leaf.index_select(1, index))
        return self.update(
            minibatch, advantages.index_select(1, index), returns.index_select(1, index), size.mask
        )

    def _step(self, size: _Size) -> torch.Tensor:
        if not self.capture:
            return self._body(size)
        if size.graph is None:
            if size.warm < WARMUP:
                size.warm += 1
                return self._on_side_stream(size)
            try:
                self._capture(size)
            except RuntimeError as e:
                logger.warning(
                    "capturing the trainer's minibatch step as a CUDA graph failed (%s); "
                    "training goes on without graphs",
                    e,
                )
                self.capture = False
                self.reset()
                return self._body(size)
        size.graph.replay()
        return size.out

    def _on_side_stream(self, size: _Size) -> torch.Tensor:
        """An eager step on a stream of its own, as CUDA graph capture needs for warming up."""
        side, main = self._side_stream(), torch.cuda.current_stream(self.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            out = self._body(size)
        main.wait_stream(side)
        return out

    def _side_stream(self) -> torch.cuda.Stream:
        """The one stream of warm-ups and captures: cuBLAS keeps its handles and workspaces per
        stream, so a capture on a stream that never warmed up would create them mid-capture."""
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        return self._side

    def _capture(self, size: _Size) -> None:
        """Capture the step of this size on the warm-ups' stream, in a memory pool of its own
        (its gradients live there between replays). Only this thread's calls are checked during
        the capture: the trainer's loader thread may be staging the next batch meanwhile, on
        its own stream."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self._side_stream(), capture_error_mode="thread_local"):
            out = self._body(size)
        size.graph, size.out = graph, out


def _leaves(value) -> list[torch.Tensor]:
    """Every tensor of a tuple of NamedArrays and tensors, in a fixed order."""
    leaves = []
    for item in value:
        if isinstance(item, NamedArray):
            leaves += [leaf for _, leaf in item.flatten()]
        else:
            leaves.append(item)
    return leaves


def _layout(value) -> tuple:
    """What a static pool must match: each leaf's name, dtype and shape past the rows."""
    names = []
    for item in value:
        if isinstance(item, NamedArray):
            names += [name for name, _ in item.flatten()]
        else:
            names.append("")
    return tuple(
        (name, leaf.dtype, tuple(leaf.shape[2:]))
        for name, leaf in zip(names, _leaves(value), strict=True)
    )


def _empty_like_rows(value, rows: int):
    """Zeroed tensors like every leaf of ``value``, ``rows`` along dimension 1."""

    def empty(leaf: torch.Tensor) -> torch.Tensor:
        shape = (leaf.shape[0], rows, *leaf.shape[2:])
        return torch.zeros(shape, dtype=leaf.dtype, device=leaf.device)

    return tuple(
        item.apply(empty) if isinstance(item, NamedArray) else empty(item) for item in value
    )
