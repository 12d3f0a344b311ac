"""The local launcher's end of a run: the wait for worker processes to end is one wait for all
of them, then what is left is killed."""

from __future__ import annotations

from distributed.launch import local


class Hung:
    """A worker process stuck in a step: it ends only when killed; a join waits its timeout
    out on the test's clock."""

    def __init__(self, clock: list[float]):
        self.clock, self.alive, self.pid, self.exitcode = clock, True, None, None
        self.joins: list[float] = []

    def join(self, timeout: float | None = None) -> None:
        self.joins.append(timeout)
        if self.alive:
            self.clock[0] += timeout or 0.0

    def is_alive(self) -> bool:
        return self.alive

    def kill(self) -> None:
        self.alive, self.exitcode = False, -9


def test_hung_workers_share_one_timeout_and_are_killed(monkeypatch):
    """Three actors hung in a step made the end of a run 30 s long: each join had the whole
    10 s. Now the first waits them out and the others are killed at once."""
    clock = [1000.0]
    monkeypatch.setattr(local.time, "monotonic", lambda: clock[0])
    launcher = local.LocalLauncher()
    hung = {f"actor/{i}": Hung(clock) for i in range(3)}
    launcher.processes.update(hung)
    launcher.stop_all(timeout_s=10.0)
    assert clock[0] - 1000.0 == 10.0  # one wait, shared
    assert [p.joins[0] for p in hung.values()] == [10.0, 0.0, 0.0]
    assert not any(p.alive for p in hung.values())
