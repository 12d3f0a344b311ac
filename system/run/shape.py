"""A run's shape, resolved once: the agents' spaces and every message layout its sockets check.

The controller builds one environment (for the spaces) and one network per policy (for the
layouts, :mod:`system.run.declared`) before any worker starts, and sends the result in every
``configure``. A worker then builds only what it runs: the parameter service no network (and
no torch), a trainer or policy worker its own policy and no environment. It is plain data on
the wire: spaces and layouts have wire forms here (:func:`space_to_wire`,
:func:`spec_to_wire`), decoded with the same strictness as any message.

A space without a wire form (a custom ``gymnasium.Space``), or an environment the controller
cannot build, leaves the shape out: workers then resolve it themselves, as before, and the one
whose environment fails reports it the usual way.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from api.config import ExperimentConfig, uses_replay
from api.errors import ConfigError
from api.spaces import HybridBox
from system.errors import WireError
from system.run import builders, declared
from system.run.control_channel import HELLO_PATIENCE_S
from system.streams.validation import (
    BatchLayout,
    Leaf,
    Maybe,
    ParamsLayout,
    PriorityLayout,
    RequestLayout,
    Scalar,
    SegmentLayout,
    Spec,
    Tree,
)

logger = logging.getLogger(__name__)

_SCALARS = {"bool": bool, "int": int, "float": float, "str": str}


@dataclass(frozen=True)
class RunShape:
    spaces: builders.AgentSpaces
    requests: dict[str, RequestLayout]
    """What each policy's policy workers accept."""
    segments: dict[str, SegmentLayout]
    """What each trained policy's trainers (or replay worker) accept from actors."""
    priorities: dict[str, PriorityLayout]
    batches: dict[str, BatchLayout]
    """What the trainers of a policy that learns from replay accept from its replay worker."""
    params: ParamsLayout

    @classmethod
    def of(cls, config: ExperimentConfig) -> RunShape:
        """Build one environment and one network per policy (on the CPU) to resolve it."""
        spaces = builders.probe_spaces(config)
        requests, segments, priorities, batches, params = {}, {}, {}, {}, {}
        trained = builders.trained_policies(config)
        for name in config.policies:
            policy = builders.make_policy(_on_cpu(config, name), name, spaces, config.seed)
            requests[name] = declared.request_layout(config, spaces, policy, name)
            if name not in trained:
                continue
            params[name] = declared.params_spec(policy)
            segments[name] = declared.segment_layout(config, spaces, policy, name)
            if uses_replay(config.policies[name]):
                priorities[name] = declared.priority_layout(config, name)
                batches[name] = declared.batch_layout(config, spaces, policy, name)
        return cls(spaces, requests, segments, priorities, batches, ParamsLayout(params))

    @classmethod
    def resolve(cls, config: ExperimentConfig) -> dict[str, Any] | None:
        """The shape's wire form, for every worker's ``configure``; None where the workers
        must resolve it themselves (see the module). Raises the ConfigError of a configuration
        its environment or policies refute (``agent_policies`` for more agents than it has),
        which every worker would meet the same way."""
        try:
            return cls.of(config).to_wire()  # a space without a wire form says so here
        except ConfigError:
            raise
        except Exception as e:  # the worker that builds it reports it, as a worker error
            logger.info("the run's shape is left to its workers: %r", e)
            return None

    def to_wire(self) -> dict[str, Any]:
        return {
            "observation": [space_to_wire(s) for s in self.spaces.observation],
            "action": [space_to_wire(s) for s in self.spaces.action],
            "requests": {k: [spec_to_wire(v.row), v.max_rows] for k, v in self.requests.items()},
            "segments": {
                k: [spec_to_wire(v.step), v.length, v.max_segments]
                for k, v in self.segments.items()
            },
            "priorities": {k: v.max_rows for k, v in self.priorities.items()},
            "batches": {k: [spec_to_wire(v.row), v.rows] for k, v in self.batches.items()},
            "params": {k: spec_to_wire(v) for k, v in self.params.policies.items()},
        }

    @classmethod
    def from_wire(cls, body: Any) -> RunShape:
        """Raises :class:`WireError` for a body that is not a shape."""
        try:
            spaces = builders.AgentSpaces(
                [space_from_wire(s) for s in body["observation"]],
                [space_from_wire(s) for s in body["action"]],
            )
            return cls(
                spaces,
                {k: RequestLayout(spec_from_wire(r), int(n))
                 for k, (r, n) in body["requests"].items()},
                {k: SegmentLayout(spec_from_wire(s), int(length), int(n))
                 for k, (s, length, n) in body["segments"].items()},
                {k: PriorityLayout(int(n)) for k, n in body["priorities"].items()},
                {k: BatchLayout(spec_from_wire(r), int(n))
                 for k, (r, n) in body["batches"].items()},
                ParamsLayout({k: spec_from_wire(s) for k, s in body["params"].items()}),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise WireError(f"configure: the run's shape is malformed: {e!r}") from e


class ShapeResolver:
    """The controller's copy of the shape's wire form: resolved once, on a thread of its own
    while the workers start (a forkserver's imports, a container's start), so their ``hello``
    waits for it rather than for it on top of their own start.

    The control loop never waits for it: a configure is held back while it is under way
    (:meth:`ready`). An environment that took two minutes to make held the loop that long in
    the first configure, and every worker, its hello unanswered for a minute, exited saying no
    controller answered. Under way past ``max_s`` (``liveness.max_build_s``), it is given up
    on: workers then resolve it themselves, as for a space with no wire form."""

    def __init__(self, config: ExperimentConfig, max_s: float | None = None):
        self.config = config
        # within what a worker waits for its configure, whatever liveness.max_build_s says
        bound = min(config.liveness.max_build_s, HELLO_PATIENCE_S / 2)
        self.max_s = bound if max_s is None else max_s
        self._wire: dict[str, Any] | None = None
        self._done = False
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._given_up = False
        self.refused: ConfigError | None = None
        """What the configuration was refused for, once resolved: the controller ends the run
        with it (each worker would fail on it, some after minutes of building)."""

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._resolve, name="shape", daemon=True)
        self._thread.start()

    def ready(self) -> bool:
        """Whether a configure may go now: the shape resolved, or given up on."""
        if self._thread is None or not self._thread.is_alive() or self._given_up:
            return True
        if time.monotonic() - self._started < self.max_s:
            return False
        logger.warning(
            "the run's shape is not resolved after %.0fs (liveness.max_build_s): its "
            "environment hangs as it is made? Workers resolve it themselves",
            self.max_s,
        )
        self._given_up = True
        return True

    def get(self) -> dict[str, Any] | None:
        """The wire form for a ``configure`` (None: the workers resolve it themselves)."""
        if self._thread is not None and self._thread.is_alive():
            return None  # given up on (:meth:`ready`)
        if not self._done:  # never started (a controller driven by hand, in tests)
            self._resolve()
        return self._wire

    def settle(self, timeout_s: float = 60.0) -> None:
        """Wait for a resolution still under way. A run stopped a second after it started
        ended its process while this thread was still inside torch building a network, and
        the process died of it (SIGABRT: "terminate called without an active exception",
        after its summary was written) instead of exiting 130."""
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _resolve(self) -> None:
        try:
            self._wire = RunShape.resolve(self.config)
        except ConfigError as e:
            self.refused = e
        self._done = True


def _on_cpu(config: ExperimentConfig, name: str) -> ExperimentConfig:
    """``config`` with policy ``name`` built on the CPU: a layout is the same on any device,
    and the controller must not take a GPU the trainers need."""
    comp = config.policies[name].policy
    if "device" not in comp.args:
        return config
    policy = dataclasses.replace(comp, args={**comp.args, "device": "cpu"})
    policies = dict(config.policies)
    policies[name] = dataclasses.replace(config.policies[name], policy=policy)
    return dataclasses.replace(config, policies=policies)


# ----------------------------------------------------------------------- wire forms
def space_to_wire(space: gym.Space) -> dict[str, Any]:
    """Box (HybridBox too), Discrete, MultiDiscrete, MultiBinary, and Dict and Tuple of them;
    TypeError else."""
    if isinstance(space, HybridBox):  # a Box would lose which entries are choices
        choices = space.choices
        return {"hybrid": [space.nvec, space.low[choices:], space.high[choices:]]}
    if isinstance(space, gym.spaces.Box):
        return {"box": [space.low, space.high, space.dtype.str]}
    if isinstance(space, gym.spaces.Discrete):
        return {"discrete": [int(space.n), int(space.start)]}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"multi_discrete": [space.nvec, space.dtype.str]}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"multi_binary": np.asarray(space.n).tolist()}
    if isinstance(space, gym.spaces.Dict):
        return {"dict": {k: space_to_wire(s) for k, s in space.spaces.items()}}
    if isinstance(space, gym.spaces.Tuple):
        return {"tuple": [space_to_wire(s) for s in space.spaces]}
    raise TypeError(f"a {type(space).__name__} space has no wire form")


def space_from_wire(body: Any) -> gym.Space:
    ((kind, value),) = body.items()
    if kind == "hybrid":
        nvec, low, high = value
        return HybridBox(np.asarray(nvec), np.asarray(low), np.asarray(high))
    if kind == "box":
        low, high, dtype = value
        return gym.spaces.Box(np.asarray(low), np.asarray(high), dtype=np.dtype(dtype))
    if kind == "discrete":
        return gym.spaces.Discrete(int(value[0]), start=int(value[1]))
    if kind == "multi_discrete":
        return gym.spaces.MultiDiscrete(np.asarray(value[0]), dtype=np.dtype(value[1]))
    if kind == "multi_binary":
        return gym.spaces.MultiBinary(value)
    if kind == "dict":
        return gym.spaces.Dict({k: space_from_wire(s) for k, s in value.items()})
    if kind == "tuple":
        return gym.spaces.Tuple([space_from_wire(s) for s in value])
    raise ValueError(f"unknown space kind {kind!r}")


def spec_to_wire(spec: Spec) -> Any:
    if spec is None:
        return None
    if isinstance(spec, Leaf):
        return {"leaf": [list(spec.shape), spec.dtype.str, spec.finite]}
    if isinstance(spec, Maybe):
        return {"maybe": spec_to_wire(spec.spec)}
    if isinstance(spec, Tree):
        return {"tree": {k: spec_to_wire(v) for k, v in spec.items.items()}}
    if isinstance(spec, Scalar):
        return {"scalar": spec.kind.__name__}
    return {"named": {k: spec_to_wire(v) for k, v in spec.items()}}


def spec_from_wire(body: Any) -> Spec:
    if body is None:
        return None
    ((kind, value),) = body.items()
    if kind == "leaf":
        shape, dtype, finite = value
        return Leaf(tuple(int(n) for n in shape), np.dtype(dtype), bool(finite))
    if kind == "maybe":
        return Maybe(spec_from_wire(value))
    if kind == "tree":
        return Tree({str(k): spec_from_wire(v) for k, v in value.items()})
    if kind == "scalar":
        return Scalar(_SCALARS[value])
    if kind == "named":
        return {str(k): spec_from_wire(v) for k, v in value.items()}
    raise ValueError(f"unknown spec kind {kind!r}")
