"""Whether the launch a worker belongs to has ended: for schedulers that restart tasks alone.

Swarm restarts a task that failed, and it does so after its engine restarts too. The launcher
gives every task of one deployment the same id (:data:`LAUNCH_ID_ENV`) and the run folder's place
(:data:`RUN_FOLDER_ENV`); the controller writes the id into ``summary.json`` at the end. What a
task started again does with a summary of its own launch depends on how the run ended:

- by itself (solved, its budget spent, failed), or stopped by its user (``troupe stop``,
  :func:`stopped_by`): nothing is left to do. The controller exits 0 before it starts
  anything, and so does a worker, which Swarm's ``on-failure`` policy leaves ended. Such a
  worker used to look for its controller for a minute, exit as orphaned and be started
  again, for as long as the services stood.
- interrupted (the engine stopped it, a drained node): Swarm starts the controller again, which
  resumes the run, as a Kubernetes controller pod started again does; the workers wait for it.
  One that waits in vain (the controller's restarts are spent) then exits 0 as well.

A summary of an earlier launch (a run deployed again with ``--resume``) has another id, so its
new tasks ignore it. A summary a worker saw as it met its controller is an earlier part of a
resumed run, not this part's end (:func:`stamp`).

A controller killed (out of memory, SIGKILL) writes no summary. Each start of it that bound its
sockets counts itself in the run folder (:func:`count_controller_start`); the launcher says how
many starts its scheduler makes at most (:data:`CONTROLLER_STARTS_ENV`). A worker that finds no
controller to answer it once all of them have been made exits 0 (:meth:`WorkerLaunch.
controller_spent`): it used to look for one for a minute, exit as orphaned and be started again
for as long as the services stood.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from system import logs, run_folder

logger = logging.getLogger(__name__)

LAUNCH_ID_ENV = "TROUPE_LAUNCH_ID"
"""One deployment's id, the same in every task of it (the controller's too)."""
RUN_FOLDER_ENV = "TROUPE_RUN_FOLDER"
"""Where a worker sees the run folder (a container's mount); unset where workers see none."""
SUMMARY_KEY = "launch_id"
INTERRUPTED = "interrupted"
"""The stop reason of a run stopped by a signal, which a controller started again resumes."""
STOPPED_BY_KEY = "stopped_by"
"""In the summary of a run whose stop a user asked for (:func:`stopped_by`): no signal of an
engine's, so a controller started again leaves it stopped."""

CONTROLLER_STARTS_ENV = "TROUPE_CONTROLLER_STARTS"
"""How many times the launch's scheduler starts its controller at most: the first start and its
restarts (Swarm's ``max_attempts`` plus one). Unset: no bound is known, and workers wait on."""

_stopped_by: str | None = None
Stamp = tuple[int, int, int]


def launch_id(environ: Mapping[str, str] = os.environ) -> str | None:
    """This process's launch id, if its launcher gave one (what the controller's summary keeps)."""
    return environ.get(LAUNCH_ID_ENV) or None


def _summary_path(environ: Mapping[str, str]) -> Path | None:
    folder = environ.get(RUN_FOLDER_ENV)
    return Path(folder) / run_folder.SUMMARY if folder and launch_id(environ) else None


def stamp(environ: Mapping[str, str] = os.environ) -> Stamp | None:
    """The summary file as it is now (None: there is none). The controller replaces the file
    whole, so one written since has another stamp; no clock is compared (nodes' clocks differ)."""
    path = _summary_path(environ)
    try:
        st = path.stat() if path is not None else None
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size) if st is not None else None


def ended_summary(
    environ: Mapping[str, str] = os.environ, *, for_good: bool = False, since: Stamp | None = None
) -> dict[str, Any] | None:
    """The run's summary if the launch this process belongs to has written one; else None.

    ``for_good``: only an end nothing resumes (:func:`ended_for_good`). ``since``: the
    :func:`stamp` of the summary there was when this worker met its controller; that one (an
    earlier part of the run, resumed since) is no end of this part.

    None too when the launcher gave no id or folder, or the summary is unreadable: the worker
    then waits for its controller, which is never wrong, only slow to give up."""
    path = _summary_path(environ)
    if path is None or (since is not None and stamp(environ) == since):
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or summary.get(SUMMARY_KEY) != launch_id(environ):
        return None
    return summary if ended_for_good(summary) or not for_good else None


def ended_for_good(summary: Mapping[str, Any]) -> bool:
    """Whether a run ended by itself (solved, a budget spent, failed) or was stopped by its
    user, not by an engine's signal: a controller started again then has nothing to resume."""
    return summary.get("stop_reason") != INTERRUPTED or bool(summary.get(STOPPED_BY_KEY))


def stopped_by(who: str) -> None:
    """Record, for this controller's summary, that ``who`` (``troupe stop``) asked for the
    run's stop. ``troupe stop`` asks a Swarm controller that is being started again (Swarm
    restarts it) through a request in the run folder: it stopped the run and exited 130, and
    Swarm started it again, which resumed the run the user had stopped."""
    global _stopped_by
    _stopped_by = who


def stop_asked_by() -> str | None:
    """Who asked for this run's stop, if a user did (:func:`stopped_by`)."""
    return _stopped_by


