"""What each component asks a cluster for (``distributed/deploy/sizing.py``): one component per
runtime role, each with figures."""

from __future__ import annotations

import json

from distributed.deploy import sizing
from system.roles import Role


def test_every_role_is_a_component_with_figures():
    assert sizing.COMPONENTS == (
        "controller", "params", "trainer", "policy", "actor", "replay", "eval",
    )  # fmt: skip
    assert {sizing.component_of(r.value, r.value) for r in Role} <= set(sizing.COMPONENTS)
    assert set(sizing.MEASURED) == set(sizing.COMPONENTS)  # Troupe's own roles are measured


def test_a_role_defined_outside_troupe_is_sized_from_its_plan():
    """Never measured here, it asks what a policy worker does if it runs a network, else what an
    actor does; ``--memory``/``--cpus`` can name it like any component."""
    from dataclasses import dataclass
    from typing import ClassVar

    from system.run.plan import PLAN_TYPES, WorkerPlan

    @dataclass(frozen=True)
    class ScorerPlan(WorkerPlan):
        role: ClassVar[str] = "scorer"
        stop_order: ClassVar[int] = 1
        poll_order: ClassVar[int] = 2
        needs_torch: ClassVar[bool] = True

    try:
        assert "scorer" in sizing.components()
        assert sizing.needs_of(sizing.MEASURED, "scorer") == sizing.MEASURED["policy"]
        needs = sizing.role_needs(memory_mib=sizing.parse_overrides(["scorer=900"], "--memory"))
        assert needs["scorer"].peak_memory_mib == 900 and needs["scorer"].cpus == 1
    finally:
        del PLAN_TYPES["scorer"]


def test_a_runs_workers_json_sizes_the_replay_worker(tmp_path):
    workers = {
        "params": {"role": "parameter_service", "peak_rss_mb": 60.0},
        "replay/default": {"role": "replay", "peak_rss_mb": 900.0},
        "eval/0": {"role": "actor", "peak_rss_mb": 50.0},
    }
    (tmp_path / "workers.json").write_text(json.dumps(workers))
    peaks = sizing.measured_from(tmp_path)
    assert peaks == {"params": 60.0, "replay": 900.0, "eval": 50.0}
    needs = sizing.role_needs(measured=peaks)
    assert needs["replay"].memory_mib == 1136  # 900 x 1.25 = 1125, in whole 16 MiB


def test_a_figure_nobody_measured_is_left_out_not_a_crash(tmp_path):
    """`troupe bench memory --json` says None (n/a) of a role it could not measure, and a
    worker that never came up has no peak in workers.json: neither sizes anything."""
    bench = {"suites": {"memory": {"cartpole-ppo": {"peak_rss_mb_by_role": {
        "actor": None, "trainer": 310.0}}}}}  # fmt: skip
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    assert sizing.measured_from(tmp_path / "bench.json") == {"trainer": 310.0}
    workers = {"actor/0": {"role": "actor", "peak_rss_mb": None},
               "params": {"role": "parameter_service", "peak_rss_mb": 60.0}}  # fmt: skip
    (tmp_path / "workers.json").write_text(json.dumps(workers))
    assert sizing.measured_from(tmp_path) == {"params": 60.0}
