"""The controller: starts and supervises every worker of a run, aggregates stats, decides the end.

It owns the run folder's bookkeeping (resolved config, metrics, summary, learning curve), answers
the workers' control messages (hello, register, lookup, heartbeat, error, bye), restarts an actor
or policy worker that dies, and stops the run in order (actors, then policy workers and trainers,
then the parameter service last, so final checkpoints still reach disk) on the stopping rule, on
Ctrl+C, or on a fatal error.

How a worker is started (a local process, a container, ...) is the launcher's business: the
controller only calls ``launcher.start(worker_id, role, controller_address)``,
``launcher.is_alive(worker_id)`` and ``launcher.kill(worker_id)``.

Longer than 400 lines because it is the supervisor's state machine (start, heartbeats, restarts,
ordered stop); its report and display parts already live in their own modules.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import zmq

from api.code import load_code
from api.config import ExperimentConfig
from api.errors import RunFolderError
from system import timing
from system.errors import CallbackError, WireError, WorkerFailure
from system.ratelimit import BadMessages
from system.roles import Role, WorkerState
from system.run.control_channel import CONTROL_MAX_BYTES
from system.run.coordination import Coordination
from system.run.display import LiveDisplay
from system.run.episodes import CUSTOM, Callbacks, EpisodeWindow
from system.run.monitor import MetricsWriter
from system.run.plan import WorkerPlan, plan_workers
from system.run.report import (
    build_summary,
    read_metrics,
    write_learning_curve,
    write_summary,
    write_win_rates,
)
from system.run.stopping import HOLD_KEY, EvaluationWindows, judged_policy
from system.streams import wire
from system.timing import RoleTimes

logger = logging.getLogger(__name__)

HEARTBEAT_TIMEOUT_S = 30.0
STATS_EVERY_S = 1.0
SAVING_ROLES = (Role.TRAINER, Role.PARAMETER_SERVICE, Role.REPLAY)
"""Roles whose stop writes the run's last checkpoints (parameters, trainer state, replay)."""
MAX_RESTARTS = 5
"""Restarts in a row without progress after which a worker is given up on (a crash loop)."""
PROGRESS_S = 60.0
"""A worker that ran this long since its last restart made progress: its count starts over,
so a long run survives occasional crashes (a preempted node each hour) but not a loop."""


class Launcher(Protocol):
    start_grace_s: float
    """How long a worker may take from start to its first message (image pulls, imports)."""
    restart_grace_s: float
    """How long a worker that was running may take to be back after it died or went silent:
    restarted by us, or by its scheduler (which may also never do it: ``docker kill``)."""
    restarts_workers: bool
    """Whether a scheduler restarts workers (the controller then only waits for their hello)."""

    def start(self, worker_id: str, role: str, controller: str) -> None: ...
    def is_alive(self, worker_id: str) -> bool: ...
    def kill(self, worker_id: str) -> None: ...
    def stop_all(self, timeout_s: float) -> None: ...


