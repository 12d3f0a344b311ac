"""Per-agent trajectory building: step records in, fixed-length overlapping segments out.

A segment is ``segment_length + 1`` steps: the last step only bootstraps the return (its value),
and it is also the first step of the next segment, so no step is lost or trained on twice.
Segments run across episode boundaries; ``done``/``truncated``/``on_reset`` say where episodes end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from api.namedarray import NamedArray, stack
from api.policy import SampleBatch


@dataclass
class AgentTrajectory:
    """The steps of one agent since its last emitted segment."""

    segment_length: int
    steps: list[SampleBatch] = field(default_factory=list)

    def append(self, step: SampleBatch) -> SampleBatch | None:
        """Add one step; return a full segment ``[T, ...]`` when one is complete."""
        self.steps.append(step)
        if len(self.steps) < self.segment_length + 1:
            return None
        segment = stack(self.steps)
        self.steps = [self.steps[-1]]
        return segment

    def clear(self) -> None:
        """Forget unfinished steps (after an environment failure: they have no valid future)."""
        self.steps = []


def make_step(
    obs,
    reward: float,
    done: bool,
    truncated: bool,
    on_reset: bool,
    action,
    policy_output: NamedArray | None,
    policy_state: NamedArray | None,
    version: int,
) -> SampleBatch:
    """One unbatched step record, with the dtypes and ``(1,)`` shapes SampleBatch documents."""
    return SampleBatch(
        obs=obs,
        action=action,
        policy_output=policy_output,
        policy_state=policy_state,
        reward=np.array([reward], dtype=np.float32),
        done=np.array([done], dtype=np.bool_),
        truncated=np.array([truncated], dtype=np.bool_),
        on_reset=np.array([on_reset], dtype=np.bool_),
        policy_version=np.array([version], dtype=np.int64),
    )


def batch_segments(segments: list[SampleBatch]) -> SampleBatch:
    """Stack ``[T, ...]`` segments into one time-major ``[T, B, ...]`` batch."""
    return stack(segments, axis=1)
