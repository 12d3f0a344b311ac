"""The supervisor: starts a run's workers, restarts those that die, and stops them in order.

How a worker is started (a local process, a container, ...) is the launcher's business: the
supervisor only calls ``launcher.start(worker_id, role, controller_address)``,
``launcher.is_alive(worker_id)`` and ``launcher.kill(worker_id)``. A scheduler that restarts
workers itself (Docker, Swarm, Kubernetes) says so (``restarts_workers``); the supervisor then
waits for the new process's hello instead of starting one.

A worker is given up on, and the run fails, when it cannot be restarted (not ``restartable``),
when its error is one no restart fixes (``fatal``), when it is not back within the launcher's
restart grace, or when it crash-loops (:mod:`system.run.worker_record`: ``MAX_RESTARTS``
restarts in a row without ever running ``PROGRESS_S``). The stop goes by the plans'
``stop_order`` (actors, then policy workers, trainers and replay, then the parameter service),
so every sample in flight is trained on and the last checkpoints still reach disk; a worker
whose stop writes them (:data:`SAVING_ROLES`) that is down at that moment is restarted first.

Longer than 400 lines because the ordered stop (savers revived, saves waited for, builders
interrupted) shares its states with the restarts it must not race, and reads best beside them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from system.errors import WorkerFailure, alike
from system.roles import Role, WorkerState
from system.run.control_protocol import ControlMessage, Stop
from system.run.name_service import NameService
from system.run.plan import WorkerPlan
from system.run.signalled import Signalled
from system.run.worker_record import (
    WorkerRecord,
    count_restart,
    crash_looping,
    given_up,
    last_words_due,
)

logger = logging.getLogger(__name__)

SAID_IN_FULL = ("ConfigError: ",)
"""Errors whose message says what to change (a config at odds with its environment): shown
without the traceback, which took 30 lines to point into the runtime
(``troupe run gather-2p-ppo environment.args.n_agents=3``); the worker's log in the run
folder keeps it (``troupe logs RUN``)."""

SAVING_ROLES = (Role.TRAINER, Role.PARAMETER_SERVICE, Role.REPLAY)
"""Roles whose stop writes the run's last checkpoints (parameters, trainer state, replay)."""
SAVE_STOP_MAX_S = 600.0
"""How long a saving worker's stop may take while it keeps beating (its last checkpoint on a
slow disk: a full 100k-frame Atari replay buffer is 2.8 GB)."""
SAVE_BEAT_S = 5.0
"""A saving worker heard from this recently is still at its stop's save: it is waited for."""


class Launcher(Protocol):
    """What starts and kills worker processes. One that sees how a process ended may also have
    ``how_ended(worker_id) -> str`` (``was killed by SIGKILL``, ``exited with code 3``), which
    the restart line and the failure then say (:class:`distributed.launch.local.LocalLauncher`);
    a scheduler's launcher sees no process and cannot. One that kills what a worker started
    with it has ``survey(force=False)``, called at each supervision (and with ``force`` as the
    run stops), to look that up while it lives."""

    start_grace_s: float
    """How long a worker may take from start to its first message (image pulls, imports)."""
    restart_grace_s: float
    """How long a worker that was running may take to be back after it died or went silent:
    restarted by us, or by its scheduler (which may also never do it: ``docker kill``)."""
    restarts_workers: bool
    """Whether a scheduler restarts workers (the supervisor then only waits for their hello)."""

    def start(self, worker_id: str, role: str, controller: str) -> None: ...
    def is_alive(self, worker_id: str) -> bool: ...
    def kill(self, worker_id: str) -> None: ...
    def stop_all(self, timeout_s: float) -> None: ...


Send = Callable[[str, ControlMessage], None]
Pump = Callable[[int], None]
"""Reads and handles the control messages that come within the given milliseconds."""