@dataclass
class WorkerRecord:
    """What the controller knows of one worker of its plan."""

    plan: WorkerPlan
    state: WorkerState = WorkerState.STARTING
    restarts: int = 0
    in_a_row: int = 0
    """Restarts since the worker last ran for :data:`PROGRESS_S` (what a crash loop counts)."""
    alive_since: float | None = None
    last_error: str | None = None
    """The message of its last failure: the same one again is a line, not a traceback."""
    pid: int | None = None
    peak_rss_mb: float = 0.0
    last_seen: float = field(default_factory=time.monotonic)
    stats: dict[str, Any] = field(default_factory=dict)


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
    ):
        self.config = config
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.run_dir = Path(run_dir)
        self.launcher = launcher
        self.socket = wire.make_socket(
            zmq.ROUTER, server=True, hwm=10_000, max_message_bytes=CONTROL_MAX_BYTES
        )
        # A worker's replacement (restarted by Docker, Kubernetes, Slurm) connects under the same
        # identity while the hung original's connection may still be open: the newcomer takes
        # the name over, or every message meant for the worker would go to the dead one.
        self.socket.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.socket.bind(bind)
        endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        port = endpoint.rsplit(":", 1)[1]
        self.address = f"tcp://{advertise_host}:{port}" if advertise_host else endpoint
        self.workers = {p.worker_id: WorkerRecord(p) for p in plan_workers(config)}
        self.start_grace_s = float(getattr(launcher, "start_grace_s", 120.0))
        self.restart_grace_s = float(getattr(launcher, "restart_grace_s", self.start_grace_s))
        self.silent_since: dict[str, float] = {}
        """Workers that died or went silent after running, and since when: a restart that has
        not brought one back within ``restart_grace_s`` fails the run."""
        self.why_restarted: dict[str, str] = {}
        self.told_to_stop: set[str] = set()
        """Workers the shutdown has asked to stop. A scheduler may restart one just after (a
        hung worker's liveness probe fires as the run ends): its new process is told to stop
        at its hello, instead of being configured and waited for until it is killed."""
        self.endpoints: dict[str, str] = {}
        self.lookups: dict[str, list[bytes]] = {}
        self.watchers: dict[str, set[bytes]] = {}
        """Who looked each name up: they are told (``moved``) when its owner registers anew."""
        self.registered: set[str] = set()
        self.bad_messages = BadMessages(logger, "controller")
        self.metrics = MetricsWriter(self.run_dir)
        self.display = LiveDisplay(config.name, enabled=display)
        self.totals = {"env_frames": 0, "eval_env_frames": 0}
        self.returns: deque[float] = deque(maxlen=100)
        self.game_returns: deque[float] = deque(maxlen=100)
        """Whole games' unclipped scores, where the environment reports one at a game's end
        (``info["game_return"]``, as Atari-v0 does: its episodes are lives, rewards clipped)."""
        self.evaluation = EvaluationWindows(
            config.stop.eval_return,
            config.evaluation.episodes,
            config.stop.confirm_windows,
            policy=judged_policy(config),
            max_return=config.stop.max_return,
            envs=config.evaluation.workers * config.evaluation.envs_per_worker,
        )
        self.trainer_stats: dict[str, dict[str, float]] = {}
        self.exploration: dict[str, dict[str, float]] = {}
        """Each policy's exploration rate (epsilon) by the policy worker acting with it."""
        self.timing = RoleTimes()
        """Where each role's wall time goes (system.timing), from every heartbeat."""
        self.train_window = EpisodeWindow(100)
        self.eval_window = EpisodeWindow(config.evaluation.episodes)
        self.eval_count = 0
        load_code(config.code)  # the user's callbacks may live in the user's own files
        self.coordination = Coordination(config, self.run_dir)  # before callbacks: they use it
        # a resumed run's state may still hold a version: the first check releases it
        self._hold_said = self.coordination.store.get(HOLD_KEY)[0]
        self.callbacks = Callbacks(config.callbacks)
        self.started = time.monotonic()
        self._continue_counts()
        self.stop_reason = ""
        self.failure: WorkerFailure | None = None
        self.folder_error: RunFolderError | None = None

    def _continue_counts(self) -> None:
        """On resume, frames and wall-clock go on from where the stopped run left them."""
        records = read_metrics(self.run_dir)
        if records:
            self.totals["env_frames"] = int(records[-1].get("env_frames") or 0)
            self.started -= float(records[-1].get("wall_s") or 0.0)

    # ----------------------------------------------------------------- lifecycle
    def run(self) -> dict[str, Any]:
        """Start every worker, supervise until a stopping rule holds, stop, write the summary."""
        if self._write(lambda: _write_json(self.run_dir / "config.json", self.config.to_dict())):
            for state in self.workers.values():
                self.launcher.start(state.plan.worker_id, state.plan.role.value, self.address)
        self.display.start()
        next_stats = time.monotonic() + STATS_EVERY_S
        try:
            while not self.stop_reason:
                self._receive(timeout_ms=50)
                self._check_stop()  # every loop: a solved run ends the moment it is known
                if time.monotonic() >= next_stats:
                    next_stats += STATS_EVERY_S
                    self._write(self._report)
                    self._supervise()
            # The record that met the stopping rule, at the moment it did: episodes that finish
            # during shutdown would move the evaluation mean away from what decided.
            self._write(self._report)
        except KeyboardInterrupt:
            self.stop_reason = "interrupted"
        finally:
            self._shutdown()
        return self._finish()

    def _shutdown(self) -> None:
        started = time.monotonic()
        for order in (0, 1, 2):
            if order == 1:
                self._revive_savers()
            ids = [w for w, s in self.workers.items() if s.plan.stop_order == order]
            self._stop_workers(ids)
            logger.info("stopped %s after %.2fs", ids, time.monotonic() - started)
        self.launcher.stop_all(timeout_s=10.0)
        self.display.stop()
        logger.info("every worker process ended after %.2fs", time.monotonic() - started)

    def _revive_savers(self, timeout_s: float = 30.0) -> None:
        """Before trainers stop, every worker whose stop writes the run's last checkpoints
        (:data:`SAVING_ROLES`: the parameter service takes the final version and trainer state,
        a trainer sends them, a replay worker saves its buffer) must be there and running its
        loop. One that died moments before the stop, too late for supervision to restart it, is
        restarted now and waited for; so is one restarted moments ago (stopped while being
        built, a worker just leaves, without its on_stop)."""
        if self.stop_reason == "failed":  # what failed may be why a worker is down
            return
        savers = [s for s in self.workers.values() if s.plan.role in SAVING_ROLES]
        for state in savers:
            wid = state.plan.worker_id
            down = state.state is WorkerState.FAILED or not self.launcher.is_alive(wid)
            given_up = self.failure is not None and self.failure.worker == wid
            if down and state.plan.restartable and not given_up:
                self._restart(state, "exited")
        back = (WorkerState.RESTARTING, WorkerState.CONFIGURING)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(s.restarts and s.state in back for s in savers):
            self._receive(timeout_ms=100)

    def _stop_workers(self, ids: list[str], timeout_s: float = 15.0) -> None:
        waiting = {w for w in ids if self.launcher.is_alive(w) and self.workers[w].state.running}
        self.told_to_stop.update(ids)
        for w in waiting:
            wire.send(self.socket, "stop", {}, envelope=[w.encode()])
        deadline = time.monotonic() + timeout_s
        while waiting and time.monotonic() < deadline:
            self._receive(timeout_ms=100)
            waiting = {w for w in waiting if self.workers[w].state.running}
            gone = {w for w in waiting if not self.launcher.is_alive(w)}
            if gone:
                # A worker sends bye, then exits: its bye may still be on its way to us.
                self._receive(timeout_ms=200)
                for w in gone:
                    if self.workers[w].state.running:
                        logger.warning("%s exited on stop without saying bye", w)
                        self.workers[w].state = WorkerState.FAILED
                waiting -= gone
        for w in waiting:
            logger.warning("%s did not stop in %.0fs; killing it", w, timeout_s)
            self.launcher.kill(w)
            self.workers[w].state = WorkerState.FAILED
        for w in ids:  # a saver that left without its bye did not save: the run is incomplete
            state = self.workers[w]
            if state.state is WorkerState.FAILED and state.plan.role in SAVING_ROLES:
                self._fail(w, f"{w} did not finish its stop; its last checkpoint may be missing")

    def _write(self, write) -> bool:
        """Do one of the run folder's writes; if the folder cannot be written (a full disk, a
        read-only mount), stop the run with that one-line cause instead of a traceback."""
        try:
            write()
            return True
        except RunFolderError as e:  # an atomic write (ratings.json) already named its file
            self._folder_failed(e)
            return False
        except OSError as e:
            self._folder_failed(RunFolderError.from_os_error(self.run_dir, e))
            return False

    def _folder_failed(self, error: RunFolderError) -> None:
        if self.folder_error is None:
            self.folder_error = error
            logger.error("%s", error)
        self.failure = self.failure or WorkerFailure("controller", str(error))
        self.stop_reason = self.stop_reason or "failed"

    def _finish(self) -> dict[str, Any]:
        # The last counts, for metrics.jsonl; the display has closed.
        self._write(lambda: self._report(show=False))
        self._write(self.metrics.close)
        self._write(self.coordination.close)  # the state's last save, PBT's plot
        wall = time.monotonic() - self.started
        target = self.config.stop.eval_return
        solved = self.stop_reason == "eval_return"
        # A failure after a stop rule held or Ctrl+C (a final checkpoint not written) leaves
        # the run incomplete all the same: the summary and the exit code say so, not the rule.
        failed_late = self.failure is not None and self.stop_reason != "failed"
        summary = build_summary(
            read_metrics(self.run_dir),
            solved=solved,
            wall_s=wall,
            target=target,
            stop_reason="failed" if failed_late else self.stop_reason,
        )
        if failed_late:
            summary["stop_rule_met"] = self.stop_reason
        if self.failure is not None:
            summary["failure"] = str(self.failure)
        if self.config.stop.eval_return_source:
            summary["target_source"] = self.config.stop.eval_return_source
        summary.update(self.coordination.summary())
        if solved:
            summary["confirmation"] = self.evaluation.describe()
            summary["eval_window_means"] = list(self.evaluation.confirmed)
            if self.evaluation.solved_version is not None:
                summary["solved_version"] = {
                    "policy": self.evaluation.policy,
                    "version": self.evaluation.solved_version,
                }
        summary["summary_written"] = self._write(lambda: write_summary(self.run_dir, summary))
        if summary["summary_written"]:
            self._write(
                lambda: write_learning_curve(self.run_dir, title=self.config.name, target=target)
            )
            trained = [n for n, pc in self.config.policies.items() if pc.trainer.type]
            self._write(
                lambda: write_win_rates(self.run_dir, title=self.config.name, first=trained)
            )
        self.socket.close(linger=0)
        return summary

    # ----------------------------------------------------------------- messages
    def _receive(self, timeout_ms: int) -> None:
        first = True
        while True:
            try:
                got = wire.recv(self.socket, timeout_ms=timeout_ms if first else 0)
            except WireError as e:
                self.bad_messages.record(e)
                continue
            first = False
            if got is None:
                return
            envelope, message = got
            if len(envelope) != 1:  # a worker's DEALER gives exactly its identity
                self.bad_messages.record(
                    WireError(f"control message with {len(envelope)} routing frames, not 1")
                )
                continue
            try:
                self._handle(envelope[0].decode(), message)
            except (KeyError, TypeError, ValueError, AttributeError, UnicodeDecodeError) as e:
                self.bad_messages.record(WireError(f"malformed control message: {e!r}"))

    def _handle(self, worker_id: str, message: wire.Message) -> None:
        state = self.workers.get(worker_id)
        if state is None:
            # An authenticated peer that is not one of this run's workers: say so, then drop it.
            self._send(
                worker_id, "refused", {"reason": f"'{worker_id}' is not a worker of this run"}
            )
            raise ValueError(f"message '{message.kind}' from unknown worker '{worker_id}'")
        if not isinstance(message.body, dict):
            raise ValueError(f"message '{message.kind}' from {worker_id} has no mapping body")
        state.last_seen = time.monotonic()
        body = message.body
        if message.kind == "hello":
            if state.state.running:
                self._restarted_elsewhere(state)
            state.state = WorkerState.CONFIGURING
            state.pid = int(body.get("pid", 0)) or None
            if worker_id in self.told_to_stop:  # its stop went to the process it replaces
                self._send(worker_id, "stop", {})
            else:
                self._send(worker_id, "configure", self._configuration(state.plan))
        elif message.kind == "register":
            self._register(str(body["name"]), str(body["address"]))
        elif message.kind == "lookup":
            self.lookups.setdefault(str(body["name"]), []).append(worker_id.encode())
            self.watchers.setdefault(str(body["name"]), set()).add(worker_id.encode())
            self._answer_lookups(str(body["name"]))
        elif message.kind == "ready":
            state.state = WorkerState.ALIVE
            state.alive_since = time.monotonic()
        elif message.kind == "heartbeat":
            # a worker leaves when these stop coming; they carry the global state it lacks
            self._send(worker_id, "ack", self.coordination.ack(body))
            self._absorb(worker_id, body.get("stats") or {})
        elif message.kind == "error":
            if body.get("type") == RunFolderError.__name__:  # no restart can fix a full disk
                self._folder_failed(RunFolderError(str(body["message"])))
            fatal = bool(body.get("fatal", False))
            self._on_error(state, str(body["message"]), str(body.get("traceback", "")), fatal)
        elif message.kind == "bye":
            state.state = WorkerState.STOPPED
        elif message.kind == "state_write":
            may_write = state.plan.role is Role.TRAINER
            self._send(worker_id, "state_result", self.coordination.write(body, may_write))
        else:
            raise ValueError(f"unknown control message kind '{message.kind}'")

    def _send(self, worker_id: str, kind: str, body: dict[str, Any]) -> None:
        wire.send(self.socket, kind, body, envelope=[worker_id.encode()])

    def _configuration(self, plan: WorkerPlan) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "run_dir": str(self.run_dir),
            "plan": plan.to_wire(),
            "global_state": self.coordination.snapshot(),
        }

    def _register(self, name: str, address: str) -> None:
        """A worker bound ``name``. If another process had it before (a restart), everyone who
        looked it up is told, so peers that keep a connection (to the parameter service, say)
        reconnect at once instead of waiting for a timeout."""
        known = self.watchers.get(name, set())
        self.endpoints[name] = address
        if name in self.registered:
            for ident in known:
                wire.send(
                    self.socket, "moved", {"name": name, "address": address}, envelope=[ident]
                )
        self.registered.add(name)
        self._answer_lookups(name)

    def _answer_lookups(self, name: str) -> None:
        address = self.endpoints.get(name)
        if address is None:
            return
        for ident in self.lookups.pop(name, []):
            wire.send(
                self.socket, "lookup_result", {"name": name, "address": address}, envelope=[ident]
            )

    def _on_error(self, state: WorkerRecord, message: str, tb: str, fatal: bool = False) -> None:
        """``fatal``: a user error (unknown name, bad argument) that a restart cannot fix."""
        state.state = WorkerState.FAILED
        wid = state.plan.worker_id
        if self.folder_error is not None:  # the cause is known and said; the rest follows from it
            logger.warning("%s failed: %s", wid, message)
        elif message == state.last_error:  # a crash loop: its traceback was shown once
            logger.warning("%s failed again with the same error (restart %d in a row)",
                           wid, state.in_a_row)  # fmt: skip
        else:
            logger.error("%s failed: %s\n%s", wid, message, tb)
        state.last_error = message
        if fatal or not state.plan.restartable:
            self.failure = WorkerFailure(wid, message, tb)
            self.stop_reason = self.stop_reason or "failed"
        elif _crash_looping(state):
            self.failure = WorkerFailure(wid, _given_up(state, message), tb)
            self.stop_reason = self.stop_reason or "failed"

    # ----------------------------------------------------------------- supervision
    def _supervise(self) -> None:
        now = time.monotonic()
        for wid, state in self.workers.items():
            if state.state is WorkerState.STOPPED or self.stop_reason:
                continue
            if state.state is WorkerState.ALIVE:
                self.silent_since.pop(wid, None)
            dead = not self.launcher.is_alive(wid)
            silent = now - state.last_seen > self._silence_limit(wid, state)
            if not (dead or silent or state.state is WorkerState.FAILED):
                continue
            why = "exited" if dead else "went silent" if silent else "failed"
            if silent and wid in self.silent_since and state.state is WorkerState.RESTARTING:
                lost = now - self.silent_since[wid]
                why = f"was not back {lost:.0f}s after it {self.why_restarted[wid]}"
                self._fail(wid, f"{wid} {why}; {self._restart_hint()}")
                return
            if not state.plan.restartable:
                self._fail(wid, f"{wid} {why}; not restarted")
                return
            if _crash_looping(state):
                self._fail(wid, _given_up(state, state.last_error or why))
                return
            self._restart(state, why)

    def _silence_limit(self, wid: str, state: WorkerRecord) -> float:
        """How long a worker may go without a message: a heartbeat interval when running; after
        a restart, the restart grace; the start grace before its first message."""
        if state.state is WorkerState.ALIVE:
            return self.heartbeat_timeout_s
        return self.restart_grace_s if wid in self.silent_since else self.start_grace_s

    def _fail(self, wid: str, message: str) -> None:
        self.failure = self.failure or WorkerFailure(wid, message)
        self.stop_reason = self.stop_reason or "failed"

    def _restart_hint(self) -> str:
        if getattr(self.launcher, "restarts_workers", False):
            return (
                "its scheduler did not restart it (Docker does not restart a container stopped "
                "by `docker kill` or `docker stop`); see `docker ps -a` or the scheduler's events"
            )
        return "see its log lines above for why it does not start"

    def _restart(self, state: WorkerRecord, why: str) -> None:
        wid = state.plan.worker_id
        self.silent_since.setdefault(wid, time.monotonic())
        self.why_restarted[wid] = why
        if getattr(self.launcher, "restarts_workers", False):
            logger.warning(
                "%s %s; waiting up to %.0fs for its scheduler to restart it",
                *(wid, why, self.restart_grace_s),
            )
        else:
            logger.warning("%s %s; restarting it (restart %d)", wid, why, state.restarts + 1)
        self.launcher.kill(wid)
        self._forget_endpoints(state.plan)  # peers must look up the new address
        _count_restart(state)
        state.state = (
            WorkerState.RESTARTING
        )  # its hello then is expected, not a restart by a scheduler
        state.last_seen = time.monotonic()
        self.launcher.start(wid, state.plan.role.value, self.address)

    def _restarted_elsewhere(self, state: WorkerRecord) -> None:
        """A scheduler (Docker, Swarm, Kubernetes) restarted a worker: count it, and forget the
        old process's addresses so peers look the new ones up."""
        logger.warning("%s says hello again: restarted by its scheduler", state.plan.worker_id)
        _count_restart(state)
        self._forget_endpoints(state.plan)

    def _forget_endpoints(self, plan: WorkerPlan) -> None:
        for name in plan.endpoints():
            self.endpoints.pop(name, None)

    # ----------------------------------------------------------------- stats
    def _absorb(self, worker_id: str, stats: dict[str, Any]) -> None:
        state = self.workers[worker_id]
        role = state.plan.role
        self.timing.add(timing_role(state.plan), worker_id, stats)
        stats = timing.without_timing(stats)
        if role is Role.ACTOR:
            self.totals["env_frames"] += int(stats.get("env_frames", 0))
            self.totals["eval_env_frames"] += int(stats.get("eval_env_frames", 0))
            episodes = stats.get("episodes", [])
            self.returns.extend(e["episode_return"] for e in episodes)
            self.game_returns.extend(
                e["episode_info/game_return"] for e in episodes if "episode_info/game_return" in e
            )
            self.train_window.extend(episodes)
            self.coordination.on_episodes(episodes, evaluation=False)
            self.coordination.on_episodes(stats.get("eval_episodes", []), evaluation=True)
            self._callback(self.callbacks.episodes, episodes)
            judged = f"policy/{self.config.evaluation.policy}/episode_return"
            for e in stats.get("eval_episodes", []):
                # a mapping may leave the judged policy out of an episode: it does not count
                if self.config.evaluation.policy and judged not in e:
                    continue
                versions = e.get("versions")
                self.evaluation.add(
                    e[judged] if self.config.evaluation.policy else e["episode_return"],
                    versions.get(self.evaluation.policy) if isinstance(versions, dict) else None,
                    env=e.get("env"),
                    started_at=e.get("started_at"),
                )
                self.eval_window.extend([e])
                self.eval_count += 1
                if self.eval_count % self.config.evaluation.episodes == 0:
                    episodes = list(self.eval_window.episodes)
                    self._callback(self.callbacks.evaluation, self._eval_mean(), episodes)
        elif role is Role.POLICY:
            if state.plan.policy == self.evaluation.policy:
                self.evaluation.on_worker_stats(stats)  # the version it holds for evaluation
            if isinstance(stats.get("epsilon"), (int, float)):  # what the actors act with
                self.exploration.setdefault(state.plan.policy, {})[worker_id] = stats["epsilon"]
        elif role is Role.TRAINER:
            numeric = {k: float(v) for k, v in stats.items() if isinstance(v, (int, float))}
            if numeric:
                self.trainer_stats.setdefault(state.plan.policy, {}).update(numeric)
                self.coordination.on_train_stats(state.plan.policy, numeric)
                self._callback(self.callbacks.train_result, state.plan.policy, numeric)
        if stats:  # a heartbeat sent during a long poll carries none: keep the last ones
            state.stats = {k: v for k, v in stats.items() if isinstance(v, (int, float))}
        state.peak_rss_mb = max(state.peak_rss_mb, float(stats.get("peak_rss_mb", 0.0)))

    def _callback(self, hook, *args) -> None:
        """A user callback that raises ends the run, with its message as the failure."""
        try:
            hook(*args)
        except CallbackError as e:
            logger.error("%s", e, exc_info=e.__cause__)
            self.failure = self.failure or WorkerFailure("controller", str(e))
            self.stop_reason = self.stop_reason or "failed"

    def _eval_mean(self) -> float | None:
        return self.evaluation.mean()

    def _report(self, show: bool = True) -> None:
        elapsed = time.monotonic() - self.started
        record: dict[str, Any] = {
            "wall_s": elapsed,
            "env_frames": self.totals["env_frames"],
            "fps": self.totals["env_frames"] / max(elapsed, 1e-9),
            "eval_env_frames": self.totals["eval_env_frames"],
            "episode_return": float(np.mean(self.returns)) if self.returns else None,
            "eval_return": self._eval_mean(),
            "game_return": float(np.mean(self.game_returns)) if self.game_returns else None,
            "worker_health/alive": sum(w.state is WorkerState.ALIVE for w in self.workers.values()),
            "worker_health/restarts": sum(w.restarts for w in self.workers.values()),
        }
        # episode_length, policy/<name>/episode_return, episode_info/<key>: means of the window
        record.update({k: v for k, v in self.train_window.means().items() if k not in record})
        record.update(self.eval_window.means("eval/"))
        record.update(self.evaluation.figures())  # the version evaluation holds, if any
        record.update(self.coordination.on_record(record))  # curriculum stage, PBT scores
        record.update({f"{CUSTOM}{k}": v for k, v in self.callbacks.logged.items()})
        for name, by_worker in self.exploration.items():
            record[f"policy/{name}/epsilon"] = float(np.mean(list(by_worker.values())))
        for name, stats in self.trainer_stats.items():
            record[f"policy/{name}/version"] = stats.get("version")
            for k, v in stats.items():
                record[f"trainer/{name}/{k}"] = v
        roles = self.timing.take()
        record.update(timing.record(roles))
        record.update({f"timing/{k}": v for k, v in self.timing.take_batches().items()})
        self.metrics.write(record)
        if show:
            snapshot = self._snapshot(elapsed, record)
            snapshot["bottleneck"] = timing.bottleneck(roles.values())
            self.display.update(snapshot)
        self._write_workers()

    def _write_workers(self) -> None:
        """``workers.json``: who runs where, for users and tools (pids, states, restarts)."""
        table = {
            wid: {
                "role": s.plan.role.value,
                "pid": s.pid,
                "state": s.state.value,
                "restarts": s.restarts,
                "peak_rss_mb": round(s.peak_rss_mb, 1),
                # the parameters a policy worker serves, or a trainer last published
                "version": s.stats.get("version"),
            }
            for wid, s in self.workers.items()
        }
        _write_json(self.run_dir / "workers.json", table)
        _write_json(self.run_dir / "endpoints.json", {"controller": self.address, **self.endpoints})

    def _snapshot(self, elapsed: float, record: dict[str, Any]) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "elapsed_s": elapsed,
            "env_frames": record["env_frames"],
            "fps": record["fps"],
            "episode_return": record["episode_return"],
            "eval_return": record["eval_return"],
            "game_return": record["game_return"],
            "custom": {
                k[len("custom/") :]: v
                for k, v in record.items()
                if k.startswith("custom/") and not k.endswith(("/min", "/max"))
            },
            "target": self.config.stop.eval_return,
            "policies": {
                name: {
                    "version": int(s.get("version", 0)),
                    "lag": s.get("version_lag"),
                    "trainer": s,
                }
                for name, s in self.trainer_stats.items()
            },
            "workers": [
                {
                    "id": wid,
                    "role": s.plan.role.value,
                    "state": s.state.value,
                    "restarts": s.restarts,
                    "heartbeat_age_s": now - s.last_seen,
                }
                for wid, s in self.workers.items()
            ],
        }

    def _check_stop(self) -> None:
        if self.stop_reason:  # a failure reported in this loop's messages: it decides
            return
        stop = self.config.stop
        solved = self.evaluation.solved()
        self._say_hold()
        if solved:
            self.stop_reason = "eval_return"
        elif stop.env_frames is not None and self.totals["env_frames"] >= stop.env_frames:
            self.stop_reason = "env_frames"
        elif stop.wall_seconds is not None and time.monotonic() - self.started >= stop.wall_seconds:
            self.stop_reason = "wall_seconds"
        elif (
            stop.trainer_steps is not None
            and self.trainer_stats
            and all(s.get("steps", 0) >= stop.trainer_steps for s in self.trainer_stats.values())
        ):
            self.stop_reason = "trainer_steps"
        else:
            self.stop_reason = self.coordination.stop_reason()

    def _say_hold(self) -> None:
        """Tell the judged policy's workers, through the global state, to hold the version
        they have for evaluation (or to stop holding), when the confirmation's need changed."""
        order = self.evaluation.hold_order()
        if order != self._hold_said:
            self.coordination.store.set(HOLD_KEY, order)
            self._hold_said = order


def timing_role(plan: WorkerPlan) -> str:
    """The role a worker's timings are tallied under: evaluation actors apart from training
    ones (they are held to a pace, and wait for it by design)."""
    return "eval_actor" if getattr(plan, "evaluation", False) else plan.role.value


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".json.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)  # after a replace there is nothing; after a failure, no .tmp


def _count_restart(state: WorkerRecord) -> None:
    ran = state.alive_since is not None and time.monotonic() - state.alive_since >= PROGRESS_S
    state.in_a_row = 1 if ran else state.in_a_row + 1
    state.restarts += 1
    state.alive_since = None


def _crash_looping(state: WorkerRecord) -> bool:
    """Restarted :data:`MAX_RESTARTS` times in a row, never running :data:`PROGRESS_S`."""
    ran = state.alive_since is not None and time.monotonic() - state.alive_since >= PROGRESS_S
    return not ran and state.in_a_row >= MAX_RESTARTS


def _given_up(state: WorkerRecord, error: str) -> str:
    return (
        f"given up after {state.in_a_row} restarts in a row without progress (a crash loop); "
        f"its error: {error}"
    )
