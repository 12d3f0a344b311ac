"""``pytest -n auto``: one process a core, up to a cap (tests/conftest.py)."""

import importlib.util
import os
from pathlib import Path


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
