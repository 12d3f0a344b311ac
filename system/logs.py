"""How every Troupe process logs: a console stream and, where the run folder is, a file.

The console shows warnings, errors and notices (:data:`NOTICE`: events a user follows that are
not problems, such as a PBT member copying another; ``TROUPE_LOG_LEVEL`` changes the level):
ten workers printing every INFO line into one terminal would bury what matters. Each process
also keeps an INFO log of its own in the run folder (``logs/<worker>.log``), whatever the console
level, rotated so that it never holds more than :data:`FILE_BYTES` x (:data:`FILE_BACKUPS` + 1):
``troupe logs RUN`` reads these for every launcher whose workers see the run folder (local,
Docker, Swarm, Slurm), so an operator has the INFO story of a run without having deployed it
with a special setting.

``TROUPE_LOG_FORMAT=json`` writes one JSON object a line on both streams (time, level, worker,
logger, message, and the traceback where there is one), for log shippers such as Fluent Bit or
Loki's promtail.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import time
from pathlib import Path

from system import run_folder

FILE_BYTES = 4 * 1024 * 1024
FILE_BACKUPS = 2
ENV_LEVEL = "TROUPE_LOG_LEVEL"
NOTICE = 25
"""Between INFO and WARNING: what a run's console shows that is not a problem (a PBT member
copying another, a curriculum's next stage), which was logged as a WARNING to be seen at all."""
logging.addLevelName(NOTICE, "NOTICE")
ENV_FORMAT = "TROUPE_LOG_FORMAT"
FORMATS = ("text", "json")


class JsonLines(logging.Formatter):
    """One JSON object a line: what log shippers parse without a regular expression."""

    def __init__(self, worker: str) -> None:
        super().__init__()
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "worker": self.worker,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def formatter(worker: str) -> logging.Formatter:
    """The text or JSON formatter ``TROUPE_LOG_FORMAT`` asks for (text when unset)."""
    kind = os.environ.get(ENV_FORMAT, "text").lower()
    if kind not in FORMATS:
        raise ValueError(f"{ENV_FORMAT}={kind!r}: use one of {', '.join(FORMATS)}")
    if kind == "json":
        return JsonLines(worker)
    return logging.Formatter(f"%(asctime)s {worker} %(levelname)s %(name)s: %(message)s")


def console_level() -> int:
    name = os.environ.get(ENV_LEVEL, "NOTICE").upper()
    level = logging.getLevelName(name)
    if not isinstance(level, int):
        raise ValueError(f"{ENV_LEVEL}={name!r}: use DEBUG, INFO, NOTICE, WARNING or ERROR")
    return level


def configure_process(worker: str, level: int | None = None) -> None:
    """The console stream of a controller or worker process (stderr). The root logger lets
    INFO through so that :func:`keep_in_run_folder` can add the file; the console handler
    filters to its own level: ``level``, else :func:`console_level`."""
    root = logging.getLogger()
    for handler in list(root.handlers):  # a forked process inherits its parent's
        root.removeHandler(handler)
    level = console_level() if level is None else level
    console = logging.StreamHandler()
    console.setLevel(level)
    console.setFormatter(formatter(worker))
    root.addHandler(console)
    root.setLevel(min(level, logging.INFO))


def log_file(run_dir: Path, worker: str) -> Path:
    """``logs/actor-0.log`` for ``actor/0``: one file a worker, whatever restarts it."""
    return Path(run_dir) / run_folder.LOGS / f"{worker.replace('/', '-')}.log"


def keep_in_run_folder(run_dir: Path | str, worker: str) -> Path | None:
    """Add the rotated INFO file in ``run_dir`` when this process can write there; a worker
    that does not mount the run folder (a Kubernetes actor) keeps its console stream only, and
    so does one whose folder is read-only. Returns the file, or None."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not os.access(run_dir, os.W_OK):
        return None
    path = log_file(run_dir, worker)
    try:
        path.parent.mkdir(exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=FILE_BYTES, backupCount=FILE_BACKUPS, encoding="utf-8"
        )
    except OSError as e:
        logging.getLogger(__name__).warning("no log file in %s: %s", path.parent, e)
        return None
    handler.setLevel(logging.INFO)
    handler.setFormatter(formatter(worker))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(min(root.level, logging.INFO))
    return path
