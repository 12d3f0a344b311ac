"""Errors a worker recovers from are logged without a flood: one traceback per type, then a
line at most every ``every_s`` seconds with how many came since."""

from __future__ import annotations

import logging

from system import ratelimit
from system.ratelimit import RecoveredErrors


def _raised(error: Exception) -> Exception:
    try:
        raise error
    except Exception as e:
        return e


def test_one_traceback_per_error_type_then_a_counted_line_every_so_often(caplog, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(ratelimit.time, "monotonic", lambda: now[0])
    log = logging.getLogger("recovered-errors-test")
    errors = RecoveredErrors(log, every_s=10.0)
    with caplog.at_level(logging.WARNING, logger=log.name):
        for i in range(50):  # a glitch every 0.1 s for 5 s: one traceback
            now[0] += 0.1
            errors.record(f"env {i % 4} raised; resetting it", _raised(RuntimeError("glitch")))
        errors.record("env 9 raised; resetting it", _raised(ValueError("other")))  # a new type
        now[0] += 10.0
        errors.record("env 1 raised; resetting it", _raised(RuntimeError("glitch")))
        errors.record("env 2 returned a bad value; resetting it", None)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4, lines
    assert lines[0].startswith("env 0 raised; resetting it\nTraceback") and "glitch" in lines[0]
    assert lines[1].startswith("env 9 raised; resetting it\nTraceback") and "other" in lines[1]
    # 49 RuntimeErrors came after the first, unlogged; this one is the 50th since its line
    assert lines[2] == ("env 1 raised; resetting it (50 RuntimeError errors since the last "
                        "such line, 52 errors in all; the first was shown in full)")  # fmt: skip
    assert lines[3] == "env 2 returned a bad value; resetting it"  # a first of its kind
    assert errors.count == 53
