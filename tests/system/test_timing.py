"""Stage clocks, the controller's tally of them, and the bottleneck line (system.timing)."""

from __future__ import annotations

from io import StringIO

import pytest
from rich.console import Console

import system.timing as timing
from legacy.experiments.examples import cartpole_ppo
from system.run.display import Snapshot, plain_line, render_panel
from system.run.plan import ActorPlan, plan_workers
from system.run.tally import timing_role
from system.timing import (
    BatchSizes,
    RoleShares,
    RoleTimes,
    SharedStageClock,
    StageClock,
    bottleneck,
)


@pytest.fixture
def fake_clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(timing, "_perf_counter", lambda: now[0])
    return now


def test_every_moment_is_charged_to_exactly_one_stage(fake_clock):
    clock = StageClock()
    fake_clock[0] += 1.0  # control, from the start
    clock.enter("env_step")
    fake_clock[0] += 3.0
    clock.enter("wait_actions")
    fake_clock[0] += 2.0
    clock.enter("env_step")
    fake_clock[0] += 0.5
    assert clock.take() == {
        "stage/control": 1.0,
        "stage/env_step": 3.5,
        "stage/wait_actions": 2.0,
        "stage_wall_s": 6.5,
    }
    # the running stage goes on into the next interval, which starts where this one ended
    fake_clock[0] += 4.0
    assert clock.take() == {"stage/env_step": 4.0, "stage_wall_s": 4.0}


def test_batch_sizes_give_the_distribution_then_start_over():
    sizes = BatchSizes()
    for rows in (8, 8, 16, 32, 64):
        sizes.add(rows)
    figures = sizes.take()
    assert figures["batch_rows_mean"] == 25.6
    assert figures["batch_rows_p50"] == 16.0
    assert figures["batch_rows_max"] == 64.0
    assert 32.0 < figures["batch_rows_p90"] < 64.0
    assert sizes.take() == {}


def _beat(**seconds: float) -> dict[str, float]:
    stats = {f"stage/{k}": v for k, v in seconds.items()}
    stats["stage_wall_s"] = sum(seconds.values())
    return stats


def test_role_times_share_wall_time_over_every_worker_of_a_role():
    tally = RoleTimes()
    tally.add("actor", "actor/0", _beat(env_step=0.6, wait_actions=0.4))
    tally.add("actor", "actor/1", _beat(env_step=0.2, wait_actions=0.8))
    tally.add("trainer", "trainer/0", _beat(compute=0.9, wait_samples=0.1))
    tally.add("policy", "policy/0", {"version": 3})  # a heartbeat without timings
    roles = tally.take()
    assert set(roles) == {"actor", "trainer"}
    actor = roles["actor"]
    assert actor.workers == 2
    assert actor.shares == pytest.approx({"env_step": 0.4, "wait_actions": 0.6})
    assert actor.busy == pytest.approx(0.4)
    assert actor.largest_wait == ("wait_actions", pytest.approx(0.6))
    # an interval in which a role sent nothing (a trainer in a long step) keeps its last shares
    tally.add("actor", "actor/0", _beat(env_step=1.0))
    roles = tally.take()
    assert roles["trainer"].shares == pytest.approx({"compute": 0.9, "wait_samples": 0.1})
    assert roles["actor"].busy == 1.0
    assert timing.record(roles)["timing/trainer/busy"] == 0.9


def test_a_written_record_s_shares_are_over_the_time_since_the_last_one_written():
    """A thinned file keeps one record a minute: its shares are of that minute, not of the
    last second, which the panel shows."""
    tally = RoleTimes()
    tally.add("actor", "actor/0", _beat(env_step=0.9, wait_actions=0.1))
    tally.add("policy", "policy/0", {"batch_rows_mean": 10.0, "batch_rows_max": 12.0})
    tally.take(), tally.take_batches()  # a record thinned out
    tally.add("actor", "actor/0", _beat(env_step=0.1, wait_actions=0.9))
    tally.add("actor", "actor/1", _beat(env_step=1.0, wait_actions=1.0))
    tally.add("policy", "policy/0", {"batch_rows_mean": 20.0, "batch_rows_max": 40.0})
    tally.add("trainer", "trainer/0", _beat(compute=0.5, wait_samples=0.5))
    shown = timing.record(tally.take())
    assert shown["timing/actor/env_step"] == pytest.approx(1.1 / 3.0, abs=1e-4)
    assert tally.take_batches() == {"policy/batch_rows_mean": 20.0, "policy/batch_rows_max": 40.0}
    written = tally.take_written()
    assert written["timing/actor/env_step"] == pytest.approx(2.0 / 4.0)
    assert written["timing/actor/busy"] == pytest.approx(0.5)
    assert written["timing/trainer/compute"] == 0.5
    assert written["timing/policy/batch_rows_mean"] == 15.0
    assert written["timing/policy/batch_rows_max"] == 40.0
    # the next interval starts empty; a role silent in it keeps the shares last taken
    tally.add("actor", "actor/0", _beat(env_step=1.0))
    written = tally.take_written()
    assert written["timing/actor/busy"] == 1.0 and written["timing/trainer/compute"] == 0.5
    assert written == timing.record(tally.take())


