"""The controller's watch for a run whose workers are all up and all waiting
(system/run/stall_watch.py): the clock, what resets it, the warning and the failure."""

from __future__ import annotations

import logging

from system.run.stall_watch import StallWatch

WAITS = "replay busy 4% (serve 3%); trainer waits 100% (wait_replay)"


def test_no_progress_with_every_worker_up_warns_once_then_fails():
    watch = StallWatch(fail_after_s=300.0, warn_after_s=120.0)
    assert watch.see(0.0, (2486, 0.0), True, WAITS) == ""
    assert watch.see(119.0, (2486, 0.0), True, WAITS) == ""
    assert watch.see(299.0, (2486, 0.0), True, WAITS) == ""
    failed = watch.see(300.0, (2486, 0.0), True, WAITS)
    assert failed.startswith("the run is stalled: no training frames (still 2,486) and no trainer")
    assert f"for 300 s with every worker up ({WAITS}); it stops" in failed
    assert "stop.stall_seconds" in failed


def test_the_warning_names_the_waits_and_comes_once_a_stall(caplog):
    watch = StallWatch(fail_after_s=None, warn_after_s=10.0)
    with caplog.at_level(logging.WARNING, logger="system.run.stall_watch"):
        for t in range(0, 60):
            assert watch.see(float(t), (100, 5.0), True, WAITS) == ""
        assert len(caplog.records) == 1  # None: warned, never failed
        assert "no progress" in caplog.text and WAITS in caplog.text
        watch.see(60.0, (100, 6.0), True, WAITS)  # a trainer step: a new stall may be told
        for t in range(61, 80):
            watch.see(float(t), (100, 6.0), True, WAITS)
    assert len(caplog.records) == 2


def test_frames_or_trainer_steps_are_progress_and_reset_the_clock():
    watch = StallWatch(fail_after_s=10.0, warn_after_s=5.0)
    for t, progress in enumerate([(0, 0.0), (0, 1.0), (64, 1.0), (64, 2.0)] * 10):
        assert watch.see(float(t * 9), progress, True, "") == ""
    # each record 9 s apart moved one of the two: never 10 s without progress. The last, at 351:
    assert watch.see(360.0, (64, 2.0), True, "") == ""
    assert watch.see(361.0, (64, 2.0), True, "").endswith("(None: never stop for it)")


def test_the_clock_runs_only_while_every_worker_is_up():
    """A worker starting or restarting (a container pulling its image, a scheduler's queue)
    explains a pause: the clock starts again when all are up."""
    watch = StallWatch(fail_after_s=10.0)
    assert watch.see(0.0, (0, 0.0), False, "") == ""
    assert watch.see(1000.0, (0, 0.0), False, "") == ""
    assert watch.see(1001.0, (0, 0.0), True, "") == ""  # the clock starts here
    assert watch.see(1010.0, (0, 0.0), True, "") == ""
    assert watch.see(1011.0, (0, 0.0), True, "") != ""
    assert watch.see(1012.0, (0, 0.0), False, "") == ""  # a worker went down: not a stall
    assert watch.see(1015.0, (0, 0.0), True, "") == ""
    assert watch.see(1025.0, (0, 0.0), True, "") != ""


def test_frames_without_a_trainer_step_warn_once_a_spell_and_never_fail(caplog):
    """Every episode dropped for a NaN: 179k frames at version 0, and not a word until the
    run's end. Frames are progress, so the stall clock never ran."""
    watch = StallWatch(fail_after_s=30.0, warn_after_s=10.0)
    trainer = "trainer waits 100% (wait_batch)"
    with caplog.at_level(logging.WARNING, logger="system.run.stall_watch"):
        for t in range(0, 40):
            assert watch.see(float(t), (1000 * t, 0.0), True, trainer) == ""
        (warning,) = caplog.records
        assert warning.getMessage().startswith(
            "no trainer step for 10 s while the actors made 10,000 training frames with every "
            f"worker up: do samples reach the trainers? ({trainer})"
        )
        watch.see(40.0, (40_000, 1.0), True, trainer)  # a step: a new spell may be told
        for t in range(41, 60):
            watch.see(float(t), (1000 * t, 1.0), True, trainer)
        assert len(caplog.records) == 2
        alone = StallWatch(fail_after_s=None, warn_after_s=10.0, trains=False)  # no trainer
        for t in range(0, 40):
            alone.see(float(t), (1000 * t, 0.0), True, "")
        watch.see(60.0, (60_000, 1.0), False, trainer)  # a worker down: the clock starts again
        for t in range(61, 70):
            watch.see(float(t), (1000 * t, 1.0), True, trainer)
    assert len(caplog.records) == 2
