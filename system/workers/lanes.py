"""A lane: the agents of one policy in one environment group, handled as one batch; a group:
the environments an actor steps together, with a lane per policy.

Each step the lane turns its acting agents' results into one RolloutRequest, and the answer into
one batched step record and one update of their memories: the per-agent work left in the actor is
stepping the environments themselves.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from api.environment import StepResult
from api.namedarray import NamedArray, stack
from api.policy import RolloutRequest, RolloutResult, SampleBatch
from system.errors import WireError
from system.streams import validation
from system.streams.inference import InferenceReply
from system.workers.trajectory import SegmentBuffer


@dataclass
class Slot:
    """One agent of one environment."""

    env: int
    agent: int
    policy: str
    result: StepResult | None = None
    """The latest result, waiting for an action (None: the agent does not act now)."""
    on_reset: bool = True
    episode_return: float = 0.0
    version: int = -1
    """The policy version that answered this agent last (its opponent's, for the ratings)."""
    first_version: int = -1
    """The version that answered this agent's first step of the episode: an episode whose first
    and last versions are equal was played by one version (what a held evaluation counts)."""


@dataclass
class Lane:
    policy: str
    slots: list[Slot]
    buffer: SegmentBuffer | None
    """None for evaluation lanes: nothing is recorded."""
    is_evaluation: bool = False
    state: NamedArray | None = None
    """``[slots, ...]``: every slot's memory after its last answered observation."""
    acting: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    request: RolloutRequest | None = None
    obs_spec: validation.Spec = None
    """One observation's layout, from the observation space (:func:`observation_spec`): a
    request whose observations do not fit it would be dropped by the policy worker as malformed,
    and its actor would wait for an answer forever. None: not checked."""
    rewards: np.ndarray | None = None
    dones: np.ndarray | None = None
    truncateds: np.ndarray | None = None

    def build_request(self, seq: int) -> RolloutRequest | None:
        """The request for every slot that acts now, or None when none does."""
        acting = [
            c for c, s in enumerate(self.slots) if s.result is not None and s.policy == self.policy
        ]  # with a policy mapping a lane holds every slot: the episode's mapping picks ours
        if not acting:
            self.request = None
            return None
        self.acting = np.asarray(acting, dtype=np.int64)
        results = [self.slots[c].result for c in acting]
        n = len(acting)
        self.rewards = np.array([[_reward(r.reward)] for r in results], dtype=np.float32)
        self.dones = np.array([[bool(r.done)] for r in results], dtype=np.bool_)
        self.truncateds = np.array([[bool(r.truncated)] for r in results], dtype=np.bool_)
        self.request = RolloutRequest(
            obs=self._observations(acting),
            policy_state=None if self.state is None else self.state[self.acting],
            is_evaluation=np.full((n, 1), self.is_evaluation, dtype=np.bool_),
            on_reset=np.array([[self.slots[c].on_reset] for c in acting], dtype=np.bool_),
            client_id=np.array([[s.env * 1000 + s.agent] for s in _at(self.slots, acting)]),
            request_id=np.full((n, 1), seq, dtype=np.int64),
        )
        return self.request

    def _observations(self, acting: list[int]) -> np.ndarray | NamedArray:
        """The acting slots' observations, stacked. Raises :class:`Misfit` naming the first
        slot whose observation does not fit ``obs_spec`` (one comparison a request when they
        all do)."""
        observations = [self.slots[c].result.obs for c in acting]
        try:
            obs = _stack_obs(observations)
            if _fits(obs, self.obs_spec):
                return obs
            validation.check(obs, self.obs_spec, (len(acting),), "observations")
            return obs  # of another width of the same kind: the policy casts, as on the wire
        except (WireError, ValueError, TypeError) as e:
            stacked = e
        for c in acting:
            problem = misfit(self.slots[c].result.obs, self.obs_spec)
            if problem:
                raise Misfit(self.slots[c], problem)
        raise Misfit(self.slots[acting[0]], f"together they do not stack: {stacked}")

    def take_answer(self, result: RolloutResult, version: int) -> SampleBatch | None:
        """Record the answered step, update memories; return segments completed by it."""
        request = self.request
        state_before = request.policy_state
        if result.policy_state is not None and state_before is None:
            state_before = result.policy_state.apply(np.zeros_like)  # first step: reset anyway
        segments = None
        if self.buffer is not None:
            step = SampleBatch(
                obs=request.obs,
                action=result.action,
                policy_output=result.policy_output,
                policy_state=state_before,
                reward=self.rewards,
                done=self.dones,
                truncated=self.truncateds,
                on_reset=request.on_reset,
                policy_version=np.full((len(self.acting), 1), version, dtype=np.int64),
            )
            segments = self.buffer.write(self.acting, step)
        if result.policy_state is not None:
            if self.state is None:
                rows = np.zeros(len(self.slots), dtype=np.int64)
                self.state = result.policy_state[rows].apply(np.zeros_like)
            self.state[self.acting] = result.policy_state
        for c in self.acting:
            slot = self.slots[c]
            if slot.on_reset:
                slot.first_version = version
            slot.on_reset = False
            slot.version = version
        return segments

    def nonfinite_inputs(self) -> list[tuple[Slot, str]]:
        """Acting slots whose observation or reward in the current request is NaN or infinite
        (one vectorised check per field), with which of the two it is."""
        return [
            (slot, what)
            for what, values in (("observation", self.request.obs), ("reward", self.rewards))
            for slot in self.slots_of_rows(nonfinite_rows(values))
        ]

    def slots_of_rows(self, rows: np.ndarray) -> list[Slot]:
        """The slots that rows of the current request (or its answer) belong to."""
        return [self.slots[self.acting[i]] for i in rows]

    def forget(self, columns: list[int]) -> None:
        """Drop unfinished steps and memories of these slots (their environment failed)."""
        if self.buffer is not None:
            self.buffer.drop(np.asarray(columns, dtype=np.int64))


@dataclass
class Group:
    """Environments stepped together; one request per policy (lane) per step."""

    envs: list[int]
    lanes: dict[str, Lane] = field(default_factory=dict)
    seq: int = 0
    posted_at: float = 0.0
    waiting: set[str] = field(default_factory=set)
    replies: dict[str, InferenceReply] = field(default_factory=dict)


class Misfit(Exception):
    """An agent's observation does not fit its observation space."""

    def __init__(self, slot: Slot, problem: str):
        super().__init__(problem)
        self.slot, self.problem = slot, problem


def observation_spec(space: gym.Space) -> validation.Spec:
    """One observation's layout in ``space`` (a Box, Discrete, MultiDiscrete, MultiBinary or a
    Dict of them), as the policy workers' check reads it; None for spaces it cannot say."""
    if isinstance(space, gym.spaces.Dict):
        specs = {k: observation_spec(s) for k, s in space.spaces.items()}
        return None if any(v is None for v in specs.values()) else specs
    simple = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
    if isinstance(space, simple):
        return validation.Leaf(tuple(space.shape), np.dtype(space.dtype), finite=False)
    return None


def misfit(obs: Any, spec: validation.Spec) -> str | None:
    """What is wrong with one observation for ``spec`` (None: nothing)."""
    if spec is None:
        return None
    try:
        validation.check(_as_arrays(obs), spec, (), "observation")
    except (WireError, ValueError, TypeError) as e:
        return str(e)
    return None


def _as_arrays(obs: Any) -> np.ndarray | NamedArray:
    """One observation as its lane would stack it: a dict as a NamedArray, values as arrays."""
    if isinstance(obs, dict):
        return NamedArray(**{k: _as_arrays(v) for k, v in obs.items()})
    return np.asarray(obs)


def _fits(obs: Any, spec: validation.Spec) -> bool:
    """The common case at the cost of a comparison: an array exactly as declared."""
    if spec is None:
        return True
    return (
        isinstance(spec, validation.Leaf)
        and type(obs) is np.ndarray
        and obs.shape[1:] == spec.shape
        and obs.dtype == spec.dtype
    )


def _at(slots: list[Slot], columns: list[int]) -> list[Slot]:
    return [slots[c] for c in columns]


def _reward(reward) -> float:
    return float(reward) if isinstance(reward, (int, float)) else float(np.asarray(reward).flat[0])


def _stack_obs(observations: list) -> np.ndarray | NamedArray:
    if isinstance(observations[0], dict):
        return stack([NamedArray.from_dict(o) for o in observations])  # a Dict in a Dict too
    return np.stack(observations)


def nonfinite_rows(values: Any) -> np.ndarray:
    """Rows (first axis) of an array or NamedArray that hold a NaN or infinite float."""
    leaves = values.flatten() if isinstance(values, NamedArray) else [("", values)]
    bad = None
    for _, leaf in leaves:
        leaf = np.asarray(leaf)
        if leaf.dtype.kind not in "fc" or leaf.size == 0:
            continue
        rows = ~np.isfinite(leaf.reshape(len(leaf), -1)).all(axis=1)
        bad = rows if bad is None else bad | rows
    return np.zeros(0, np.int64) if bad is None else np.flatnonzero(bad)


def per_policy(slots: list[Slot]) -> dict[str, Any]:
    """An episode's ``policy/<name>/episode_return`` (the mean over that policy's agents) and
    ``versions``: ``{policy: [first, last]}``, the versions that answered its agents' first
    and last steps (an evaluation window counts episodes one version played whole)."""
    record: dict[str, Any] = {}
    versions: dict[str, list[int]] = {}
    agents = Counter(s.policy for s in slots)
    for s in slots:
        key = f"policy/{s.policy}/episode_return"
        record[key] = record.get(key, 0.0) + s.episode_return / agents[s.policy]
        seen = versions.setdefault(s.policy, [s.first_version, s.version])
        seen[0], seen[1] = min(seen[0], s.first_version), max(seen[1], s.version)
    record["versions"] = versions
    return record


def matchups(slots: list[Slot]) -> dict[str, Any]:
    """What a multi-agent episode says about who beat whom: ``result/<a>_vs_<b>`` (1 a won,
    0.5 a draw, 0 a lost, by return) for every pair of different policies that played it, and
    ``seats``: ``[policy, version, return]`` per agent, from which the controller rates
    versions."""
    record: dict[str, Any] = {"seats": [[s.policy, s.version, s.episode_return] for s in slots]}
    for a in slots:
        for b in slots:
            if a.policy != b.policy:
                score = 0.5 + 0.5 * float(np.sign(a.episode_return - b.episode_return))
                record[f"result/{a.policy}_vs_{b.policy}"] = score
    return record
