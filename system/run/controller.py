"""The controller: one loop that answers the workers, checks the stopping rule and ends the run.

It wires one object per job: the :class:`~system.run.supervisor.Supervisor` (start, restart,
ordered stop), the :class:`~system.run.name_service.NameService`, the
:class:`~system.run.tally.Tally` (typed stats in, record and panel out), the run's
:class:`~system.run.coordination.coordinator.Coordination` and the user's
:class:`~system.run.episodes.Callbacks`. Control messages (:mod:`system.run.control_protocol`)
are parsed once and dispatched by type (:attr:`Controller.handlers`); every ``configure``
carries the run's shape (:mod:`system.run.shape`), resolved here once. The controller owns the
run folder's bookkeeping; a folder that cannot be written stops the run with that one-line cause.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from api.code import load_code
from api.config import ExperimentConfig
from api.errors import RunFolderError
from system import run_folder, timing
from system.errors import CallbackError, WireError, WorkerFailure
from system.roles import Role, WorkerState
from system.run import control_protocol as cp
from system.run.control_server import ControlServer
from system.run.coordination.coordinator import Coordination
from system.run.display import LiveDisplay
from system.run.episodes import Callbacks
from system.run.finish import finish_run, restarts_of, unstopped_of
from system.run.metrics_file import newest_record
from system.run.monitor import MetricsWriter
from system.run.name_service import NameService
from system.run.plan import plan_workers
from system.run.prometheus import open_endpoint, run_name_of
from system.run.report import jsonable
from system.run.shape import ShapeResolver
from system.run.stall_watch import StallWatch
from system.run.supervisor import Launcher, Supervisor
from system.run.tally import Tally, WorkerStats
from system.run.thinning import Thinning
from system.run.worker_record import REJOIN, WorkerRecord, never_came_up
from system.streams import wire

logger = logging.getLogger(__name__)

HEARTBEAT_TIMEOUT_S = 30.0
STATS_EVERY_S = 1.0
NEVER_UP_AFTER_S = 60.0
"""A role none of whose workers came up in a run this long fails it (see _check_came_up)."""
_MALFORMED = (KeyError, TypeError, ValueError, AttributeError, WireError)


class Controller:
    def __init__(
        self,
        config: ExperimentConfig,
        run_dir: Path,
        launcher: Launcher,
        *,
        bind: str = "tcp://127.0.0.1:*",
        advertise_host: str | None = None,
        display: bool | None = None,
        heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
        metrics_port: int | None = None,
    ):
        self.config = config
        # first: the user's callbacks and any role of theirs may live in their own files
        load_code(config.code)
        self.run_dir = Path(run_dir)
        self.server = ControlServer(bind, advertise_host)
        self.address = self.server.address
        self.names = NameService()
        self.supervisor = Supervisor(
            plan_workers(config), launcher, self.names, heartbeat_timeout_s=heartbeat_timeout_s
        )
        self.workers = self.supervisor.workers
        self.folder = run_folder.FolderGuard(
            self.run_dir, lambda e, by: self.supervisor.fail(WorkerFailure(by, str(e)))
        )
        self.metrics = MetricsWriter(self.run_dir)
        self.thinning = Thinning(config.metrics.thin)
        self.folder.keep(self.metrics.path)  # the run's record: unlinked, the folder was emptied
        self.display = LiveDisplay(config.name, enabled=display)
        self.last_snapshot: Any = None  # what the display last had, shown or not
        self.coordination = Coordination(config, self.run_dir)  # before callbacks: they use it
        self.callbacks = Callbacks(config.callbacks)
        self.tally = Tally(config, observers=[self.coordination, self.callbacks])
        self.session_started = time.monotonic()  # this process's part of a resumed run
        self.started = self.session_started - self.tally.continue_from(newest_record(self.run_dir))
        self.stop_reason = ""
        self.stopped_at: tuple[int, float] | None = None
        """Env frames and wall seconds when a stopping rule held (a solved run's moment)."""
        self.shape = ShapeResolver(config)
        self.awaiting_shape: dict[str, WorkerRecord] = {}
        trains = any(pc.trainer.type for pc in config.policies.values())
        self.stall = StallWatch(config.stop.stall_seconds, trains=trains)
        # Served where the control socket listens: loopback for a local run, every interface
        # in a cluster's container.
        bind_host = bind.removeprefix("tcp://").rsplit(":", 1)[0]
        self.exporter = open_endpoint(metrics_port, bind_host, advertise_host or bind_host)
        self.run_name = run_name_of(self.run_dir)
        self.refused: set[str] = set()  # workers of an earlier controller, told to leave
        self.handlers: dict[type[cp.ControlMessage], Callable[[WorkerRecord, Any], None]] = {
            cp.Hello: self._on_hello,
            cp.Register: lambda r, m: self._send_all(self.names.register(m.name, m.address)),
            cp.Lookup: lambda r, m: self._send_all(self.names.lookup(m.name, r.plan.worker_id)),
            cp.Ready: lambda r, m: self.supervisor.on_ready(r),
            cp.Heartbeat: self._on_heartbeat,
            cp.Error: self._on_error,
            cp.Signalled: lambda r, m: self.supervisor.on_signalled(r, m.signal),
            cp.Bye: lambda r, m: self.supervisor.on_bye(r, m.signal),
            cp.StateWrite: self._on_state_write,
        }

    # ----------------------------------------------------------------- lifecycle
    def run(self, stopped: Callable[[], bool] | None = None) -> dict[str, Any]:
        """Start every worker, supervise until a stopping rule holds, stop, write the summary.
        ``stopped``: called first, inside the part a KeyboardInterrupt stops in order; True
        when a stop was asked for while the controller was being built (then no worker is
        started: the summary says ``interrupted``, and the folder can be resumed)."""
        self.display.start()
        next_stats = time.monotonic() + STATS_EVERY_S
        # Before ``stopped`` arms the signals: one landing between the two left an
        # ``interrupted`` run with no config.json to resume from.
        config_file = self.run_dir / run_folder.CONFIG
        written = self.folder.write(
            lambda: run_folder.write_json(config_file, self.config.to_dict())
        )
        try:
            if stopped is not None and stopped():
                self.stop_reason = "interrupted"
            if written and not self.stop_reason:
                self.shape.start()  # while the workers start: their hello waits for it
                self.supervisor.start_all(self.address)
            while not self.stop_reason:
                self._receive(timeout_ms=50)
                self._configure_awaiting()
                for worker_id, leave in self.supervisor.signals_due(time.monotonic()):
                    self.server.send(worker_id, cp.Stop(leave, alone=True))  # restarted (on_bye)
                self._check_stop()  # every loop: a solved run ends the moment it is known
                if time.monotonic() >= next_stats and not self.stop_reason:
                    next_stats += STATS_EVERY_S
                    self.folder.write(self._report)
                    self.supervisor.supervise()
            # The record that met the stopping rule, at the moment it did: episodes that finish
            # during shutdown would move the evaluation mean away from what decided.
            self.folder.write(lambda: self._report(written=True))
        except KeyboardInterrupt:
            self.stop_reason = "interrupted"
        finally:
            revive = self.stop_reason != "failed"  # what failed may be why a saver is down
            try:  # a second signal ends the stop here: the launcher then kills what is left
                self.supervisor.shutdown(self.server.send, self._receive, revive=revive)
            finally:
                self.display.stop(final=False)  # the final line: the last record's (_finish)
                self.shape.settle()
        with _stopped_already():
            return self._finish()

    def abandoned(self) -> None:
        """A second signal ended the stop and the launcher killed every worker still running:
        ``workers.json`` says so (it showed their last states, as if they ran on)."""
        self.supervisor.killed()
        self.folder.write(lambda: run_folder.write_json(
            self.run_dir / run_folder.WORKERS, self.supervisor.table()))  # fmt: skip

    def _check_stop(self) -> None:
        if self.stop_reason:
            return
        if self.shape.refused is not None:
            self.supervisor.fail(WorkerFailure("controller", str(self.shape.refused)))
        if self.supervisor.failure is not None:  # reported in this loop's messages: it decides
            self.stop_reason = "failed"
            return
        self.coordination.say_hold(self.tally.evaluation.hold_order())
        stop, frames = self.config.stop, self.tally.env_frames
        if self.tally.evaluation.solved():
            self.stop_reason = "eval_return"
        elif stop.env_frames is not None and frames >= stop.env_frames:
            self.stop_reason = "env_frames"
        elif stop.wall_seconds is not None and time.monotonic() - self.started >= stop.wall_seconds:
            self.stop_reason = "wall_seconds"
        elif stop.trainer_steps and self.tally.trainer_steps_reached(stop.trainer_steps):
            self.stop_reason = "trainer_steps"
        else:
            self.stop_reason = self.coordination.stop_reason()
        if self.stop_reason:
            self.stopped_at = (frames, time.monotonic() - self.started)
            self._check_came_up()

    def _check_came_up(self) -> None:
        """A stop rule held, but a role never ran in a run long enough for it to start
        (:data:`NEVER_UP_AFTER_S`; a short resume of an off-policy run may well end before
        its trainer is built): the run did not do what it reports. Counted from this start, not
        the run's: a resumed run's wall clock includes its earlier parts, and a 7 s resume of a
        55 s run failed as if its trainer had had 62 s."""
        elapsed = time.monotonic() - self.session_started
        missing = never_came_up(self.supervisor.workers.values())
        if missing and elapsed >= NEVER_UP_AFTER_S:
            since = "since the run resumed" if self.started < self.session_started else "of the run"
            self.supervisor.fail(WorkerFailure(", ".join(missing), (
                f"never came up in the {elapsed:.0f}s {since} (started, but never ready: see "
                "its log, `troupe ps`), so nothing of its role was done")))  # fmt: skip

    def _finish(self) -> dict[str, Any]:
        self.folder.write(lambda: self._report(show=False, written=True))  # the last counts
        if self.last_snapshot is not None:
            self.display.final(self.last_snapshot)
        self.folder.write(self.metrics.close)
        self.folder.write(self.coordination.close)  # the state's last save, PBT's plot
        summary = finish_run(
            self.config,
            self.run_dir,
            wall_s=time.monotonic() - self.started,
            stop_reason=self.stop_reason,
            stopped_at=self.stopped_at,
            failure=self.supervisor.failure,
            evaluation=self.tally.evaluation,
            extra=self.coordination.summary(),
            write=self.folder.write,
            best_episode_return=self.thinning.best_return,
            restarts=restarts_of(self.supervisor.workers),
            unstopped=unstopped_of(self.supervisor.workers, time.monotonic()),
            never_ready=[w for w, r in self.supervisor.workers.items() if not r.came_up],
        )
        self.folder.close()
        self.server.close()
        if self.exporter is not None:
            self.exporter.close()
        return summary

    # ----------------------------------------------------------------- reports
    def _report(self, show: bool = True, written: bool = False) -> None:
        """Make the record of now: shown, exported, and written unless ``metrics.thin`` leaves
        it out (``written``: it is written whatever the thinning says)."""
        elapsed = time.monotonic() - self.started
        workers = self.workers.values()
        record, roles = self.tally.record(elapsed, workers, self.callbacks.logged)
        record.update(self.coordination.on_record(record))  # curriculum stage, PBT scores
        table = self.supervisor.table()
        # workers and endpoints first: a reader that sees a record's frames finds them as of it
        run_folder.write_json(self.run_dir / run_folder.WORKERS, table)
        endpoints = {"controller": self.address, **self.names.endpoints}
        if self.exporter is not None:
            endpoints["metrics"] = self.exporter.url
        run_folder.write_json(self.run_dir / run_folder.ENDPOINTS, endpoints)
        if self.thinning.keep(record) or written:
            self.metrics.write({**record, **self.tally.written_timing()})
        run_folder.write_json(self.run_dir / run_folder.LATEST, jsonable(record))  # kept or not
        if self.exporter is not None:  # the last record of a run says it has ended
            self.exporter.update(record, table, self.run_name, running=show)
        snapshot = self.tally.snapshot(record, roles, workers, time.monotonic())
        self.last_snapshot = snapshot
        if show:
            self.display.update(snapshot)
        if show and not self.stop_reason:  # a run that met its rule has not stalled
            self._watch_progress(timing.every_role(roles.values()))

    def _watch_progress(self, waits: str) -> None:
        """Fail a run whose workers are all up and all waiting (:mod:`system.run.stall_watch`);
        ``waits``: what every role on the data path is doing."""
        steps = sum(s.get("steps", 0.0) for s in self.tally.trainer_stats.values())
        up = all(w.state in (WorkerState.ALIVE, WorkerState.STOPPED) for w in self.workers.values())
        stalled = self.stall.see(time.monotonic(), (self.tally.env_frames, steps), up, waits)
        if stalled and self.supervisor.failure is None:
            self.supervisor.fail(WorkerFailure("controller", stalled))

    # ----------------------------------------------------------------- messages
    def _receive(self, timeout_ms: int) -> None:
        for worker_id, message in self.server.receive(timeout_ms):
            try:
                self._handle(worker_id, message)
            except _MALFORMED as e:
                self.server.bad_messages.record(WireError(f"malformed control message: {e}"))

    def _handle(self, worker_id: str, message: wire.Message) -> None:
        record = self.workers.get(worker_id)
        if record is None:
            # An authenticated peer that is not one of this run's workers: say so, then drop it.
            self.server.send(worker_id, cp.Refused(f"'{worker_id}' is not a worker of this run"))
            raise ValueError(f"message '{message.kind}' from unknown worker '{worker_id}'")
        try:
            parsed = cp.parse(message)
        except WireError as e:
            if message.kind == cp.StateWrite.kind and isinstance(message.body, dict):
                self.server.send(worker_id, self.coordination.refuse(message.body, e))  # it waits
                return
            raise
        if not record.greeted and not isinstance(parsed, cp.Hello):
            self._refuse_earlier(record)
            return
        record.last_seen = time.monotonic()
        self.handlers[type(parsed)](record, parsed)

    def _refuse_earlier(self, record: WorkerRecord) -> None:
        """A worker of the run's earlier controller process: its frames were counted twice
        and, never greeted, it was taken for one that never came up. It leaves, to come back
        and say hello; its state is in the run folder, which this controller resumes."""
        wid = record.plan.worker_id
        if wid not in self.refused:
            self.refused.add(wid)
            logger.warning("%s is a worker of the run's earlier controller: told to leave, to "
                           "be started again and say hello", wid)  # fmt: skip
        self.server.send(wid, cp.Refused(REJOIN))

    def _send_all(self, messages: list[tuple[str, cp.ControlMessage]]) -> None:
        for worker_id, message in messages:
            self.server.send(worker_id, message)

    def _on_hello(self, record: WorkerRecord, hello: cp.Hello) -> None:
        if not self.supervisor.on_hello(record, hello.pid):  # it was told to stop: its stop
            self.server.send(record.plan.worker_id, cp.Stop())
            return
        if not self.shape.ready():  # answered, so it waits on; configured once it is resolved
            self.awaiting_shape[record.plan.worker_id] = record
            self.server.send(record.plan.worker_id, cp.Ack())
            return
        self._configure(record)

    def _configure_awaiting(self) -> None:
        """Configure the workers whose hello came while the run's shape was being resolved."""
        if not self.awaiting_shape or not self.shape.ready():
            return
        awaiting, self.awaiting_shape = self.awaiting_shape, {}
        for record in awaiting.values():
            if record.state is WorkerState.CONFIGURING:  # not gone meanwhile
                self._configure(record)

    def _configure(self, record: WorkerRecord) -> None:
        if self.shape.refused is not None:  # the run ends with it (_check_stop): no worker
            self.server.send(record.plan.worker_id, cp.Stop())  # is to fail on it again
            return
        state, shape = self.coordination.snapshot(), self.shape.get()
        configure = cp.Configure(
            self.config.to_dict(), str(self.run_dir), record.plan.to_wire(), state, shape
        )
        self.server.send(record.plan.worker_id, configure)

    def _on_heartbeat(self, record: WorkerRecord, beat: cp.Heartbeat) -> None:
        # a worker leaves when these stop coming; they carry the global state it lacks
        changes = self.coordination.changes(beat.state_revision)
        self.server.send(record.plan.worker_id, cp.Ack(changes))
        try:
            self.tally.add(record, WorkerStats.from_heartbeat(beat.stats))
        except CallbackError as e:  # a user callback that raises ends the run, with its message
            logger.error("%s", e, exc_info=e.__cause__)
            self.supervisor.fail(WorkerFailure("controller", str(e)))

    def _on_error(self, record: WorkerRecord, error: cp.Error) -> None:
        if error.type == RunFolderError.__name__:  # no restart can fix a full disk
            self.folder.failed(RunFolderError(error.message), by=record.plan.worker_id)
        quiet = self.folder.error is not None
        hung = error.type == cp.HUNG_POLL  # its poll ran past its bound: that time was no work
        stuck_s = self.config.liveness.bound(str(record.plan.role))[1] if hung else 0.0
        self.supervisor.on_error(
            record, error.message, error.traceback, error.fatal, quiet, stuck_s=stuck_s
        )

    def _on_state_write(self, record: WorkerRecord, request: cp.StateWrite) -> None:
        may_write = record.plan.role is Role.TRAINER
        self.server.send(record.plan.worker_id, self.coordination.write(request, may_write))


@contextlib.contextmanager
def _stopped_already():
    """Every worker has stopped in order: a second signal now has nothing left to stop at once,
    and the summary is written all the same. It used to cut the summary short and turn an
    orderly stop into exit 131 (``troupe stop --now`` sends its two signals 0.5 s apart)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def late(signum: int, frame) -> None:
        logger.warning("the run has stopped in order already; writing its summary")

    previous = {s: signal.signal(s, late) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
