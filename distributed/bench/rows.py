"""One row of the benchmark table: a figure, what was measured, the target and whether it was met.

Its own module so that every suite (and the CPU profile) can make rows without importing the
suites that run them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Row:
    suite: str
    figure: str
    measured: str
    target: str = ""
    met: bool | None = None
    """None: no target for this figure."""
