"""A replay buffer of trajectory segments that hands out n-step transitions (pure numpy).

It is fed by the same sample stream as an on-policy trainer: ``insert`` takes ``[T, B]``
segments (``api.policy.SampleBatch``; consecutive segments overlap by one step) and keeps whole
segments in preallocated ``[slots, T, ...]`` arrays, the oldest overwritten first. Capacity is
counted in frames, ``T - 1`` per segment (its last step is the next segment's first).

``sample`` draws transitions ``(segment, t)`` whose action was executed (``t < T - 1``, and
``obs[t]`` is neither done nor truncated), uniformly or in proportion to a priority (a
:class:`~system.replay.sum_tree.SumTree`), and sums their n-step returns on the way out::

    reward   = sum_{j<k} gamma^j r[t+1+j]     (k <= n: stops early at an episode end)
    discount = gamma^k, or 0 if obs[t+k] is terminal (done)
    next_obs = obs[t+k]

A truncated episode stops the sum too but still bootstraps from its real final observation, and
so does the segment's end (its last observation is real, only the next action is elsewhere).
Storing segments rather than ``(obs, next_obs)`` pairs keeps each observation once.

``state_dict()`` is a flat dict of numpy arrays (no pickle needed to checkpoint it).

Longer than 400 lines because storage, n-step sampling, priorities and the checkpoint of one
buffer share its arrays and their invariants (slots, stamps, valid flags); split, each part
would reach into the others' state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from api.errors import ConfigError
from api.namedarray import NamedArray
from api.replay import TransitionBatch
from system.memory import available_bytes, format_bytes
from system.replay.rate_limiter import RateLimiter, RateLimiterConfig
from system.replay.sum_tree import SumTree

logger = logging.getLogger(__name__)

_EMPTY = "or remove its save (checkpoints/<policy>/replay.ckpt) to start the buffer empty"

STORED = ("obs", "action", "reward", "done", "truncated", "policy_version")
"""The SampleBatch fields a replay buffer keeps; and ``extras``, the actor callbacks' fields,
when the segments have them (a transition gets those of the step its action was taken at)."""


@dataclass
class ReplayConfig:
    """A replay buffer's size, sampling and n-step settings."""

    capacity_frames: int = 100_000
    """Frames kept; the oldest segments are overwritten first."""
    n_step: int = 1
    """Rewards summed per transition before bootstrapping (fewer at an episode or segment end)."""
    gamma: float = 0.99
    """Discount of the n-step sum (use the trainer's)."""
    prioritized: bool = False
    """Sample in proportion to ``priority ** priority_exponent`` (else uniformly)."""
    priority_exponent: float = 0.6
    """Alpha of prioritised replay: 0 is uniform, 1 fully proportional."""
    importance_exponent: float = 0.4
    """Beta: importance-sampling weights ``(N * P)^-beta`` (normalised to at most 1) undo the
    bias of prioritised sampling; 1 undoes it fully. The owner may anneal the attribute."""
    priority_epsilon: float = 1e-6
    """Added to every new priority, so no transition becomes unsampleable."""
    rate_limit: RateLimiterConfig = field(default_factory=RateLimiterConfig)
    """When sampling and inserting may go (minimum size, samples per insert)."""
    seed: int | None = None
    """Seeds the sampling."""

    def errors(self) -> list[str]:
        problems = [f"rate_limit.{p}" for p in self.rate_limit.errors()]
        if self.capacity_frames < 1:
            problems.append(f"capacity_frames must be at least 1, got {self.capacity_frames}")
        if self.n_step < 1:
            problems.append(f"n_step must be at least 1, got {self.n_step}")
        if not 0.0 <= self.gamma <= 1.0:
            problems.append(f"gamma must be in [0, 1], got {self.gamma}")
        if self.priority_exponent < 0 or self.importance_exponent < 0:
            problems.append("priority_exponent and importance_exponent must be >= 0")
        return problems


class ReplayBuffer:
    """Segments in, n-step transitions out; see the module docstring."""

    def __init__(self, config: ReplayConfig):
        problems = config.errors()
        if problems:
            raise ValueError("ReplayConfig: " + "; ".join(problems))
        self.config = config
        self.beta = config.importance_exponent
        self.limiter = RateLimiter(config.rate_limit)
        self._rng = np.random.default_rng(config.seed)
        self._store: dict[str, np.ndarray] = {}  # "obs", "obs.key", "action", ... -> [slots, T]
        self._length = 0  # T, fixed by the first insert
        self._slots = 0
        self._tree: SumTree | None = None
        self._stamp = np.zeros(0, dtype=np.int64)  # serial number of the segment in each slot
        self._valid = np.zeros((0, 0), dtype=bool)  # [slots, T]: transitions that may be drawn
        self._transitions = 0  # self._valid.sum(), kept by insert (asked before every sample)
        self._serial = 0  # segments inserted so far
        self._max_priority = 1.0

    # ----------------------------------------------------------------- sizes
    @property
    def size(self) -> int:
        """Frames held."""
        return min(self._serial, self._slots) * max(self._length - 1, 0)

    @property
    def transitions(self) -> int:
        """Transitions that can be drawn (frames whose action was executed)."""
        return self._transitions

    def can_sample(self, count: int) -> bool:
        return self.transitions > 0 and self.limiter.can_sample(count, self.size)

    def can_insert(self, segments: Any) -> bool:
        steps, batch = np.shape(segments.reward)[:2]
        return self.limiter.can_insert((steps - 1) * batch)

    # ----------------------------------------------------------------- insert
    def insert(self, segments: Any) -> int:
        """Store ``[T, B]`` segments (a SampleBatch); returns the frames added, ``(T-1) * B``."""
        steps, batch = np.shape(segments.reward)[:2]
        if not self._store:
            self._allocate(segments, steps)
        if steps != self._length:  # fatal: a restart would meet the same segments
            raise ConfigError([
                f"actors.segment_length: segments of {steps - 1} frames came to a replay buffer "
                f"that holds segments of {self._length - 1} (one buffer takes one length). A "
                f"resumed run's buffer keeps its run's length: resume with that one, {_EMPTY}"
            ])  # fmt: skip
        leaves = _leaves(segments)
        self._check_extras([path for path, _ in leaves])
        slots = (self._serial + np.arange(batch)) % self._slots
        serials = self._serial + np.arange(batch)
        keep = max(batch - self._slots, 0)  # more segments than fit: only the newest stay
        slots, serials = slots[keep:], serials[keep:]
        for path, leaf in leaves:
            self._store[path][slots] = np.swapaxes(np.asarray(leaf)[:, keep:], 0, 1)
        self._stamp[slots] = serials
        ended = self._store["done"][slots, :, 0] | self._store["truncated"][slots, :, 0]
        valid = ~ended
        valid[:, -1] = False  # the last step only bootstraps
        self._transitions += int(valid.sum()) - int(self._valid[slots].sum())
        self._valid[slots] = valid
        new = self._max_priority**self.config.priority_exponent if self.config.prioritized else 1.0
        items = (slots[:, None] * self._length + np.arange(self._length)).reshape(-1)
        self._tree.update(items, (valid * new).reshape(-1))
        self._serial += batch
        frames = (steps - 1) * batch
        self.limiter.record_insert(frames)
        return frames

    def _check_extras(self, paths: list[str]) -> None:
        """Segments bring the extras the buffer holds, no more and no fewer: a transition
        without the fields its trainer reads would be made up (fatal, as the length is)."""
        held = sorted(p[len("extras.") :] for p in self._store if p.startswith("extras."))
        came = sorted(p[len("extras.") :] for p in paths if p.startswith("extras."))
        if held != came:
            raise ConfigError([
                f"actor_callbacks: segments with the extra fields {came} came to a replay buffer "
                f"that holds {held} (segment_fields). A resumed run's buffer keeps its run's "
                f"fields: resume with its actor callbacks, {_EMPTY}"
            ])  # fmt: skip

    def _allocate(self, segments: Any, steps: int) -> None:
        if steps < 2:
            raise ValueError(
                f"segments need at least 2 steps (one plus the bootstrap), got {steps}"
            )
        self._length = steps
        self._slots = self.config.capacity_frames // (steps - 1)
        if self._slots < 1:
            raise ValueError(
                f"capacity_frames={self.config.capacity_frames} holds no segment of "
                f"{steps - 1} frames: raise capacity_frames"
            )
        shapes = {path: ((self._slots, steps, *np.shape(leaf)[2:]), np.asarray(leaf).dtype)
                  for path, leaf in _leaves(segments)}  # fmt: skip
        self._check_memory(shapes, steps)
        for path, (shape, dtype) in shapes.items():
            self._store[path] = np.zeros(shape, dtype)
        self._tree = SumTree(self._slots * steps)
        self._stamp = np.full(self._slots, -1, dtype=np.int64)
        self._valid = np.zeros((self._slots, steps), dtype=bool)

    def _check_memory(self, shapes: dict[str, tuple[tuple[int, ...], np.dtype]], steps: int):
        """Refuse a buffer that cannot fit in the memory left to this process: its pages are
        only taken as it fills, so it would otherwise be killed by the OOM killer once full,
        hours in. Said when it would take more than half of it."""
        need = sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in shapes.values())
        need += self._slots * steps * (2 * 8 + 1)  # the sum tree and the valid flags
        free = available_bytes()
        if free is None or need <= free // 2:
            return
        obs = ", ".join(f"{p} {shape[2:]} {dtype}" for p, (shape, dtype) in shapes.items()
                        if p.startswith("obs"))  # fmt: skip
        what = (f"replay.capacity_frames={self.config.capacity_frames}: the buffer "
                f"({obs or 'no observation'} a frame) needs {format_bytes(need)}")  # fmt: skip
        if need > free:  # a config error: no restart would fix it, the run ends on it at once
            raise ConfigError([
                f"{what}, and this process has {format_bytes(free)} of memory left (the "
                "machine's, or its container's limit): lower it"
            ])  # fmt: skip
        logger.warning("%s, more than half of the %s this process has left", what,
                       format_bytes(free))  # fmt: skip

    # ----------------------------------------------------------------- sample
    def sample(self, count: int, batches: int = 1) -> TransitionBatch:
        """``count`` transitions with their n-step returns and importance weights; with
        ``batches``, that many batches of ``count`` rows one after another (``batches * count``
        rows, each batch drawn and weighted as if alone), from one pass over the buffer."""
        rows = count * batches
        if not self.can_sample(rows):
            raise RuntimeError(
                f"cannot sample {rows} transitions now ({self.size} frames held, min_size "
                f"{self.limiter.config.min_size}; inserted {self.limiter.inserted}, sampled "
                f"{self.limiter.sampled}): check can_sample() first"
            )
        items = self._tree.sample(count, self._rng, batches)
        slot, t = np.divmod(items, self._length)
        reward, discount, end = self._n_step(slot, t)
        batch = TransitionBatch(
            obs=self._gather("obs", slot, t),
            action=self._gather("action", slot, t),
            reward=reward,
            discount=discount,
            next_obs=self._gather("obs", slot, end),
            weight=self._weights(items, count),
            key=self._stamp[slot] * self._length + t,
            policy_version=self._store["policy_version"][slot, t],
            extras=self._gather("extras", slot, t) if self._extras else None,
        )
        self.limiter.record_sample(rows)
        return batch

    @property
    def _extras(self) -> bool:
        return any(path.startswith("extras.") for path in self._store)

    def _n_step(self, slot: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, ...]:
        """n-step returns, discounts and bootstrap steps; one vectorised pass per step k."""
        gamma, last = self.config.gamma, self._length - 1
        reward = np.zeros(len(slot), dtype=np.float64)
        scale = np.ones(len(slot), dtype=np.float64)  # gamma ** steps summed so far
        end = t.copy()
        alive = np.ones(len(slot), dtype=bool)
        terminal = np.zeros(len(slot), dtype=bool)
        for k in range(1, self.config.n_step + 1):
            step = np.minimum(t + k, last)
            alive &= t + k <= last
            reward += np.where(alive, scale * self._store["reward"][slot, step, 0], 0.0)
            scale = np.where(alive, scale * gamma, scale)
            end = np.where(alive, step, end)
            done = self._store["done"][slot, step, 0]
            terminal |= alive & done
            alive &= ~(done | self._store["truncated"][slot, step, 0])
        discount = np.where(terminal, 0.0, scale)
        return reward[:, None].astype(np.float32), discount[:, None].astype(np.float32), end

    def _weights(self, items: np.ndarray, count: int) -> np.ndarray:
        if not self.config.prioritized:
            return np.ones((len(items), 1), dtype=np.float32)
        probability = self._tree.get(items) / self._tree.total
        weight = ((self.transitions * probability) ** -self.beta).reshape(-1, count)
        # normalised by each batch's largest weight: updates only ever scale down
        return (weight / weight.max(axis=1, keepdims=True)).reshape(-1, 1).astype(np.float32)

    def _gather(self, name: str, slot: np.ndarray, t: np.ndarray) -> Any:
        if name in self._store:
            return self._store[name][slot, t]
        prefix = name + "."
        flat = {
            p[len(prefix) :]: a[slot, t] for p, a in self._store.items() if p.startswith(prefix)
        }
        return _unflatten(flat)

    # ----------------------------------------------------------------- priorities
    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """Set new priorities (e.g. |TD error|) of sampled transitions; returns how many took.

        Keys of segments overwritten since they were sampled are skipped; so is everything when
        sampling is uniform.
        """
        if not self.config.prioritized or self._tree is None:
            return 0
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        priorities = np.abs(np.asarray(priorities, dtype=np.float64).reshape(-1))
        serial, t = np.divmod(keys, self._length)
        slot = serial % self._slots
        current = (self._stamp[slot] == serial) & self._valid[slot, t]
        priorities = priorities[current] + self.config.priority_epsilon
        if priorities.size:
            self._max_priority = max(self._max_priority, float(priorities.max()))
        items = slot[current] * self._length + t[current]
        self._tree.update(items, priorities**self.config.priority_exponent)
        return int(current.sum())

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self, copy: bool = True) -> dict[str, np.ndarray]:
        """Everything, as numpy arrays keyed by name (storage under ``store/<field path>``).

        ``copy=False``: the storage itself, for a caller that writes it out before the next
        insert (a full buffer is then not held twice in memory).

        The storage is cut to the slots filled so far (they fill in order): a large buffer
        saved early, or at the end of a short run, is written at the size of what it holds, not
        at its capacity (100k Atari frames preallocate 2.8 GB)."""
        filled = min(self._serial, self._slots)
        state = {f"store/{path}": array[:filled] for path, array in self._store.items()}
        if self._tree is not None:
            state["tree"] = self._tree.nodes
        state.update(
            stamp=self._stamp,
            valid=self._valid,
            serial=np.array(self._serial),
            length=np.array(self._length),
            max_priority=np.array(self._max_priority),
            beta=np.array(self.beta),
            **{f"limiter/{k}": v for k, v in self.limiter.state_dict().items()},
        )
        return {k: np.array(v, copy=True) if copy else np.asarray(v) for k, v in state.items()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self._length = int(state["length"])
        self._stamp, self._valid = np.array(state["stamp"]), np.array(state["valid"])
        self._transitions = int(self._valid.sum())
        self._slots = len(self._stamp)
        # rows are slots (filled in order), so a resize picks from them; else they are padded
        slots = self.config.capacity_frames // max(self._length - 1, 1)
        saved = {k[len("store/") :]: np.asarray(v) for k, v in state.items() if k[:6] == "store/"}
        resize = bool(saved) and slots != self._slots
        if saved and not resize:  # padded back to its capacity: the pages a new one would ask
            self._check_memory(_shapes(saved, self._slots), self._length)
        self._store = saved if resize else {k: self._whole(v) for k, v in saved.items()}
        self._tree = None
        if "tree" in state:
            self._tree = SumTree(self._slots * self._length)
            self._tree.nodes[:] = state["tree"]
        self._serial, self._max_priority = int(state["serial"]), float(state["max_priority"])
        self.beta = float(state["beta"])
        self.limiter.load_state_dict(
            {k[len("limiter/") :]: v for k, v in state.items() if k.startswith("limiter/")}
        )
        if resize:
            self._resize(slots)

    def _resize(self, slots: int) -> None:
        """Lay a loaded buffer out at this config's capacity (a run resumed with another
        ``replay.capacity_frames``; the save keeps its own): the newest segments that fit, in
        the order they came, numbered afresh (no key from before the load is still out)."""
        if slots < 1:
            raise ConfigError([
                f"replay.capacity_frames={self.config.capacity_frames} holds no segment of the "
                f"resumed buffer's {self._length - 1} frames: raise it"
            ])  # fmt: skip
        held, frames = min(self._serial, self._slots), self._length - 1
        kept = np.arange(self._serial - min(held, slots), self._serial) % self._slots
        said = f"from {self._slots * frames} to {slots * frames} frames"
        self._slots = slots
        shapes = _shapes(self._store, slots)
        self._check_memory(shapes, self._length)
        items = (kept[:, None] * self._length + np.arange(self._length)).reshape(-1)
        priorities = self._tree.get(items)
        for path, (shape, dtype) in shapes.items():
            whole = np.zeros(shape, dtype)
            whole[: len(kept)] = self._store[path][kept]
            self._store[path] = whole
        valid = np.zeros((slots, self._length), dtype=bool)
        valid[: len(kept)] = self._valid[kept]
        self._valid, self._transitions = valid, int(valid.sum())
        self._stamp = np.full(slots, -1, dtype=np.int64)
        self._stamp[: len(kept)] = np.arange(len(kept))
        self._serial = len(kept)
        self._tree = SumTree(slots * self._length)
        self._tree.update(np.arange(len(items)), priorities)
        logger.info("replay buffer resized %s (replay.capacity_frames): kept the newest %d of "
                    "the %d frames it held", said, self.size, held * frames)  # fmt: skip

    def _whole(self, saved: np.ndarray) -> np.ndarray:
        """A field's storage at the buffer's capacity from its saved filled slots (a save
        made before the buffer filled holds fewer rows than there are slots)."""
        whole = np.zeros((self._slots, *np.shape(saved)[1:]), np.asarray(saved).dtype)
        whole[: len(saved)] = saved
        return whole


def _shapes(saved: dict[str, np.ndarray], slots: int) -> dict[str, tuple[tuple, np.dtype]]:
    """Each stored field's shape and dtype at ``slots`` slots (for the memory check)."""
    return {p: ((slots, *np.shape(a)[1:]), np.asarray(a).dtype) for p, a in saved.items()}


def _leaves(segments: Any) -> list[tuple[str, np.ndarray]]:
    """The stored fields of a SampleBatch as ``(path, [T, B, ...] array)``."""
    out = []
    extras = getattr(segments, "extras", None)
    for name in STORED + (("extras",) if extras is not None else ()):
        value = getattr(segments, name, None)
        if value is None:
            raise ValueError(f"replay needs the segments' '{name}' field, which is missing")
        if isinstance(value, NamedArray):
            out.extend((f"{name}.{path}", leaf) for path, leaf in value.flatten())
        else:
            out.append((name, value))
    return out


def _unflatten(flat: dict[str, np.ndarray]) -> NamedArray:
    """``{"a.b": leaf}`` back into nested NamedArrays."""
    fields: dict[str, Any] = {}
    nested: dict[str, dict[str, np.ndarray]] = {}
    for path, leaf in flat.items():
        head, _, rest = path.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = leaf
        else:
            fields[head] = leaf
    fields.update({k: _unflatten(v) for k, v in nested.items()})
    return NamedArray(**fields)
