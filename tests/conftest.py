"""What the whole suite shares: how many processes ``pytest -n auto`` runs it in."""

from __future__ import annotations

import os

MAX_AUTO_WORKERS = 16
"""``-n auto`` runs one pytest process a core, at most this many. Many tests start a run of
their own (5-7 worker processes, each with torch loaded), so on a large machine more pytest
processes than this only queue for memory; ``PYTEST_XDIST_AUTO_NUM_WORKERS`` or ``-n N`` sets
another number."""


def pytest_xdist_auto_num_workers(config) -> int | None:
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own reading of it
    return max(1, min(MAX_AUTO_WORKERS, len(os.sched_getaffinity(0))))