def test_every_record_written_gets_the_figures_the_panel_shows():
    tally = RoleTimes()
    for beats in (
        [("actor", _beat(env_step=0.3, wait_actions=0.7))],
        [],
        [("trainer", _beat(compute=1.0))],
    ):
        for role, stats in beats:
            tally.add(role, f"{role}/0", {**stats, "batch_rows_mean": 4.0})
        shown = timing.record(tally.take())
        shown.update({f"timing/{k}": v for k, v in tally.take_batches().items()})
        assert tally.take_written() == shown


def test_the_bottleneck_names_the_saturated_role_and_the_one_that_waits():
    roles = [
        RoleShares("actor", 4, {"env_step": 0.3, "requests": 0.1, "wait_actions": 0.6}),
        RoleShares("policy", 1, {"forward": 0.5, "wait_requests": 0.5}),
        RoleShares("trainer", 1, {"compute": 0.81, "publish": 0.16, "wait_samples": 0.03}),
        RoleShares("parameter_service", 1, {"wait_requests": 0.99, "serve": 0.01}),
    ]
    assert bottleneck(roles) == "trainer busy 97% (compute 81%); actor waits 60% (wait_actions)"
    assert bottleneck([]) == ""
    # the parameter service waits by design, a trainer's loader thread for its own trainer:
    # neither is named as the role that waits
    loader = RoleShares("trainer.loader", 1, {"receive": 0.01, "wait_trainer": 0.99})
    assert bottleneck([*roles[2:], loader]) == "trainer busy 97% (compute 81%)"


def test_a_stalled_run_names_every_role_that_waits_not_one_of_those_that_tie():
    """Every role but the actor waits fully: the bottleneck line names one of them (the CI run
    of stop 53 failed on which), the stall message names each, in the frames' order."""
    roles = [
        RoleShares("trainer", 1, {"wait_samples": 0.9995, "control": 0.0005}),
        RoleShares("parameter_service", 1, {"wait_requests": 1.0}),
        RoleShares("trainer.loader", 1, {"wait_trainer": 1.0}),
        RoleShares("policy", 1, {"wait_requests": 0.9996, "forward": 0.0004}),
        RoleShares("actor", 1, {"env_step": 1.0}),
    ]
    assert timing.every_role(roles) == (
        "actor busy 100% (env_step 100%); policy waits 100% (wait_requests); "
        "trainer waits 100% (wait_samples)"
    )
    assert "trainer waits" not in bottleneck(roles)  # the tie went to the policy worker
    half = [RoleShares("replay", 2, {"insert": 0.5, "wait_samples": 0.5}),
            RoleShares("custom", 1, {"wait_x": 0.7, "x": 0.3})]  # fmt: skip
    assert timing.every_role(half) == "replay busy 50% (insert 50%); custom waits 70% (wait_x)"
    assert timing.every_role([]) == ""


def test_a_role_that_mostly_waits_is_busy_with_its_largest_work_not_its_wait():
    """Early in a (resumed) run only the policy worker had reported, and the panel read
    ``policy busy 21% (wait_requests 79%)``."""
    policy = RoleShares("policy", 1, {"forward": 0.15, "reply": 0.06, "wait_requests": 0.79})
    assert policy.largest_stage == ("forward", pytest.approx(0.15))
    assert bottleneck([policy]) == "policy busy 21% (forward 15%)"
    idle = RoleShares("trainer", 1, {"wait_samples": 1.0})
    assert idle.largest_stage == ("wait_samples", 1.0)  # all waits: the largest of them


def test_a_threads_stages_are_a_part_of_the_role_of_their_own():
    tally = RoleTimes()
    stats = {**_beat(wait_batch=0.1, compute=0.9)}
    stats.update({f"loader.{k}": v for k, v in _beat(receive=0.2, wait_trainer=0.8).items()})
    tally.add("trainer", "trainer/default/0", stats)
    roles = tally.take()
    assert roles["trainer"].shares == pytest.approx({"wait_batch": 0.1, "compute": 0.9})
    assert roles["trainer.loader"].shares == pytest.approx({"receive": 0.2, "wait_trainer": 0.8})
    assert timing.without_timing({**stats, "version": 7, "batch_rows_max": 3.0}) == {"version": 7}