def say_ended(
    worker_id: str, summary: Mapping[str, Any], environ: Mapping[str, str] = os.environ
) -> None:
    """A warning on the console (the task's log) and in the worker's log in the run folder
    (``troupe logs``), for a summary :func:`ended_summary` found: a worker that exits at once
    is otherwise a puzzle."""
    logs.keep_in_run_folder(environ[RUN_FOLDER_ENV], worker_id)
    logger.warning(
        "%s: its run has ended (summary.json: %s) and its controller with it; nothing to "
        "rejoin, so it exits (`troupe stop` removes what is left of the run)",
        worker_id,
        _how_it_ended(summary),
    )


def say_nothing_to_resume(
    summary: Mapping[str, Any], environ: Mapping[str, str] = os.environ
) -> None:
    """What a controller started again after its run ended for good says as it exits 0, on
    the console (the task's log) and in the controller's log in the run folder."""
    logs.keep_in_run_folder(environ[RUN_FOLDER_ENV], "controller")
    logger.warning(
        "its run had ended (summary.json: %s) when this controller was started again: "
        "nothing to resume, so it exits (`troupe deploy swarm --resume` continues a run; "
        "`troupe stop` removes what is left of it)",
        _how_it_ended(summary),
    )


def _how_it_ended(summary: Mapping[str, Any]) -> str:
    said = str(summary.get("stop_reason", "no stop reason"))
    return f"{said}, by {summary[STOPPED_BY_KEY]}" if summary.get(STOPPED_BY_KEY) else said


def count_controller_start(run_dir: Path, environ: Mapping[str, str] = os.environ) -> int | None:
    """Count this start of the launch's controller, once its sockets are bound (a start
    killed before that answered no one either); the count so far, or None outside a launch.
    One controller holds the folder at a time (its lock), so reading and replacing is safe."""
    launch = launch_id(environ)
    if launch is None:
        return None
    starts = controller_starts(Path(run_dir), launch) + 1
    record = {SUMMARY_KEY: launch, "starts": starts}
    run_folder.write_json(Path(run_dir) / run_folder.CONTROLLER_STARTS, record, sync=True)
    allowed = _allowed_starts(environ)
    logger.info("controller start %d of launch %s%s", starts, launch,
                f" (its scheduler makes {allowed} at most)" if allowed else "")  # fmt: skip
    return starts


def controller_starts(run_dir: Path, launch: str) -> int:
    """How many times the controller of ``launch`` has started in ``run_dir`` (0: none, or
    only an earlier launch's)."""
    try:
        record = json.loads((run_dir / run_folder.CONTROLLER_STARTS).read_text())
    except (OSError, ValueError):
        return 0
    if not isinstance(record, dict) or record.get(SUMMARY_KEY) != launch:
        return 0
    starts = record.get("starts")
    return starts if isinstance(starts, int) else 0


def _allowed_starts(environ: Mapping[str, str]) -> int | None:
    try:
        allowed = int(environ.get(CONTROLLER_STARTS_ENV) or 0)
    except ValueError:
        return None
    return allowed if allowed > 0 else None


class WorkerLaunch:
    """A worker's view of its launch's end, taken as it starts (before its hello)."""

    def __init__(self, worker_id: str, environ: Mapping[str, str] = os.environ):
        self.worker_id, self.environ = worker_id, environ
        self.seen = stamp(environ)
        """The summary there was as it started: an earlier part's end if a controller answers."""

    def ended_before_start(self) -> bool:
        """Whether its run ended for good (by itself, or stopped by its user) before this worker
        started (say so if it did): an interrupted run is resumed by its controller, started
        again, which this worker waits for."""
        return self._said(ended_summary(self.environ, for_good=True))

    def ended_while_waiting(self, heard: bool) -> bool:
        """Whether its run has ended now that its controller is gone or never came (say so if
        it has). ``heard``: a controller answered this worker, so the summary it saw as it
        started is an earlier part's; one that never did finds any end of its launch an end."""
        return self._said(ended_summary(self.environ, since=self.seen if heard else None))

    def controller_spent(self, heard: bool) -> bool:
        """Whether its scheduler will start no controller again: every start it makes was
        made, and none answered this worker (say so if it will not). ``heard``: a controller
        answered, then went; this worker's restart looks for the next one first."""
        allowed, launch = _allowed_starts(self.environ), launch_id(self.environ)
        folder = self.environ.get(RUN_FOLDER_ENV)
        if heard or allowed is None or launch is None or not folder:
            return False
        starts = controller_starts(Path(folder), launch)
        if starts < allowed:
            return False
        logs.keep_in_run_folder(folder, self.worker_id)
        logger.warning(
            "%s: no controller answers, and its scheduler has started the run's controller "
            "%d times, all it starts (killed each time, with no summary written): the run is "
            "lost, so this worker exits 0 and is not started again. `troupe deploy swarm "
            "--resume RUN_DIR` continues the run from its checkpoints; `troupe stop` removes "
            "what is left of it",
            *(self.worker_id, starts),
        )
        return True

    def _said(self, summary: dict[str, Any] | None) -> bool:
        if summary is not None:
            say_ended(self.worker_id, summary, self.environ)
        return summary is not None
