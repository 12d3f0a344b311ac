"""``api.testing.test_pipeline`` is the user's door to ``system.run.pipeline_check``.

The api package must not import the runtime, so the door repeats the runtime function's
signature and forwards every argument through the ``troupe.runtime`` entry point. These tests
keep the two lists of arguments from drifting apart."""

from __future__ import annotations

import inspect

from api import testing
from system.run import pipeline_check


def test_the_door_and_the_runtime_take_the_same_arguments():
    door = inspect.signature(testing.test_pipeline)
    runtime = inspect.signature(pipeline_check.run_pipeline_check)
    assert [(p.name, p.kind, p.default) for p in door.parameters.values()] == [
        (p.name, p.kind, p.default) for p in runtime.parameters.values()
    ]


def test_the_door_finds_the_runtime_through_its_entry_point():
    assert testing._runtime_check() is pipeline_check.run_pipeline_check
