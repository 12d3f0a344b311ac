"""Rate limits for hot loops: a flood of bad input must not become a flood of log lines, and a
worker held to a pace must not take more CPU than its share."""

from __future__ import annotations

import logging
import time
import traceback


class BadMessages:
    """Counts malformed or foreign messages dropped by one socket owner, logging a few of them."""

    def __init__(self, logger: logging.Logger, where: str, every_s: float = 5.0):
        self.logger = logger
        self.where = where
        self.every_s = every_s
        self.count = 0
        self._last_log = float("-inf")
        self._since_log = 0

    def record(self, error: Exception) -> None:
        self.count += 1
        self._since_log += 1
        now = time.monotonic()
        if now - self._last_log >= self.every_s:
            self.logger.warning(
                "%s dropped %d malformed message(s) (%d in all); latest: %s",
                self.where,
                self._since_log,
                self.count,
                error,
            )
            self._last_log = now
            self._since_log = 0


class RecoveredErrors:
    """Errors a worker recovers from (an environment it rebuilds), logged without a flood: an
    emulator that glitches once in thousands of steps, in each of 16 environments, would print
    a traceback a second. The first error of each type shows its traceback; after it, one line
    of that type every ``every_s`` seconds says the latest and how many came since its last."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0):
        self.logger = logger
        self.every_s = every_s
        self.count = 0
        self._kinds: dict[str, list[float]] = {}
        """Per error type: [errors since its last line, when that line was logged]."""

    def record(self, message: str, error: BaseException | None) -> None:
        """Count one recovered error; ``message`` says what failed and what was done, ``error``
        what was raised (None: nothing was, e.g. a wrong value returned)."""
        self.count += 1
        kind = type(error).__name__ if error is not None else "returned value"
        now = time.monotonic()
        seen = self._kinds.get(kind)
        if seen is None:
            trace = "".join(traceback.format_exception(error)).rstrip() if error else ""
            self.logger.warning("%s%s", message, "\n" + trace if trace else "")
            self._kinds[kind] = [0, now]
            return
        seen[0] += 1
        if now - seen[1] >= self.every_s:
            self.logger.warning(
                "%s (%d %s errors since the last such line, %d errors in all; the first was "
                "shown in full)", message, seen[0], kind, self.count,
            )  # fmt: skip
            seen[:] = [0, now]


class Pace:
    """Holds a loop to ``rate`` events a second on average (a token bucket).

    Unused time earns credit for at most ``burst_s`` seconds, so a worker that was held up (say,
    waiting for a restarted peer) does not make up for it in one burst.
    """

    def __init__(self, rate: float, burst_s: float = 0.05):
        if not rate > 0:
            raise ValueError(f"rate must be more than 0, got {rate}")
        self.rate = rate
        self.capacity = max(1.0, rate * burst_s)
        self._tokens = self.capacity
        self._last = time.monotonic()

    def spend(self, events: int) -> None:
        """Count ``events`` done."""
        self._tokens -= events

    def wait_s(self) -> float:
        """Seconds to wait before the next event keeps the pace; 0 when it may go now."""
        now = time.monotonic()
        self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
        self._last = now
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate
