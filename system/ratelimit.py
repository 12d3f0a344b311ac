"""Rate-limited logging for hot loops: a flood of bad input must not become a flood of lines."""

from __future__ import annotations

import logging
import time


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
