"""The layouts a run declares for its messages, built from its configuration and spaces.

Each layout is built the way the senders build the real thing (once per run, by the controller:
:mod:`system.run.shape`): a rollout request is made by an actor's own
:class:`~system.workers.lanes.Lane` from an observation sampled from the policy's observation
space; a sample segment by the same lane and a :class:`~system.workers.trajectory.SegmentBuffer`
from the policy's answer to that request; a replay batch by a replay buffer from such a segment;
a checkpoint by the policy's ``get_checkpoint``. So the checks cannot drift from what honest
peers send, and a change of policy or environment needs no second description of its messages.
"""

from __future__ import annotations

from typing import Any

from api.config import ExperimentConfig
from api.environment import StepResult
from api.episode import ACTOR_HOOKS, SegmentFields
from api.policy import Policy, RolloutRequest, RolloutResult, SampleBatch
from api.registry import make_callbacks
from system.run import builders
from system.streams import validation, wire
from system.streams.validation import (
    BatchLayout,
    Maybe,
    ParamsLayout,
    PriorityLayout,
    RequestLayout,
    SegmentLayout,
)
from system.workers.actor_hooks import declared_fields
from system.workers.lanes import Lane, Slot
from system.workers.trajectory import SegmentBuffer, with_extras


def max_lane_rows(config: ExperimentConfig, spaces: builders.AgentSpaces) -> int:
    """The most agents one actor asks for in one request (one lane holds at most every agent
    of every environment of one process)."""
    envs = max(config.actors.envs_per_worker, config.evaluation.envs_per_worker)
    return envs * spaces.agent_count


def request_layout(
    config: ExperimentConfig, spaces: builders.AgentSpaces, policy: Policy, name: str
) -> RequestLayout:
    """What the policy workers of policy ``name`` may receive."""
    lane = _lane(config, spaces, name, buffer=None)
    row = validation.spec_of(lane.build_request(seq=1), 1)
    state = policy.default_policy_state
    row["policy_state"] = None if state is None else Maybe(validation.spec_of(state, 1))
    return RequestLayout(row, max_lane_rows(config, spaces))


def segment_layout(
    config: ExperimentConfig, spaces: builders.AgentSpaces, policy: Policy, name: str
) -> SegmentLayout:
    """What the trainers of policy ``name`` may receive: segments an actor's lane records from
    the policy's own answers."""
    segment = with_extras(_probe_segment(config, spaces, policy, name), extra_fields(config))
    step = validation.spec_of(segment, 2)
    length = config.actors.segment_length + 1
    return SegmentLayout(step, length, max_lane_rows(config, spaces))


def extra_fields(config: ExperimentConfig) -> SegmentFields:
    """The fields the experiment's actor callbacks add to every segment (``segment_fields``),
    read from the callbacks built as the actors build them."""
    if not config.actor_callbacks:
        return {}
    return declared_fields(make_callbacks(config.actor_callbacks, ACTOR_HOOKS, "actor_callbacks"))


def priority_layout(config: ExperimentConfig, name: str) -> PriorityLayout:
    """What the replay worker of policy ``name`` may receive: a trainer's request, with the
    priorities of the batches it trained on since its last request, at most one message's
    (:class:`~system.workers.batch_source.ReplaySource`)."""
    return PriorityLayout(config.policies[name].replay.message_rows)


def batch_layout(
    config: ExperimentConfig, spaces: builders.AgentSpaces, policy: Policy, name: str
) -> BatchLayout:
    """What the trainers of policy ``name`` may receive from its replay worker: batches a
    replay buffer samples from a segment the policy's actors record (the buffer's own fields:
    n-step returns, discounts, weights, keys)."""
    from system.replay.buffer import ReplayBuffer, ReplayConfig
    from system.replay.rate_limiter import RateLimiterConfig

    buffer = ReplayBuffer(ReplayConfig(capacity_frames=1, rate_limit=RateLimiterConfig(1)))
    buffer.insert(with_extras(_probe_segment(config, spaces, policy, name), extra_fields(config)))
    row = validation.spec_of(buffer.sample(1), 1)
    return BatchLayout(row, config.policies[name].replay.message_rows)


def _probe_segment(
    config: ExperimentConfig, spaces: builders.AgentSpaces, policy: Policy, name: str
) -> SampleBatch:
    """A segment an actor's lane records from the policy's own answers: two one-step segments,
    so the bootstrap-step path is exercised; the second, ``[2, 1, ...]``."""
    lane = _lane(config, spaces, name, buffer=SegmentBuffer(1, 1))
    segment = None
    for seq in (1, 2):
        request = lane.build_request(seq)
        segment = lane.take_answer(_probe_rollout(policy, request), version=0)
    return segment


def params_layout(config: ExperimentConfig) -> ParamsLayout:
    """What the parameter service may store: each trained policy's checkpoint layout, read from
    a policy built as the trainers build it."""
    trained = builders.trained_policies(config)
    if not trained:
        return ParamsLayout({})
    spaces = builders.probe_spaces(config)
    return ParamsLayout(
        {n: params_spec(builders.make_policy(config, n, spaces, config.seed)) for n in trained}
    )


def params_spec(policy: Policy) -> Any:
    """The layout of ``policy``'s checkpoints, with arrays as the wire delivers them."""
    delivered = wire.decode(wire.encode("params", policy.get_checkpoint())).body
    return validation.spec_of(delivered, 0, finite=False)


def _lane(config, spaces, name: str, buffer: SegmentBuffer | None) -> Lane:
    agent = config.agent_of_policy(name)
    space = spaces.observation[agent]
    space.seed(config.seed)
    slot = Slot(0, agent, name, result=StepResult(space.sample()))
    return Lane(name, [slot], buffer)


def _probe_rollout(policy: Policy, request: RolloutRequest) -> RolloutResult:
    """The policy's answer to ``request`` without moving the random streams training uses."""
    import torch  # the workers that build layouts with a policy have torch already

    state = policy.default_policy_state
    if request.policy_state is None and state is not None:
        request = request[:]
        request.policy_state = state
    with torch.random.fork_rng(devices=[]):
        result: Any = policy.rollout(request)
    return wire.decode(wire.encode("rollout_result", {"r": result})).body["r"]
