"""What the whole suite shares: how many processes ``pytest -n auto`` runs it in, and how a
test that starts jobs outside pytest's processes (containers, Slurm jobs) tells what an earlier,
killed session left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

MAX_AUTO_WORKERS = 16
"""``-n auto`` runs one pytest process a core, at most this many. Many tests start a run of
their own (5-7 worker processes, each with torch loaded), so on a large machine more pytest
processes than this only queue for memory; ``PYTEST_XDIST_AUTO_NUM_WORKERS`` or ``-n N`` sets
another number."""


def pytest_xdist_auto_num_workers(config) -> int | None:
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own reading of it
    return max(1, min(MAX_AUTO_WORKERS, len(os.sched_getaffinity(0))))


@pytest.fixture(scope="session")
def left_by_earlier_sessions(tmp_path_factory):
    """Whether a path is under an earlier pytest session's temporary folder (of this user).

    Containers and Slurm jobs outlive a session that is killed (CI stopped, Ctrl+C twice);
    they keep their names and use the CPU, and the next session's tests meet them. A test that
    starts such things removes the ones whose folders this says are an earlier session's: a
    user's own runs, elsewhere, are never touched. Always False under ``--basetemp``.

    This session's folder is the ``pytest-N`` under ``pytest-of-<user>``: under pytest-xdist
    each process has a folder of its own inside it, and the other processes' runs are this
    session's too."""
    basetemp = tmp_path_factory.getbasetemp().resolve()
    chain = [basetemp, *basetemp.parents]
    at = next((i for i, p in enumerate(chain) if p.name.startswith("pytest-of-")), None)
    root, session = (None, None) if at in (None, 0) else (chain[at], chain[at - 1])

    def earlier(path: str | Path) -> bool:
        path = Path(path)
        return root is not None and path.is_relative_to(root) and not path.is_relative_to(session)

    return earlier
