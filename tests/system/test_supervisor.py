"""The supervisor's decisions, driven directly: restarts, crash loops, fatal errors, the ordered
stop and its savers. The launcher here keeps a set of live worker ids instead of processes; the
same decisions on real processes are in tests/faults (SIGKILLs, hung workers, a full disk)."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time

import pytest

from api.config import make_experiment
from distributed.launch.local import ended_by
from system.roles import Role, WorkerState
from system.run import supervisor as sup
from system.run import worker_record as wr
from system.run.control_protocol import Stop
from system.run.finish import restarts_of, unstopped_of
from system.run.name_service import NameService
from system.run.plan import plan_workers
from system.run.signalled import SIGNAL_SETTLE_S


class Launcher:
    start_grace_s = restart_grace_s = 60.0
    restarts_workers = False

    def __init__(self) -> None:
        self.alive: set[str] = set()
        self.started: list[str] = []
        self.killed: list[str] = []

    def start(self, worker_id: str, role: str, controller: str) -> None:
        self.alive.add(worker_id)
        self.started.append(worker_id)

    def is_alive(self, worker_id: str) -> bool:
        return worker_id in self.alive

    def kill(self, worker_id: str) -> None:
        self.alive.discard(worker_id)
        self.killed.append(worker_id)

    def stop_all(self, timeout_s: float) -> None:
        self.alive.clear()


@pytest.fixture
def run(monkeypatch):
    monkeypatch.setattr(wr, "LAST_WORDS_S", 0.0)  # a dead worker is acted on at once here
    launcher, names = Launcher(), NameService()
    plans = plan_workers(
        make_experiment("cartpole-ppo", ["evaluation.workers=0", "stop.eval_return=None"])
    )
    s = sup.Supervisor(plans, launcher, names, heartbeat_timeout_s=30.0)
    s.start_all("tcp://127.0.0.1:1")
    for record in s.workers.values():
        s.on_hello(record, pid=1)
        s.on_ready(record)
    return s, launcher, names


def test_a_worker_that_died_is_restarted_and_its_names_forgotten(run):
    s, launcher, names = run
    names.register("inference/default/0", "tcp://old:1")
    launcher.alive.discard("policy/default/0")
    s.supervise()
    record = s.workers["policy/default/0"]
    assert launcher.started.count("policy/default/0") == 2
    assert record.state is WorkerState.RESTARTING and record.restarts == 1
    assert "inference/default/0" not in names.endpoints  # peers wait for the new address
    assert s.failure is None


def test_a_dead_workers_last_words_are_waited_for_before_it_is_restarted(run, monkeypatch):
    """A worker sends its error, then exits. On a loaded machine the controller saw the exit
    first and restarted a worker whose error no restart fixes (a stress run of the suite: a
    user's callback that raised, 4 restarts before the run failed on it)."""
    monkeypatch.setattr(wr, "LAST_WORDS_S", 60.0)
    s, launcher, _ = run
    launcher.alive.discard("actor/0")
    s.supervise()
    assert launcher.started.count("actor/0") == 1  # not yet: its error may be on its way
    message = "CallbackError: actor callback 'broken' raised in on_episode_step"
    s.on_error(s.workers["actor/0"], message, "", fatal=True, quiet=False)
    s.supervise()
    assert launcher.started.count("actor/0") == 1
    assert s.failure is not None and s.failure.worker == "actor/0"


def test_a_dead_worker_that_said_nothing_is_restarted_once_its_last_words_are_not_due(
    run, monkeypatch
):
    monkeypatch.setattr(wr, "LAST_WORDS_S", 60.0)
    s, launcher, _ = run
    launcher.alive.discard("actor/0")
    s.supervise()
    record = s.workers["actor/0"]
    record.found_dead -= 61.0  # a minute on, and nothing came
    s.supervise()
    assert launcher.started.count("actor/0") == 2 and record.restarts == 1
    assert record.found_dead is None  # its next death waits for its words again


def test_a_dead_worker_is_named_with_how_it_ended_where_the_launcher_knows(run, caplog):
    s, launcher, _ = run
    launcher.how_ended = lambda wid: ended_by(-signal.SIGKILL)
    launcher.alive.discard("actor/0")
    s.supervise()
    assert "actor/0 was killed by SIGKILL (out of memory?" in caplog.text
    assert "restarting it (restart 1)" in caplog.text


def test_a_worker_sent_sigterm_by_someone_else_is_restarted_not_taken_for_stopped(run, caplog):
    """Its bye on a SIGTERM the controller did not send (a kill, docker stop, a node drain)
    marked it stopped: it was never restarted, and the run, without that trainer or actor, went
    on to exit 0."""
    s, launcher, _ = run
    trainer = s.workers["trainer/default/0"]
    s.on_bye(trainer, signal="SIGTERM")
    launcher.alive.discard("trainer/default/0")  # it exits 143
    s.supervise()
    assert launcher.started.count("trainer/default/0") == 2 and trainer.restarts == 1
    said = "trainer/default/0 left on SIGTERM, which its controller did not send"
    assert f"{said}; restarting it (restart 1)" in caplog.text
    assert restarts_of(s.workers)["trainer/default/0"]["last_cause"] == said.split(" ", 1)[1]
    assert trainer.left is None  # its new process is a worker like any other
    # a worker its stop reached, sent SIGTERM too (a scheduler ending the run), has stopped
    actor = s.workers["actor/0"]
    s.stop_workers(["actor/0"], send=lambda w, m: s.on_bye(actor, signal="SIGTERM"),
                   pump=lambda ms: None)  # fmt: skip
    assert actor.state is WorkerState.STOPPED and actor.restarts == 0


def test_how_a_process_ended_in_words():
    assert ended_by(None) == "exited"
    assert ended_by(0) == "exited with code 0"
    assert ended_by(3) == "exited with code 3"
    assert ended_by(-signal.SIGTERM) == "was killed by SIGTERM"
    assert ended_by(-signal.SIGKILL).startswith("was killed by SIGKILL (out of memory?")
    assert "not by the out-of-memory killer" in ended_by(-signal.SIGKILL, oom_kills_since=0)
    assert "(out of memory: the kernel's OOM killer killed 2 process(es)" in ended_by(
        -signal.SIGKILL, oom_kills_since=2
    )
    assert ended_by(-signal.SIGTERM, oom_kills_since=2) == "was killed by SIGTERM"


def test_a_real_kill_9_is_not_taken_for_the_out_of_memory_killer(tmp_path, monkeypatch):
    """A real process of the local launcher, killed with SIGKILL as an operator does; the
    kernel's count of out-of-memory kills (a copy of /proc/vmstat, so the test decides whether
    it rose) says whether its OOM killer ran meanwhile."""
    from distributed.launch import local

    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 1\noom_kill 5\n")
    monkeypatch.setattr(local, "VMSTAT", vmstat)
    launcher = local.LocalLauncher()
    launcher._ctx = multiprocessing.get_context("fork")  # a process that only sleeps
    monkeypatch.setattr(local, "run_worker", lambda *args, **kwargs: time.sleep(60))
    launcher.start("actor/0", "actor", "tcp://127.0.0.1:1")
    process = launcher.processes["actor/0"]
    os.kill(process.pid, signal.SIGKILL)
    process.join(timeout=10)
    assert "not by the out-of-memory killer" in launcher.how_ended("actor/0")
    vmstat.write_text("oom_kill 6\n")
    assert "the kernel's OOM killer killed 1 process(es)" in launcher.how_ended("actor/0")
    vmstat.unlink()  # a kernel without the count: the hint as before
    assert "(out of memory? the kernel's OOM killer sends it" in launcher.how_ended("actor/0")
    assert ended_by(-200) == "was killed by signal 200"


def test_the_restart_report_says_who_was_restarted_how_often_and_why(run, monkeypatch):
    """A worker that failed with the same error every few minutes was restarted for the whole run
    (each time it had run long enough not to count as a crash loop), and the run that then
    reached its goal said nothing of it at its end: this is what its summary says now."""
    s, launcher, _ = run
    assert restarts_of(s.workers) == {}
    actor = s.workers["actor/0"]
    clock = [1000.0]
    monkeypatch.setattr(sup.time, "monotonic", lambda: clock[0])
    for _ in range(wr.MAX_RESTARTS + 2):  # more than a crash loop's count, none in a row
        clock[0] += wr.PROGRESS_S + 1
        for record in s.workers.values():
            record.last_seen = clock[0]
        s.on_error(actor, "ValueError: bad state", "tb", False, False)
        s.supervise()
        s.on_hello(actor, pid=2)  # the new process, ready after its start
        s.on_ready(actor)
    assert s.failure is None and actor.in_a_row == 1
    launcher.how_ended = lambda wid: "was killed by SIGKILL"
    launcher.alive.discard("policy/default/0")
    s.supervise()
    assert restarts_of(s.workers) == {
        "actor/0": {"restarts": wr.MAX_RESTARTS + 2, "last_cause": "ValueError: bad state"},
        "policy/default/0": {"restarts": 1, "last_cause": "was killed by SIGKILL"},
    }


def test_the_run_s_last_lines_name_the_restarted_workers():
    from distributed.launch.last_lines import restarts_line

    line = restarts_line(
        {
            "actor/0": {"restarts": 7, "last_cause": "ValueError: bad state"},
            "params": {"restarts": 1, "last_cause": "was killed by SIGKILL"},
        }
    )
    assert line == (
        "workers restarted during the run: actor/0 7 times (last: ValueError: bad state); "
        "params 1 time (last: was killed by SIGKILL)"
    )


def test_a_crash_loop_is_given_up_on(run):
    s, launcher, _ = run
    for _ in range(wr.MAX_RESTARTS):
        launcher.alive.discard("actor/0")
        s.supervise()
        assert s.failure is None
        s.on_hello(s.workers["actor/0"], pid=2)  # back, and dies before it runs PROGRESS_S
    launcher.alive.discard("actor/0")
    s.supervise()
    assert s.failure is not None and s.failure.worker == "actor/0"
    assert "given up after 5 restarts in a row, none of them running 60 s" in str(s.failure)
    assert s.table()["actor/0"]["state"] == "failed"  # it was left `alive` in workers.json


def test_a_worker_that_reported_its_error_and_exited_is_restarted_for_its_error(run):
    """A worker sends its error and exits 1; the supervisor finds it dead. The run's end named
    the cause of its restarts "exited with code 1" (a misfit observation's five restarts); its
    error says why."""
    s, launcher, _ = run
    launcher.how_ended = lambda wid: "exited with code 1"
    error = "EnvironmentFailure: observation has shape (4,), declared (3,)"
    s.on_error(s.workers["actor/0"], error, "tb", False, False)
    launcher.alive.discard("actor/0")
    s.supervise()
    assert restarts_of(s.workers)["actor/0"]["last_cause"] == error
    launcher.alive.discard("actor/1")  # one that died without a word: how it ended
    s.supervise()
    assert restarts_of(s.workers)["actor/1"]["last_cause"] == "exited with code 1"


def _worked(record, seconds: float) -> None:
    """As if ``record`` had been ready for ``seconds`` (its clock moved back)."""
    record.alive_since = time.monotonic() - seconds


def test_a_worker_that_hangs_again_and_again_is_a_crash_loop(run):
    """An environment whose step never returns after a few seconds of work: taken for hung
    after liveness.max_poll_s (60 s), each restart had "run" 60 s and more, so its count began
    again at 1 each time. A run restarted it for as long as it lasted, at 0 frames/s (seen:
    four restarts of each actor in 5 minutes, "restart 1 in a row" each time). The time stuck
    in the hung poll is no progress."""
    s, _, _ = run
    hang = "one poll has run longer than liveness.max_poll_s=60s: ...; it is stuck at env.py:9"
    record = s.workers["actor/0"]
    for _ in range(wr.MAX_RESTARTS):
        _worked(record, 65.0)  # 5 s of work, then 60 s stuck
        s.on_error(record, hang, "stack", False, False, stuck_s=60.0)
        s.supervise()
        assert s.failure is None
        s.on_hello(record, pid=2)
        s.on_ready(record)
    _worked(record, 65.0)
    s.on_error(record, hang, "stack", False, False, stuck_s=60.0)
    assert s.failure is not None and s.failure.worker == "actor/0", s.failure
    assert "restarts in a row" in str(s.failure) and "stuck at env.py:9" in str(s.failure)


def test_a_hang_after_a_minute_of_work_starts_the_count_again(run):
    s, _, _ = run
    record = s.workers["actor/0"]
    for _ in range(wr.MAX_RESTARTS + 2):
        _worked(record, 130.0)  # 70 s of work before it hung
        s.on_error(record, "hung", "stack", False, False, stuck_s=60.0)
        s.supervise()
        s.on_hello(record, pid=2)
        s.on_ready(record)
    assert s.failure is None and record.in_a_row == 1


def test_the_time_a_worker_went_silent_is_no_progress(run):
    """A worker that stops answering (stopped, or stuck where its heartbeat thread cannot run)
    is restarted a heartbeat timeout later: the silence is not counted as running."""
    s, _, _ = run
    record = s.workers["actor/0"]
    for _ in range(wr.MAX_RESTARTS):
        _worked(record, 70.0)
        record.last_seen = time.monotonic() - 31.0  # 39 s of work, then silent past 30 s
        s.supervise()
        assert s.failure is None and record.state is WorkerState.RESTARTING
        s.on_hello(record, pid=2)
        s.on_ready(record)
    _worked(record, 70.0)
    record.last_seen = time.monotonic() - 31.0
    s.supervise()
    assert s.failure is not None and "given up after 5 restarts in a row" in str(s.failure)


def test_a_fatal_error_fails_the_run_without_a_restart(run):
    s, launcher, _ = run
    s.on_error(s.workers["trainer/default/0"], "RegistryError: no such env", "tb", True, False)
    assert s.failure is not None and "no such env" in str(s.failure)
    s.supervise()  # a failed run restarts nothing more
    assert launcher.started.count("trainer/default/0") == 1


def test_the_error_that_failed_the_run_is_shown_once_when_more_workers_meet_it(run, caplog):
    """A policy every role builds and none can (an observation space it has no encoder for):
    one traceback, then a line for each other worker, not three tracebacks."""
    s, _, _ = run
    error = "RegistryError: could not build policy 'actor-critic': unsupported space"
    for wid in ("policy/default/0", "params", "trainer/default/0"):
        s.on_error(s.workers[wid], error, f"Traceback of {wid}", True, False)
    shown = [r.getMessage() for r in caplog.records if r.name == sup.__name__]
    assert sum("Traceback of" in m for m in shown) == 1 and "Traceback of policy" in shown[0]
    assert "params failed with the same error" in shown
    assert "trainer/default/0 failed with the same error" in shown
    assert s.failure.worker == "policy/default/0"
    s.on_error(s.workers["actor/0"], "EnvironmentFailure: another", "Traceback 2", False, False)
    assert "Traceback 2" in caplog.records[-1].getMessage()  # a different error: in full


def test_an_error_another_worker_met_first_is_shown_once(run, caplog):
    """Two actors whose environments hang at the same line (a restartable error): one stack,
    then a line naming the worker that showed it; the run goes on restarting both."""
    s, _, _ = run
    hang = "one poll has run longer than liveness.max_poll_s=60s: ...; it is stuck at env.py:9"
    s.on_error(s.workers["actor/0"], hang, "stack of actor/0", False, False)
    s.on_error(s.workers["actor/1"], hang, "stack of actor/1", False, False)
    shown = [r.getMessage() for r in caplog.records if r.name == sup.__name__]
    assert shown == [f"actor/0 failed: {hang}\nstack of actor/0",
                     "actor/1 failed with the same error as actor/0"]  # fmt: skip
    s.supervise()
    assert s.failure is None
    assert {s.workers[w].state for w in ("actor/0", "actor/1")} == {WorkerState.RESTARTING}


def test_an_error_that_differs_only_in_its_numbers_is_shown_once(run, caplog):
    """An environment that raises in every actor: the message names the environment and the
    worker, so each restart of each actor printed the whole traceback again (16 of one error
    in a 30 s run)."""
    s, _, _ = run
    said = "environment {} of actor/{} failed in step: KeyError('step 5 boom')"
    s.on_error(s.workers["actor/0"], said.format(5, 0), "stack 0", False, False)
    s.on_error(s.workers["actor/1"], said.format(2, 1), "stack 1", False, False)
    s.supervise()
    s.on_error(s.workers["actor/0"], said.format(3, 0), "stack 0", False, False)
    s.on_error(s.workers["actor/0"], said.format(3, 0), "stack 0", False, False)
    shown = [m for r in caplog.records if "restarting" not in (m := r.getMessage())]
    assert shown == [
        f"actor/0 failed: {said.format(5, 0)}\nstack 0",
        f"actor/1 failed with the same error as actor/0: {said.format(2, 1)}",
        f"actor/0 failed again with the same error (restart 1 in a row): {said.format(3, 0)}",
        "actor/0 failed again with the same error (restart 1 in a row)",
    ]
    assert sup.alike("a 1 b", "a 22 b") and not sup.alike("a 1 b", "a 1 c")
    assert sup.alike("env #0 of eval/0 failed", "env #3 of actor/12 failed")  # any actor's


def test_an_error_sent_without_its_traceback_is_shown_in_one_line(run, caplog):
    """A worker sends no traceback with a user error of Troupe's own checks (its log keeps
    it): the message alone is shown, with no blank line after it."""
    s, _, _ = run
    with caplog.at_level(logging.ERROR, logger=sup.__name__):
        s.on_error(s.workers["actor/0"], "EnvironmentFailure: does not fit", "", False, False)
    assert [r.getMessage() for r in caplog.records] == [
        "actor/0 failed: EnvironmentFailure: does not fit"
    ]


def test_the_stop_goes_actors_first_and_the_parameter_service_last(run):
    s, _, _ = run
    stops: list[str] = []

    def send(worker_id, message):
        assert isinstance(message, Stop)
        stops.append(worker_id)
        s.on_bye(s.workers[worker_id])  # it finishes its work and says bye

    s.shutdown(send, lambda ms: None, revive=True)
    order = [s.workers[w].plan.stop_order for w in stops]
    assert order == sorted(order) and stops[-1] == "params" and stops[0].startswith("actor/")
    assert set(stops) == set(s.workers) and s.failure is None


def test_a_saver_down_at_the_stop_is_brought_back_to_save(run):
    s, launcher, _ = run
    launcher.alive.discard("trainer/default/0")  # died just before Ctrl+C
    stops: list[str] = []

    def send(worker_id, message):
        stops.append(worker_id)
        s.on_bye(s.workers[worker_id])

    def pump(ms):  # the restarted trainer says hello and is built
        record = s.workers["trainer/default/0"]
        if record.state is WorkerState.RESTARTING:
            s.on_hello(record, pid=3)
            s.on_ready(record)

    s.shutdown(send, pump, revive=True)
    assert launcher.started.count("trainer/default/0") == 2
    assert "trainer/default/0" in stops and s.failure is None


@pytest.mark.parametrize("scheduler", [False, True], ids=["local", "scheduler"])
def test_a_saver_that_left_on_sigterm_at_the_stop(run, monkeypatch, scheduler):
    """Sent SIGTERM as the run stops: a local one is brought back to save; a scheduler's is not
    waited for (the signal most likely ended the whole job: a Slurm time limit), and the run
    says its last checkpoint may be missing instead of spending the time left on a wait."""
    s, launcher, _ = run
    launcher.restarts_workers = scheduler
    trainer = s.workers["trainer/default/0"]
    s.on_bye(trainer, signal="SIGTERM")
    launcher.alive.discard("trainer/default/0")
    waited = []
    clock = [0.0]
    monkeypatch.setattr(sup.time, "monotonic", lambda: clock[0])

    def pump(ms):
        waited.append(ms)
        clock[0] += ms / 1000
        if trainer.state is WorkerState.RESTARTING:
            s.on_hello(trainer, pid=3)
            s.on_ready(trainer)

    s.shutdown(lambda wid, m: s.on_bye(s.workers[wid]), pump, revive=True)
    if scheduler:
        assert sum(waited) < 1000 and trainer.restarts == 0
        assert "its last checkpoint may be missing" in str(s.failure), s.failure
    else:
        assert launcher.started.count("trainer/default/0") == 2 and s.failure is None


def test_a_saver_that_leaves_without_its_bye_makes_the_run_incomplete(run):
    s, launcher, _ = run

    def send(worker_id, message):
        if s.workers[worker_id].plan.role is Role.TRAINER:
            launcher.alive.discard(worker_id)  # exits without saying bye
        else:
            s.on_bye(s.workers[worker_id])

    s.shutdown(send, lambda ms: None, revive=True)
    assert s.failure is not None
    assert "did not finish its stop; its last checkpoint may be missing" in str(s.failure)


def test_a_saver_still_starting_at_the_stop_is_said_to_have_taken_no_part(run):
    """A trainer still being built when a short run stopped was said to have "not finished its
    stop; its last checkpoint may be missing": it had none to write. It is said never to have
    been ready; the run is failed all the same, as it trained nothing."""
    s, launcher, _ = run
    record = s.workers["trainer/default/0"]
    record.came_up, record.state = False, WorkerState.CONFIGURING  # its hello, no ready yet
    launcher.kill = launcher.alive.discard  # it cannot answer the stop: killed at timeout_s

    def send(worker_id, message):
        if worker_id != "trainer/default/0":
            s.on_bye(s.workers[worker_id])

    s.stop_workers(list(s.workers), send, lambda ms: None, timeout_s=0.0)
    assert str(s.failure) == (
        "worker trainer/default/0 failed: trainer/default/0 was never ready: it was still "
        "starting when the run stopped, and took no part in it"
    )


def test_a_saver_still_beating_at_its_stop_is_waited_for_and_a_silent_worker_is_not(run):
    """A fixed 15 s killed a replay worker saving a large buffer to a slow disk, and failed the
    run for it. A saver whose heartbeats go on through its stop (its last save) is now waited
    for, past ``timeout_s``; a worker that says nothing is killed at ``timeout_s``."""
    import time

    s, launcher, _ = run
    trainer, actor = s.workers["trainer/default/0"], s.workers["actor/0"]
    told = time.monotonic()

    def pump(ms):
        time.sleep(ms / 1000)
        if trainer.state is WorkerState.ALIVE:
            trainer.last_seen = time.monotonic()  # its busy heartbeat, while it saves
            if time.monotonic() - told > 1.0:
                s.on_bye(trainer)  # saved, 1 s on: past the 0.3 s bound

    s.stop_workers(["trainer/default/0", "actor/0"], lambda w, m: None, pump, timeout_s=0.3)
    assert trainer.state is WorkerState.STOPPED and "trainer/default/0" not in launcher.killed
    assert actor.state is WorkerState.FAILED and launcher.killed == ["actor/0"]
    assert s.failure is None  # the actor saves nothing: its kill loses no checkpoint


def test_a_worker_still_building_at_the_stop_is_interrupted_unless_it_saves(run):
    """A worker building (an actor making environments slow to make) reads no stop until it is
    built: it was waited for, then killed, leaving its simulators behind. One with nothing to
    save is sent SIGTERM at once by a launcher that can; a saver still building and a worker
    already running are not."""
    s, launcher, _ = run
    interrupted: list[str] = []
    launcher.interrupt = interrupted.append
    for wid in ("actor/0", "trainer/default/0", "policy/default/0"):
        s.workers[wid].came_up, s.workers[wid].state = False, WorkerState.CONFIGURING

    def send(worker_id, message):
        if s.workers[worker_id].state is WorkerState.ALIVE:
            s.on_bye(s.workers[worker_id])

    def pump(ms):  # the interrupted leave, as term_signal.leave says bye
        for wid in interrupted:
            s.on_bye(s.workers[wid])

    ids = ["actor/0", "actor/1", "policy/default/0", "trainer/default/0"]
    s.stop_workers(ids, send, pump, timeout_s=0.0)
    assert sorted(interrupted) == ["actor/0", "policy/default/0"]
    assert [s.workers[w].state for w in ids[:3]] == [WorkerState.STOPPED] * 3
    assert launcher.killed == ["trainer/default/0"]  # as before: never ready, killed at the end


def test_a_worker_that_says_hello_after_the_stop_began_is_told_to_stop_then(run, caplog):
    """A run that ended in its first seconds (a configuration its environment refutes, a
    Ctrl+C) stopped only the workers that had said hello; one still starting said hello to a
    controller no longer listening, and the run's end waited 10 s before killing it. Its hello
    is now waited for and answered with its stop; one that never comes is killed at the
    bound. A scheduler's worker is not waited for: it may never come."""
    s, launcher, _ = run
    late, never = s.workers["actor/0"], s.workers["actor/1"]
    late.state = never.state = WorkerState.STARTING
    answers: list[tuple[str, object]] = []

    def pump(ms):  # actor/0's hello comes: the controller's loop answers as on_hello says
        if late.state is WorkerState.STARTING and not s.on_hello(late, pid=7):
            answers.append(("actor/0", "stop"))
            s.on_bye(late)  # it leaves on its stop

    with caplog.at_level(logging.WARNING, logger=sup.__name__):
        s.stop_workers(["actor/0", "actor/1"], lambda w, m: None, pump, timeout_s=0.3)
    assert answers == [("actor/0", "stop")]
    assert late.state is WorkerState.STOPPED and "actor/0" not in launcher.killed
    assert launcher.killed == ["actor/1"]
    assert "actor/1 had not started 0s after the stop; killing it" in caplog.text
    assert s.failure is None
    launcher.restarts_workers = True  # a scheduler's: neither waited for nor killed
    launcher.killed.clear()
    s.workers["policy/default/0"].state = WorkerState.STARTING
    s.stop_workers(["policy/default/0"], lambda w, m: None, pump, timeout_s=0.3)
    assert launcher.killed == []


def test_a_worker_interrupted_as_its_build_ends_is_not_said_to_be_signalled_by_another(run, caplog):
    """The controller sends SIGTERM to a worker it takes for still building; one whose build
    ended as it came tells of the signal, which the controller logged as someone else's."""
    s, launcher, _ = run
    launcher.interrupt = lambda wid: None
    s.workers["actor/0"].state = WorkerState.CONFIGURING
    s.stop_workers(["actor/0"], lambda w, m: None, lambda ms: None, timeout_s=0.0)
    s.on_signalled(s.workers["actor/0"], "SIGTERM")
    s.on_signalled(s.workers["actor/1"], "SIGTERM")  # a `kill` of another: said as before
    assert "actor/0 was sent SIGTERM" not in caplog.text
    assert "actor/1 was sent SIGTERM, not by its controller" in caplog.text
    assert set(s.signalled.since) == {"actor/1"}  # only someone else's is to stop it alone


def test_workers_json_says_who_runs_where(run):
    s, _, _ = run
    s.workers["trainer/default/0"].stats = {"version": 4}
    table = s.table()
    assert table["trainer/default/0"] == {
        "role": "trainer", "pid": 1, "state": "alive", "restarts": 0, "peak_rss_mb": 0.0,
        "version": 4,
    }  # fmt: skip
    assert set(table) == set(s.workers)


def test_a_schedulers_worker_that_does_not_stop_is_not_said_to_be_killed(run, caplog):
    """The controller of a Docker, Swarm, Kubernetes or Slurm run kills nothing; it said it
    was killing the worker while its container ran on."""
    s, launcher, _ = run
    launcher.restarts_workers = True
    s.stop_workers(["actor/0"], lambda wid, message: None, lambda ms: None, timeout_s=0.0)
    assert "actor/0 did not stop in 0s; its scheduler ends it with the run" in caplog.text
    assert "killing it" not in caplog.text
    launcher.restarts_workers = False
    s.stop_workers(["actor/1"], lambda wid, message: None, lambda ms: None, timeout_s=0.0)
    assert "actor/1 did not stop in 0s; killing it" in caplog.text


def test_the_summary_names_the_workers_that_did_not_stop_in_order(run, monkeypatch):
    """A Docker run's actor container killed half a minute before the run's end (before the
    heartbeat timeout): exit 0, and only workers.json said `failed`."""
    s, _, _ = run
    for w in ("actor/0", "actor/1"):
        s.on_hello(s.workers[w], pid=2)
        s.on_ready(s.workers[w])
    s.workers["actor/0"].last_seen = 100.0
    s.workers["actor/1"].last_seen = 140.0
    s.stop_workers(["actor/0"], lambda wid, message: None, lambda ms: None, timeout_s=0.0)
    s.stop_workers(["actor/1"], lambda wid, message: None, lambda ms: None, timeout_s=0.0)
    said = {
        "actor/0": "no stop in order; last heard from 45 s before the end",
        "actor/1": "no stop in order; last heard from 5 s before the end",
    }
    assert unstopped_of(s.workers, now=145.0) == said
    from distributed.launch.last_lines import unstopped_line

    assert unstopped_line(said) == (
        "workers that did not stop in order (see their logs): actor/0 (no stop in order; last "
        "heard from 45 s before the end); actor/1 (no stop in order; last heard from 5 s before "
        "the end)"
    )


def test_a_worker_that_failed_with_an_error_as_the_run_stopped_is_named_with_it(run):
    """A run given up on an actor's crash loop: the evaluation actor failed with the same
    error moments before the stop, and the summary said "eval/0 (no stop in order; last heard
    from 0 s before the end)", as if it had gone silent."""
    s, _, _ = run
    for w in ("actor/0", "actor/1"):
        s.on_hello(s.workers[w], pid=2)
        s.on_ready(s.workers[w])
    s.on_error(
        s.workers["actor/0"], "NonFiniteError: environment 'X' returned NaN", "", False, False
    )
    s.on_error(s.workers["actor/1"], "environment 'X' hangs in step", "", False, False)
    assert unstopped_of(s.workers, now=s.workers["actor/0"].last_seen) == {
        "actor/0": "failed as the run stopped, with NonFiniteError; not restarted",
        "actor/1": "failed as the run stopped, with environment 'X' hangs in step; not restarted",
    }
    s.supervise()  # restarted: its error is no longer how it ended
    assert s.workers["actor/0"].failed_with is None


def test_the_summary_names_a_worker_its_scheduler_had_not_brought_back_by_the_end(run, monkeypatch):
    """A worker gone under a scheduler (Slurm, Kubernetes; Docker before it started a worker
    stopped by hand again) is waited for. A run that ended during that wait exited 0, and its
    summary said nothing of the worker missing for its last minute."""
    s, launcher, _ = run
    launcher.restarts_workers = True
    clock = [1000.0]
    monkeypatch.setattr(sup.time, "monotonic", lambda: clock[0])
    launcher.alive.discard("actor/0")
    s.supervise()
    assert s.workers["actor/0"].awaited
    clock[0] += 40.0
    for record in s.workers.values():
        if record.plan.worker_id != "actor/0":
            s.on_bye(record)
    assert unstopped_of(s.workers, now=clock[0]) == {
        "actor/0": "gone; its scheduler had not brought it back 40 s after it was found gone"
    }


def test_a_schedulers_restart_is_counted_when_the_worker_is_back_not_when_the_wait_begins(
    run, monkeypatch
):
    """Under Docker, Swarm or Kubernetes the controller waits for the scheduler's restart. It
    counted the restart when the wait began: a run that failed because the worker never came
    back also listed it among the workers restarted."""
    s, launcher, _ = run
    launcher.restarts_workers = True
    clock = [1000.0]
    monkeypatch.setattr(sup.time, "monotonic", lambda: clock[0])
    actor, policy = s.workers["actor/0"], s.workers["policy/default/0"]
    for wid in ("actor/0", "policy/default/0"):
        launcher.alive.discard(wid)
    s.supervise()
    assert actor.state is WorkerState.RESTARTING and actor.restarts == 0
    s.on_hello(actor, pid=5)  # its scheduler brought it back
    s.on_ready(actor)
    assert actor.restarts == 1
    # a crash its scheduler restarts before supervision noticed it is counted too, and a
    # worker that left on a signal and is back before then is no longer taken for gone
    s.on_error(actor, "ValueError: bad state", "tb", False, False)
    s.on_hello(actor, pid=6)
    assert actor.restarts == 2
    s.on_bye(actor, signal="SIGTERM")
    s.on_hello(actor, pid=7)
    assert actor.restarts == 3 and actor.left is None
    clock[0] += launcher.restart_grace_s + 1  # the policy worker never comes back
    for record in s.workers.values():
        record.last_seen = clock[0] if record is not policy else record.last_seen
    s.supervise()
    assert "policy/default/0 was not back 61s after it exited" in str(s.failure)
    assert policy.restarts == 0 and "policy/default/0" not in restarts_of(s.workers)


def test_a_signalled_worker_is_stopped_alone_in_the_stop_order_then_restarted(run, monkeypatch):
    """A worker sent SIGTERM by someone else waits for its controller's stop (so that its stop
    does its work: a trainer's last version). With the controller not stopping the run, each
    is stopped alone a moment after its signal, the parameter service only once the trainer
    that sends to it has stopped, and each is then restarted."""
    s, launcher, _ = run
    clock = [1000.0]
    monkeypatch.setattr(sup.time, "monotonic", lambda: clock[0])
    trainer, params = s.workers["trainer/default/0"], s.workers["params"]
    s.on_signalled(params, "SIGTERM")
    s.on_signalled(trainer, "SIGTERM")
    assert s.signals_due(clock[0]) == []  # a whole job's signal reaches the controller first
    clock[0] += SIGNAL_SETTLE_S
    assert s.signals_due(clock[0]) == [("trainer/default/0", False)]  # it stops, then leaves
    assert s.signals_due(clock[0]) == []  # the service waits for the trainer's stop
    s.on_bye(trainer)  # it stopped (its last version sent), and leaves: 143
    launcher.alive.discard("trainer/default/0")
    assert s.signals_due(clock[0]) == [("params", False)]
    s.on_bye(params)
    launcher.alive.discard("params")
    for record in s.workers.values():
        record.last_seen = clock[0]
    s.supervise()
    assert (trainer.restarts, params.restarts) == (1, 1) and s.failure is None
    said = "left on SIGTERM, which its controller did not send"
    assert restarts_of(s.workers)["params"]["last_cause"] == said
    assert trainer.evicted is None and params.evicted is None  # new processes


def test_signalled_workers_stop_in_the_runs_own_stop_when_the_whole_job_was_signalled(run):
    """A preempted Slurm job, ``kubectl delete``: every worker and the controller get SIGTERM.
    The workers wait for the controller's stop in order, and the run ends with its last
    checkpoints written: before, they left at once, and the run said its last checkpoint may
    be missing. One stopped alone just before the run's stop began is stopped, not failed."""
    s, launcher, _ = run
    for record in s.workers.values():
        s.on_signalled(record, "SIGTERM")
    trainer = s.workers["trainer/default/0"]
    trainer.evicted = "SIGTERM"  # stopped alone a moment before: its bye comes with the actors'

    def send(wid, message):
        for record in (s.workers[wid], trainer) if wid == "actor/0" else (s.workers[wid],):
            s.on_bye(record)
            launcher.alive.discard(record.plan.worker_id)

    s.shutdown(send, lambda ms: None, revive=True)
    assert s.signals_due(time.monotonic() + 60) == []
    assert s.failure is None, s.failure
    assert {r.state for r in s.workers.values()} == {WorkerState.STOPPED}
    assert restarts_of(s.workers) == {}


def test_a_trainer_rank_of_a_group_signalled_alone_leaves_without_its_stop():
    """A data-parallel rank's stop stops its whole group, whose other ranks then idle for good:
    one signalled alone is told to leave instead, which fails the group, and the group
    restarts whole, as for any fault of a rank."""
    config = make_experiment("cartpole-ppo", ["evaluation.workers=0", "stop.eval_return=None",
                                              "policies.default.trainer_workers=2"])  # fmt: skip
    s = sup.Supervisor(plan_workers(config), Launcher(), NameService(), heartbeat_timeout_s=30.0)
    for record in s.workers.values():
        s.on_hello(record, pid=1)
        s.on_ready(record)
    s.on_signalled(s.workers["trainer/default/1"], "SIGTERM")
    s.on_signalled(s.workers["actor/0"], "SIGTERM")
    later = time.monotonic() + SIGNAL_SETTLE_S
    assert s.signals_due(later) == [("actor/0", False)]  # the actors first, as ever
    s.on_bye(s.workers["actor/0"])
    assert s.signals_due(later) == [("trainer/default/1", True)]


def test_a_config_error_met_by_a_worker_is_shown_without_its_traceback(run, caplog):
    """``troupe run gather-2p-ppo environment.args.n_agents=3``: the message names what to
    change; 30 lines of traceback into the runtime came with it."""
    s, _, _ = run
    error = "ConfigError: invalid experiment configuration (1 error):\n  - agent_policies: ..."
    with caplog.at_level(logging.INFO, logger=sup.__name__):
        s.on_error(s.workers["params"], error, "Traceback of params", True, False)
    shown = [r.getMessage() for r in caplog.records if r.name == sup.__name__]
    assert shown == [f"params failed: {error}"]
    assert s.failure.worker == "params"
