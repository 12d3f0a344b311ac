"""Whether the launch a worker belongs to has ended: for schedulers that restart workers alone.

Swarm restarts a worker task that failed, and it does so after its engine restarts too, when the
run's controller (a task Swarm never restarts: its exit is the run's end) has ended the run
meanwhile. Such a worker looked for its controller for a minute, exited as orphaned, and was
started again, for as long as the service stood: its restarts are slower than Swarm's window
counts. The launcher gives every task of one deployment the same id (:data:`LAUNCH_ID_ENV`) and
the run folder's place (:data:`RUN_FOLDER_ENV`); the controller writes the id into
``summary.json`` at the end. A worker that finds a summary of its own launch exits 0, which
Swarm's ``on-failure`` policy leaves ended. A summary of an earlier launch (a run deployed
again with ``--resume``) has another id, so its new workers wait for their controller as ever.
A controller killed before its summary still leaves its workers to the old loop.
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


def launch_id(environ: Mapping[str, str] = os.environ) -> str | None:
    """This process's launch id, if its launcher gave one (what the controller's summary keeps)."""
    return environ.get(LAUNCH_ID_ENV) or None


def ended_summary(environ: Mapping[str, str] = os.environ) -> dict[str, Any] | None:
    """The run's summary if the launch this process belongs to has written one; else None.

    None too when the launcher gave no id or folder, or the summary is unreadable: the worker
    then waits for its controller, which is never wrong, only slow to give up."""
    launch, folder = launch_id(environ), environ.get(RUN_FOLDER_ENV)
    if launch is None or not folder:
        return None
    try:
        summary = json.loads((Path(folder) / run_folder.SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or summary.get(SUMMARY_KEY) != launch:
        return None
    return summary


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
        summary.get("stop_reason", "no stop reason"),
    )
