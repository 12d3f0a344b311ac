"""CartPole whose step never returns once, as a deadlocked simulator's would (used by
tests/system/test_hung_poll.py). The marker file makes it hang once per run: the actor process
restarted after the hang finds the file and steps on."""

from __future__ import annotations

import os
import threading
from typing import Any

from legacy.environment.gym_adapter import GymnasiumEnvironment


class HangingCartPole(GymnasiumEnvironment):
    def __init__(self, marker: str, hang_at_step: int = 100):
        super().__init__("CartPole-v1")
        self.marker, self.hang_at_step, self.steps = marker, hang_at_step, 0

    @staticmethod
    def check_args(args: dict[str, Any]) -> list[str]:
        return []  # no gymnasium arguments: the constructor's signature says it all

    def step(self, actions):
        self.steps += 1
        if self.steps == self.hang_at_step and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            threading.Event().wait()  # forever: only a restart ends this process
        return super().step(actions)