def test_evaluation_actors_are_tallied_apart_from_training_actors():
    plans = plan_workers(cartpole_ppo())
    roles = {timing_role(p) for p in plans}
    assert roles == {"actor", "eval_actor", "policy", "trainer", "parameter_service"}
    for plan in plans:
        if isinstance(plan, ActorPlan):
            assert timing_role(plan) == ("eval_actor" if plan.evaluation else "actor")


def test_the_panel_and_the_plain_line_show_the_bottleneck():
    snapshot = Snapshot(bottleneck="trainer busy 97% (compute 81%); actor waits 60% (wait_actions)")
    assert plain_line(snapshot).endswith(
        "| trainer busy 97% (compute 81%); actor waits 60% (wait_actions)"
    )
    out = StringIO()
    Console(file=out, width=120).print(render_panel("cartpole-ppo", snapshot))
    assert "bottleneck  trainer busy 97% (compute 81%)" in out.getvalue()
    out = StringIO()
    Console(file=out, width=120).print(render_panel("cartpole-ppo", Snapshot()))
    assert "bottleneck  -" in out.getvalue()


def test_a_shared_clock_taken_from_another_thread_loses_and_doubles_nothing():
    import sys
    import threading

    clock = SharedStageClock()
    stop = threading.Event()

    def switch():
        while not stop.is_set():
            clock.enter("receive")
            clock.enter("wait_samples")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads interleave inside enter and take (without the lock)
    thread = threading.Thread(target=switch)
    thread.start()
    try:
        reports = [clock.take() for _ in range(20_000)]
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    for stats in reports:
        stages = sum(v for k, v in stats.items() if k.startswith("stage/"))
        assert stages == pytest.approx(stats["stage_wall_s"], abs=1e-9)


def test_a_long_poll_reports_its_stage_while_it_runs():
    """A trainer inside one long step (minutes on a CPU for pixels) beats from its busy thread;
    those beats carry the step's seconds, so the timings say "compute", not the wait before."""
    import threading
    import time

    from system.roles import Role
    from system.run import worker_process
    from system.workers.base import Worker

    class Control:
        worker_id = "trainer/default/0"

        def __init__(self):
            self.beats: list[dict] = []
            self.stop = threading.Event()

        def heartbeat(self, stats):
            self.beats.append(dict(stats))

        def stop_requested(self, wait_s=0.0):
            return self.stop.is_set()

        def leave_requested(self):
            return False

        def send(self, message):
            pass

        def check_controller(self):
            pass

    class LongStep(Worker):
        role = Role.TRAINER

        def __init__(self):
            super().__init__("trainer/default/0")
            self.step, self.release, self.inside = threading.Event(), threading.Event(), False

        def poll(self):
            if self.step.is_set() and not self.release.is_set():
                self.stages.enter("compute")
                self.inside = True
                self.release.wait(30)  # one long step, until the test has seen it reported
                self.inside = False
            else:
                self.stages.enter("wait_batch")
                time.sleep(0.005)
            return 0

    ctl, worker = Control(), LongStep()
    ended: list[int] = []  # the loop's exit code: a stand-in short of a method ended it early
    limit = ("liveness.max_poll_s", 60.0)
    loop = threading.Thread(
        target=lambda: ended.append(worker_process._loop(ctl, worker, [], limit))
    )
    loop.start()
    try:
        _wait_for(lambda: len(ctl.beats) >= 2)
        worker.step.set()
        _wait_for(lambda: sum("stage/compute" in b for b in ctl.beats) >= 2)
        during = [b for b in ctl.beats if "stage/compute" in b]
        assert worker.inside  # those beats came from the busy thread, while the poll ran
        # the first also ends the wait before the step; the next hold the step alone
        assert set(during[1]) == {"stage/compute", timing.WALL_KEY}
    finally:
        worker.release.set()
        ctl.stop.set()
        loop.join(timeout=10)
    assert not loop.is_alive() and ended == [worker_process.EXIT_OK]
    for beat in ctl.beats:  # every beat's stages add up to the wall time it covers
        stages = sum(v for k, v in beat.items() if k.startswith(timing.STAGE_KEY))
        assert stages == pytest.approx(beat[timing.WALL_KEY], abs=1e-9)


def _wait_for(condition, timeout_s: float = 30.0) -> None:
    deadline = __import__("time").monotonic() + timeout_s
    while not condition():
        assert __import__("time").monotonic() < deadline, "timed out"
        __import__("time").sleep(0.01)
