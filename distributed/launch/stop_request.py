"""A stop asked for in the run folder, for a cluster controller that cannot take a signal yet.

``troupe stop`` stops a cluster run by signalling its controller (Slurm: ``scancel
--signal=INT`` of the controller step; Swarm: the controller service scaled to zero). Before the
controller has started (a Slurm job still setting up, a Swarm task still being prepared) there
was nothing to signal, and the stop was lost: the run then went on as if never stopped. A signal
that came while the controller's Python was still importing killed it with a traceback, and its
workers ran on without a summary.

So until the controller holds the run folder's lock (``system.run.folder_lock``, which
``troupe controller`` takes right after it has set up how it answers signals), ``troupe stop``
writes :data:`FILE` into the run folder instead. ``troupe controller`` looks for it as it starts
(it then starts no worker, writes its summary with ``stop_reason`` ``interrupted`` and exits 130,
as a stopped run does) and, for a request written while it was taking the lock, every
:data:`POLL_S` after that. The request names the Slurm job it is for, so a request left by a job
that ended before its controller started does not stop a later job of the same run folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

from system.run import folder_lock, launch_end

logger = logging.getLogger(__name__)

FILE = "stop-request.json"
POLL_S = 1.0
"""How often a running controller looks for a request written as it took the folder's lock."""
SLURM_JOB = "SLURM_JOB_ID"


def controller_listening(run_dir: Path) -> bool:
    """Whether a controller holds ``run_dir`` (its lock): it answers a stop signal by stopping
    in order. Until then a signal may come before it can (``troupe stop`` writes a request)."""
    return folder_lock.holder(Path(run_dir)) is not None


def write(run_dir: Path, job_id: str | None = None) -> Path:
    """Ask the controller of ``run_dir`` (of Slurm job ``job_id``) to stop in order."""
    path = Path(run_dir) / FILE
    Path(run_dir).mkdir(parents=True, exist_ok=True)  # a Slurm job makes it as it starts
    request = {"requested": time.time(), "by": "troupe stop", "job_id": job_id}
    temporary = path.with_name(f".{FILE}.{os.getpid()}")
    temporary.write_text(json.dumps(request) + "\n")
    temporary.replace(path)  # whole or not at all: the controller may read it at any moment
    return path


def clear(run_dir: Path) -> None:
    """Remove a request nobody took (its run ended before a controller started)."""
    with contextlib.suppress(OSError):
        (Path(run_dir) / FILE).unlink()


def take(run_dir: Path, environ=os.environ) -> dict | None:
    """The request for this controller, removed from the folder (taken once); None if there is
    none. A request for another Slurm job is stale: removed, and None."""
    path = Path(run_dir) / FILE
    try:
        text = path.read_text()
        path.unlink()
    except OSError:
        return None
    try:
        request = json.loads(text)
    except ValueError:
        request = {}
    if not isinstance(request, dict):
        request = {}
    job = request.get("job_id")
    if job and environ.get(SLURM_JOB) and str(job) != environ[SLURM_JOB]:
        logger.warning("ignoring %s: it asked job %s to stop, this is job %s", path, job,
                       environ[SLURM_JOB])  # fmt: skip
        return None
    launch_end.stopped_by(str(request.get("by") or "troupe stop"))  # not to resume: summary
    return request


def watch(run_dir: Path, already_asked, poll_s: float = POLL_S) -> threading.Thread:
    """Until a request comes: look for one every ``poll_s``, and on one send this process the
    SIGINT a stop would have been (unless ``already_asked()``: a signal asked for the stop
    already, and a second one would abandon it)."""

    def run() -> None:
        while take(run_dir) is None:
            time.sleep(poll_s)
        if already_asked():
            return
        logger.warning("troupe stop asked for the run to stop (%s): stopping it in order", FILE)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=run, name="stop-request", daemon=True)
    thread.start()
    return thread
