"""CartPole slow to make, as a simulator that starts a process is (used by
tests/system/test_env_making.py). Each make sleeps ``make_s`` and leaves a file in ``marks``
named after the process and thread that made it, and one ``closed-...`` as it is closed. With
``crash_at_step``, its step raises once per run there (a simulator that crashes), leaving a file
``crashed`` in ``marks``; with ``hang_at_step``, it hangs there once (``hung``); with ``child``,
it starts a process, as a simulator does (``child-PID``), which ``close`` ends (unless
``leave_child``: a close that forgets it)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from legacy.environment.gym_adapter import GymnasiumEnvironment


class SlowToMakeCartPole(GymnasiumEnvironment):
    def __init__(
        self,
        marks: str,
        make_s: float = 1.2,
        crash_at_step: int = 0,
        hang_at_step: int = 0,
        child: bool = False,
        leave_child: bool = False,
    ):
        time.sleep(make_s)
        super().__init__("CartPole-v1")
        self.marks, self.crash_at_step, self.steps = Path(marks), crash_at_step, 0
        self.marks.mkdir(parents=True, exist_ok=True)
        self.hang_at_step, self.leave_child = hang_at_step, leave_child
        self.child = subprocess.Popen(["sleep", "600"]) if child else None  # a simulator
        if self.child is not None:
            (self.marks / f"child-{self.child.pid}").touch()
        made = f"{os.getpid()}-{threading.current_thread().name}-{time.monotonic_ns()}"
        Path(marks).mkdir(parents=True, exist_ok=True)
        (Path(marks) / made).touch()

    def close(self) -> None:
        closed = f"closed-{os.getpid()}-{threading.current_thread().name}-{time.monotonic_ns()}"
        (self.marks / closed).touch()
        if self.child is not None and not self.leave_child:
            self.child.kill()
            self.child.wait()
        super().close()

    def step(self, actions):
        self.steps += 1
        crashed = self.marks / "crashed"
        if self.steps == self.crash_at_step and not crashed.exists():
            crashed.touch()
            raise RuntimeError("the simulator crashed")
        hung = self.marks / "hung"
        if self.steps == self.hang_at_step and not hung.exists():
            hung.touch()
            threading.Event().wait()  # for ever: only a restart ends this process
        return super().step(actions)

    @staticmethod
    def check_args(args: dict[str, Any]) -> list[str]:
        return []  # no gymnasium arguments: the constructor's signature says it all
