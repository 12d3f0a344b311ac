"""``pytest -n auto``: one process a core, up to a cap; what an earlier session left
(tests/conftest.py)."""

import importlib.util
import os
from pathlib import Path

import pytest


def _conftest():
    path = Path(__file__).resolve().parents[1] / "conftest.py"
    spec = importlib.util.spec_from_file_location("suite_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_auto_is_one_process_a_core_up_to_the_cap(monkeypatch):
    conftest = _conftest()
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    for cores, expected in ((1, 1), (2, 2), (16, 16), (96, conftest.MAX_AUTO_WORKERS)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cores: set(range(n)))
        assert conftest.pytest_xdist_auto_num_workers(None) == expected
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "5")
    assert conftest.pytest_xdist_auto_num_workers(None) is None  # xdist's own hook reads it


def test_only_an_earlier_sessions_folders_count_as_left(left_by_earlier_sessions, tmp_path):
    """Under pytest-xdist another process's folder is this session's: the docker tests must not
    remove the runs of a test running beside them."""
    sessions = [p for p in tmp_path.parents if p.parent.name.startswith("pytest-of-")]
    if not sessions:
        pytest.skip("--basetemp: nothing is taken for an earlier session's")
    session = sessions[0]
    assert not left_by_earlier_sessions(tmp_path / "run")
    assert not left_by_earlier_sessions(session / "popen-gw9" / "test_x0" / "run")
    # another session's number (the first session on a machine is pytest-0 itself)
    other = "pytest-1" if session.name == "pytest-0" else "pytest-0"
    assert left_by_earlier_sessions(session.parent / other / "test_x0" / "run")
    assert not left_by_earlier_sessions("/home/someone/runs/cp1")