class Supervisor:
    def __init__(
        self,
        plans: list[WorkerPlan],
        launcher: Launcher,
        names: NameService,
        *,
        heartbeat_timeout_s: float,
    ):
        self.workers = {p.worker_id: WorkerRecord(p) for p in plans}
        self.launcher = launcher
        self.names = names
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.start_grace_s = float(getattr(launcher, "start_grace_s", 120.0))
        self.restart_grace_s = float(getattr(launcher, "restart_grace_s", self.start_grace_s))
        self.address = ""
        """The controller's address, which every started worker is given."""
        self.silent_since: dict[str, float] = {}
        """Workers that died or went silent after running, and since when: a restart that has
        not brought one back within ``restart_grace_s`` fails the run."""
        self.why_restarted: dict[str, str] = {}
        self.told_to_stop: set[str] = set()
        """Workers the shutdown has asked to stop. A scheduler may restart one just after (a
        hung worker's liveness probe fires as the run ends): its new process is told to stop
        at its hello, instead of being configured and waited for until it is killed."""
        self.failure: WorkerFailure | None = None
        """The first failure that ends the run (a worker's, or one the controller reports)."""
        self.signalled = Signalled()
        """Workers sent a signal by someone else, waiting for their stop."""
        self.interrupted: set[str] = set()
        """Workers this controller sent SIGTERM itself, as the run stopped while they were
        being built (:meth:`_interrupt_builders`)."""
        self.stopping = False
        """The run's ordered stop has begun: it stops the signalled workers in their turn."""

    def start_all(self, address: str) -> None:
        self.address = address
        for record in self.workers.values():
            self.launcher.start(record.plan.worker_id, str(record.plan.role), address)
        logger.info("controller at %s; %d workers to start", address, len(self.workers))

    def fail(self, failure: WorkerFailure) -> None:
        self.failure = self.failure or failure

    # ------------------------------------------------------------- what workers say
    def on_hello(self, record: WorkerRecord, pid: int) -> bool:
        """A worker process says hello: whether to configure it (False: tell it to stop)."""
        if record.state.running or record.state is WorkerState.FAILED:
            self._restarted_elsewhere(record)  # before supervision saw it go: count it now
        elif record.awaited:  # the restart we waited for its scheduler to make: it made it
            record.awaited = False
            count_restart(record)
        record.state = WorkerState.CONFIGURING
        record.pid, record.greeted = pid or None, True
        logger.info("%s says hello (pid %s)", record.plan.worker_id, pid)
        return record.plan.worker_id not in self.told_to_stop  # else: its stop went to the old

    def on_ready(self, record: WorkerRecord) -> None:
        record.state = WorkerState.ALIVE
        record.came_up = True
        record.alive_since = time.monotonic()
        logger.info("%s ready", record.plan.worker_id)

    def on_bye(self, record: WorkerRecord, signal: str = "") -> None:
        """A worker leaves: stopped as asked, or (``signal``) sent a signal by someone else, a
        ``kill``, ``docker stop``, a node drain. Such a worker was marked stopped and never
        restarted: the run went on without it, a trainer's absence unsaid, and exited 0. One
        stopped alone after a signal (:meth:`signals_due`) is restarted too, unless the run is
        stopping by then (its stop was done: it has nothing left to do)."""
        wid = record.plan.worker_id
        if wid not in self.told_to_stop and (signal or (record.evicted and not self.stopping)):
            record.state = WorkerState.FAILED
            record.left = f"left on {signal or record.evicted}, which its controller did not send"
            return
        record.state = WorkerState.STOPPED
        logger.info("%s stopped", wid)

    def on_signalled(self, record: WorkerRecord, signal: str) -> None:
        """Sent ``signal`` by someone else, it waits for its stop (:mod:`.term_signal`). One
        this controller interrupted, whose build ended as the signal came, says so too: that
        signal was the controller's own, and the stop sent before it ends the worker."""
        if record.plan.worker_id in self.interrupted:
            logger.info("%s was interrupted as its build ended", record.plan.worker_id)
            return
        logger.warning("%s was sent %s, not by its controller", record.plan.worker_id, signal)
        self.signalled.add(record.plan.worker_id, signal, time.monotonic())

    def signals_due(self, now: float) -> list[tuple[str, bool]]:
        """:meth:`Signalled.due`; none once the run's ordered stop, which stops them, began."""
        return [] if self.stopping else self.signalled.due(self.workers, now)

    def on_error(
        self,
        record: WorkerRecord,
        message: str,
        tb: str,
        fatal: bool,
        quiet: bool,
        stuck_s: float = 0.0,
    ):
        """``fatal``: a user error (unknown name, bad argument) that a restart cannot fix.
        ``quiet``: the run's cause is known and said already; this follows from it.
        ``stuck_s``: how long its last poll ran before it was taken for hung (no work)."""
        record.state = WorkerState.FAILED
        record.worked_until = time.monotonic() - stuck_s
        record.failed_with = message
        wid = record.plan.worker_id
        if quiet:
            logger.warning("%s failed: %s", wid, message)
        elif self.failure is not None and message in str(self.failure):
            # the error that failed the run, met by another worker (every role that builds
            # the policy when it cannot be built): its traceback is above already
            logger.warning("%s failed with the same error", wid)
        elif alike(message, record.last_error):  # a crash loop: its traceback was shown once
            other = "" if message == record.last_error else f": {message}"  # its numbers
            logger.warning("%s failed again with the same error (restart %d in a row)%s",
                           wid, record.in_a_row, other)  # fmt: skip
        elif shown_by := self._shown_by(message):  # every actor's environment hangs alike
            other = "" if message == self.workers[shown_by].last_error else f": {message}"
            logger.warning("%s failed with the same error as %s%s", wid, shown_by, other)
        elif message.startswith(SAID_IN_FULL) or not tb:  # its message is the whole story
            logger.error("%s failed: %s", wid, message)
        else:
            logger.error("%s failed: %s\n%s", wid, message, tb)
        record.last_error = message
        if fatal or not record.plan.restartable:
            self.fail(WorkerFailure(wid, message, tb))
        elif crash_looping(record):
            self.fail(WorkerFailure(wid, given_up(record, message), tb))

    def _shown_by(self, message: str) -> str | None:
        """Another worker whose last error, shown in full, was ``message`` (or :func:`alike`)."""
        return next((w for w, r in self.workers.items() if alike(r.last_error, message)), None)

    # ------------------------------------------------------------- supervision
    def supervise(self) -> None:
        """Restart what died or went silent; fail the run for what cannot be brought back."""
        now = time.monotonic()
        if (survey := getattr(self.launcher, "survey", None)) is not None:
            survey()  # what runs below each worker, for when one is killed from outside
        for wid, record in self.workers.items():
            if record.state is WorkerState.STOPPED or self.failure is not None:
                continue
            if record.state is WorkerState.ALIVE:
                self.silent_since.pop(wid, None)
            dead = not self.launcher.is_alive(wid)
            if dead and record.state.running and last_words_due(record, now):
                continue  # its error (fatal?) or bye, sent before it exited, decides
            silent = now - record.last_seen > self._silence_limit(wid, record)
            if not (dead or silent or record.state is WorkerState.FAILED):
                continue
            if record.worked_until is None:  # it worked until its last word, or until now
                record.worked_until = record.last_seen if silent else now
            why = record.left or (
                self._how_ended(wid) if dead else "went silent" if silent else "failed"
            )
            if silent and wid in self.silent_since and record.state is WorkerState.RESTARTING:
                lost = now - self.silent_since[wid]
                why = f"was not back {lost:.0f}s after it {self.why_restarted[wid]}"
                self.fail(WorkerFailure(wid, f"{wid} {why}; {self._restart_hint()}"))
            elif not record.plan.restartable or crash_looping(record):
                if dead:  # workers.json showed it `alive` after the run had ended on it
                    record.state = WorkerState.FAILED
                if record.plan.restartable:
                    reason = given_up(record, record.last_error or why)
                else:
                    reason = f"{wid} {why}; not restarted"
                self.fail(WorkerFailure(wid, reason))
            else:
                self._restart(record, why)

    def _how_ended(self, wid: str) -> str:
        """``exited``, or what the launcher knows of how (a signal, an exit code): a worker
        killed for memory said only "exited" before."""
        how_ended = getattr(self.launcher, "how_ended", None)
        return how_ended(wid) if how_ended is not None else "exited"

    def _silence_limit(self, wid: str, record: WorkerRecord) -> float:
        """How long a worker may go without a message: a heartbeat interval when running; after
        a restart, the restart grace; the start grace before its first message."""
        if record.state is WorkerState.ALIVE:
            return self.heartbeat_timeout_s
        return self.restart_grace_s if wid in self.silent_since else self.start_grace_s

    def _restart_hint(self) -> str:
        if getattr(self.launcher, "restarts_workers", False):
            return (
                "its scheduler did not restart it; see what the scheduler says of it "
                "(`docker ps -a`, `docker service ps`, `kubectl describe pod`, `squeue`)"
            )
        return "see its log lines above for why it does not start"

    def _restart(self, record: WorkerRecord, why: str) -> None:
        wid = record.plan.worker_id
        self.silent_since.setdefault(wid, time.monotonic())
        self.why_restarted[wid] = why
        if getattr(self.launcher, "restarts_workers", False):
            logger.warning(
                "%s %s; waiting up to %.0fs for its scheduler to restart it",
                *(wid, why, self.restart_grace_s),
            )
        else:
            logger.warning("%s %s; restarting it (restart %d)", wid, why, record.restarts + 1)
        self.launcher.kill(wid)
        self.names.forget(record.plan.endpoints())  # peers must look up the new address
        self.signalled.forget(record)
        if getattr(self.launcher, "restarts_workers", False):
            record.awaited = True  # counted at its hello: one never back was not restarted
        else:
            count_restart(record)
        # A worker that sent its error, then exited (found dead: "exited with code 1"), is
        # restarted for its error: the run's end named only its exit code.
        reported = record.state is WorkerState.FAILED and not record.left and record.last_error
        record.restart_cause = record.last_error if reported else why
        record.failed_with = None
        record.state = WorkerState.RESTARTING  # its hello is expected, not a scheduler's restart
        record.last_seen = time.monotonic()
        self.launcher.start(wid, str(record.plan.role), self.address)

    def _restarted_elsewhere(self, record: WorkerRecord) -> None:
        """A scheduler (Docker, Swarm, Kubernetes) restarted a worker: count it, and forget the
        old process's addresses so peers look the new ones up."""
        logger.warning("%s says hello again: restarted by its scheduler", record.plan.worker_id)
        count_restart(record)
        self.signalled.forget(record)
        record.restart_cause = record.last_error or "restarted by its scheduler"
        record.failed_with = None
        self.names.forget(record.plan.endpoints())

    # ------------------------------------------------------------- the ordered stop
    def shutdown(self, send: Send, pump: Pump, *, revive: bool) -> None:
        """Stop every worker in ``stop_order``; ``revive``: first bring back the savers that
        are down (not after a failure, which may be why one is down)."""
        started = time.monotonic()
        self.stopping = True
        if (survey := getattr(self.launcher, "survey", None)) is not None:
            survey(force=True)  # what each worker's environments run now, for its stop
        for order in (0, 1, 2):
            if order == 1 and revive:
                self._revive_savers(pump)
            ids = [w for w, r in self.workers.items() if r.plan.stop_order == order]
            self.stop_workers(ids, send, pump)
            logger.info("stopped %s after %.2fs", ids, time.monotonic() - started)
        self.launcher.stop_all(timeout_s=10.0)
        logger.info("every worker process ended after %.2fs", time.monotonic() - started)

    def _revive_savers(self, pump: Pump, timeout_s: float = 30.0) -> None:
        """Before trainers stop, every worker whose stop writes the run's last checkpoints
        (:data:`SAVING_ROLES`: the parameter service takes the final version and trainer state,
        a trainer sends them, a replay worker saves its buffer) must be there and running its
        loop. One that died moments before the stop, too late for supervision to restart it, is
        restarted now and waited for; so is one restarted moments ago (stopped while being
        built, a worker just leaves, without its on_stop). One never ready has nothing to save:
        a stop during start-up brought such savers up only to stop them. Nor is one that left
        on a signal under a scheduler waited for: the signal most likely ended the whole job
        (a Slurm time limit, ``kubectl delete``), and a wait for a restart that will not come
        would spend the time the controller has left to write the summary."""
        savers = [r for r in self.workers.values() if r.plan.role in SAVING_ROLES and r.came_up]
        external = getattr(self.launcher, "restarts_workers", False)
        for record in savers:
            wid = record.plan.worker_id
            if record.state is WorkerState.STOPPED:  # stopped alone after a signal: saved
                continue
            down = record.state is WorkerState.FAILED or not self.launcher.is_alive(wid)
            given_up = self.failure is not None and self.failure.worker == wid
            if down and record.plan.restartable and not given_up and not (external and record.left):
                self._restart(record, "exited")
        back = (WorkerState.RESTARTING, WorkerState.CONFIGURING)
        deadline = time.monotonic() + timeout_s
        restarted = [r for r in savers if r.restarts or r.awaited]
        while time.monotonic() < deadline and any(r.state in back for r in restarted):
            pump(100)

    def stop_workers(self, ids: list[str], send: Send, pump: Pump, timeout_s: float = 15.0):
        waiting = {w for w in ids if self.launcher.is_alive(w) and self.workers[w].state.running}
        unstarted = self._unstarted(ids)
        self.told_to_stop.update(ids)
        for w in waiting:
            send(w, Stop())
        self._interrupt_builders(waiting)
        started = time.monotonic()
        while (waiting or unstarted) and any(
            self._may_still_stop(w, started, timeout_s) for w in waiting | unstarted
        ):
            pump(100)  # an unstarted worker's hello is answered with its stop (on_hello)
            waiting |= {w for w in unstarted if self.workers[w].state.running}
            unstarted = self._unstarted(unstarted)
            waiting = {w for w in waiting if self.workers[w].state.running}
            gone = {w for w in waiting if not self.launcher.is_alive(w)}
            if gone:
                pump(200)  # a worker sends bye, then exits: its bye may still be on its way
                for w in gone:
                    if self.workers[w].state.running:
                        logger.warning("%s exited on stop without saying bye", w)
                        self.workers[w].state = WorkerState.FAILED
                waiting -= gone
        for w in unstarted:  # what the launcher's end would do, without waiting again
            waited = time.monotonic() - started
            logger.warning("%s had not started %.0fs after the stop; killing it", w, waited)
            self.launcher.kill(w)
        external = getattr(self.launcher, "restarts_workers", False)
        for w in waiting:  # a scheduler's worker is the scheduler's to end (when its run does)
            what = "its scheduler ends it with the run" if external else "killing it"
            logger.warning("%s did not stop in %.0fs; %s", w, time.monotonic() - started, what)
            self.launcher.kill(w)
            self.workers[w].state = WorkerState.FAILED
        for w in ids:  # a saver that left without its bye did not save: the run is incomplete
            record = self.workers[w]
            if record.state is WorkerState.FAILED and record.plan.role in SAVING_ROLES:
                why = (
                    f"{w} did not finish its stop; its last checkpoint may be missing"
                    if record.came_up
                    else f"{w} was never ready: it was still starting when the run stopped, "
                    "and took no part in it"
                )
                self.fail(WorkerFailure(w, why))

    def _unstarted(self, ids: Iterable[str]) -> set[str]:
        """Workers this controller started that have not said hello yet (a run that ends in
        its first seconds): their hello is answered with their stop, so they leave in order.
        Not waited for, they said hello to a controller no longer listening, and the run's end
        waited 10 s before killing them. A scheduler's are not waited for: one may never come
        (a pod left pending)."""
        if getattr(self.launcher, "restarts_workers", False):
            return set()
        before = (WorkerState.STARTING, WorkerState.RESTARTING)
        return {w for w in ids if self.workers[w].state in before and self.launcher.is_alive(w)}

    def _interrupt_builders(self, ids: set[str]) -> None:
        """A worker still building reads no message until it is built (minutes, for a
        simulator slow to make): it was waited for, then killed, leaving what it had made (a
        simulator's process) behind. One with nothing to save is sent SIGTERM now, where the
        launcher can (``interrupt``): it closes what it made and leaves. A saver still building
        is left to the wait, and the run's end says it was never ready."""
        interrupt = getattr(self.launcher, "interrupt", None)
        for w in ids if interrupt is not None else ():
            record = self.workers[w]
            if record.state is WorkerState.CONFIGURING and record.plan.role not in SAVING_ROLES:
                self.interrupted.add(w)
                interrupt(w)

    def _may_still_stop(self, wid: str, started: float, timeout_s: float) -> bool:
        """Whether a worker told to stop is still given time: ``timeout_s``, or, for one whose
        stop writes the run's last checkpoints (:data:`SAVING_ROLES`) and that still beats
        while it writes them, up to :data:`SAVE_STOP_MAX_S`. A fixed 15 s killed a replay
        worker saving a large buffer to a slow disk, and failed the run for it."""
        now, record = time.monotonic(), self.workers[wid]
        if now - started < timeout_s:
            return True
        saving = record.plan.role in SAVING_ROLES and now - record.last_seen < SAVE_BEAT_S
        return saving and now - started < SAVE_STOP_MAX_S

    # ------------------------------------------------------------- what tools read
    def killed(self) -> None:
        """The launcher killed every worker that had not stopped (the stop was abandoned)."""
        for record in self.workers.values():
            if record.state not in (WorkerState.STOPPED, WorkerState.FAILED):
                record.state = WorkerState.KILLED

    def table(self) -> dict[str, dict[str, Any]]:
        """``workers.json``: who runs where, for users and tools (pids, states, restarts)."""
        return {
            wid: {
                "role": str(r.plan.role),
                "pid": r.pid,
                "state": r.state.value,
                "restarts": r.restarts,
                "peak_rss_mb": round(r.peak_rss_mb, 1),
                # the parameters a policy worker serves, or a trainer last published
                "version": r.stats.get("version"),
            }
            for wid, r in self.workers.items()
        }
