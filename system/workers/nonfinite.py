"""An actor's guard against NaN and infinite values, before they reach a policy or a trainer.

A non-finite observation or reward is the environment's bug; a non-finite action means the
policy's parameters diverged. Either one, let through, ends far away as a trainer that
crash-loops with advice about the learning rate. The actor checks every request before it is
posted and every answer before it steps, and names the environment, the agent and the step.
``actors.on_nonfinite`` decides: ``fail`` (the default) ends the run with that message,
``drop_episode`` forgets the episode (rate-limited warnings) and resets the environment.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from api.errors import NonFiniteError
from system.ratelimit import BadMessages
from system.workers.lanes import Group, Slot, nonfinite_rows

logger = logging.getLogger(__name__)


class NonFiniteGuard:
    """Finds environments whose inputs or actions are not finite, and fails or records them."""

    def __init__(self, worker_id: str, mode: str, where: Callable[[Slot], str]):
        """``where(slot)``: the slot's environment, agent and step, for the messages."""
        self.mode = mode
        self.where = where
        self.dropped = BadMessages(logger, f"{worker_id}: on_nonfinite=drop_episode")

    def inputs(self, group: Group) -> dict[int, str]:
        """Environments of ``group`` whose latest observation or reward for an agent is NaN or
        infinite, each with the error to report."""
        bad: dict[int, str] = {}
        for policy in group.waiting:
            for slot, what in group.lanes[policy].nonfinite_inputs():
                bad.setdefault(
                    slot.env,
                    f"{self.where(slot)} returned a non-finite {what} (NaN or infinity); fix the "
                    "environment (look for divisions by zero, unbounded physics or missing "
                    "clipping)",
                )
        return bad

    def actions(self, group: Group) -> dict[int, str]:
        """Environments of ``group`` that a policy answered with a NaN or infinite action."""
        bad: dict[int, str] = {}
        for policy in group.waiting:
            lane, reply = group.lanes[policy], group.replies[policy]
            for slot in lane.slots_of_rows(nonfinite_rows(reply.result.action)):
                bad.setdefault(
                    slot.env,
                    f"policy '{policy}' answered {self.where(slot)} with a non-finite action "
                    "(NaN or infinity): its parameters have probably diverged; lower the "
                    "learning rate or clip gradients, and check the rewards' scale",
                )
        return bad

    def handle(self, bad: dict[int, str], *, after_reset: bool) -> None:
        """Fail with the first problem, or (``drop_episode``) log them, rate-limited, for the
        caller to drop those episodes."""
        first = next(iter(bad.values()))
        if self.mode != "drop_episode":
            raise NonFiniteError(
                f"{first}; or set actors.on_nonfinite='drop_episode' to drop such episodes"
            )
        if after_reset:
            raise NonFiniteError(f"{first}, right after a reset: dropping the episode cannot help")
        for message in bad.values():
            self.dropped.record(NonFiniteError(f"{message}; episode dropped"))
