"""CartPole that prints, as a user's environment under debugging does (used by
tests/distributed/test_worker_output.py): on its first reset a line to stdout, one to stderr,
and one written to file descriptor 1 directly, as C code (a simulator) writes; ``partial``: the
stderr line without its newline, the last thing the process writes."""

from __future__ import annotations

import os
import sys

from legacy.environment.gym_adapter import GymnasiumEnvironment


class PrintingCartPole(GymnasiumEnvironment):
    def __init__(self, partial: bool = False):
        super().__init__("CartPole-v1")
        self.partial, self.said = partial, False

    def reset(self):
        if not self.said:
            self.said = True
            print(f"printed by pid {os.getpid()}", flush=True)
            os.write(1, f"written to fd 1 by pid {os.getpid()}\n".encode())
            end = "" if self.partial else "\n"
            print(f"to stderr by pid {os.getpid()}", end=end, file=sys.stderr, flush=True)
        return super().reset()
