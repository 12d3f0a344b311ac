"""What a run folder tells an operator: its workers, its last metrics, how it ended, its logs.

Every launcher whose workers see the run folder (local, Docker, Swarm, Slurm) answers
``troupe status`` and ``troupe logs`` from here alike; the scheduler is only asked what the
folder cannot say (:mod:`distributed.ops.backends`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from system import logs, run_folder
from system.run import metrics_file
from system.run_folder import last_lines

HEADLINE = ("wall_s", "env_frames", "emulator_frames", "fps", "episode_return", "eval_return")
"""The figures of the last metrics record that ``troupe status`` and ``troupe ps`` show
(``emulator_frames`` where the run has them: Atari)."""


def read_json(path: Path) -> Any:
    """A JSON file, or None when it is missing or being replaced (written atomically, so a
    half file is never seen; a missing one is a run that has not written it yet)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def workers(folder: Path) -> dict[str, dict[str, Any]]:
    return read_json(folder / run_folder.WORKERS) or {}


def summary(folder: Path) -> dict[str, Any] | None:
    return read_json(folder / run_folder.SUMMARY)


def last_metrics(folder: Path) -> dict[str, Any] | None:
    """The run's record of its last second (``latest.json``), or the last whole record of
    ``metrics.jsonl``, read from its end, where that is newer (a long run's file is big, and
    after a day it keeps a record a minute)."""
    return metrics_file.newest_record(folder)


def headline(record: dict[str, Any] | None) -> dict[str, Any]:
    if not record:
        return {}
    out = {}
    for key in HEADLINE:
        if key == "emulator_frames" and key not in record:
            continue
        value = record.get(key)
        out[key] = round(value, 1) if isinstance(value, float) else value
    return out


def log_files(folder: Path) -> dict[str, Path]:
    """Worker id -> its log file. Ids come from ``workers.json`` (a file name cannot tell
    ``policy/default/0`` from ``policy-default/0``); a file no worker of the table owns (a
    worker of an earlier resume) keeps its file name as its id."""
    directory = folder / run_folder.LOGS
    if not directory.is_dir():
        return {}
    owners = {logs.log_file(folder, w).name: w for w in ["controller", *workers(folder)]}
    return {owners.get(p.name, p.stem): p for p in sorted(directory.glob("*.log"))}


def select(
    files: dict[str, Path], worker: str | None, table: dict[str, dict[str, Any]] | None = None
) -> dict[str, Path]:
    """Every worker's file, or those ``worker`` names: an id, or the first part of ids
    (``actor`` is every ``actor/N``), or a role in ``table`` (``workers.json``: ``actor``
    includes the evaluation actors ``eval/N``)."""
    if worker is None:
        return files
    return {w: p for w, p in files.items() if names(worker, w, table or {})}


def names(worker: str, worker_id: str, table: dict[str, dict[str, Any]]) -> bool:
    """Whether ``--worker worker`` names the worker ``worker_id``."""
    role = (table.get(worker_id) or {}).get("role")
    return worker in (worker_id, worker_id.split("/")[0], role)


def unknown_worker(worker: str, folder: Path) -> str | None:
    """What to say of ``--worker worker`` where it names none of the run's workers (a typo:
    ``trainr`` printed "no lines" and exit 0), else None; None too before the run has
    written its table of workers."""
    table = workers(folder)
    ids = ["controller", *table]
    if not table or any(names(worker, w, table) for w in ids):
        return None
    roles = sorted({str(t.get("role")) for t in table.values() if t.get("role")})
    return (
        f"no worker '{worker}' in this run: --worker takes an id ({', '.join(ids)}) or a role "
        f"({', '.join(roles)})"
    )


def tail(files: dict[str, Path], n: int) -> Iterator[tuple[str, str]]:
    """(worker id, line) for the last ``n`` lines of each file, in time order across files
    (each line starts with its time, so a sort by it interleaves them as they happened)."""
    lines = [(line, w) for w, p in files.items() for line in last_lines(p, n)]
    for line, worker in sorted(lines, key=lambda pair: _time_of(pair[0])):
        yield worker, line


def _time_of(line: str) -> str:
    """The sortable time a log line starts with, in text or JSON form (:mod:`system.logs`)."""
    if line.startswith("{"):
        try:
            return str(json.loads(line).get("time", "")).replace("T", " ")
        except ValueError:
            return ""
    return line[:23]


def follow(
    files: Callable[[], dict[str, Path]],
    ended: Callable[[], bool],
    poll_s: float = 0.5,
    quiet_s: float = 2.0,
) -> Iterator[tuple[str, str]]:
    """(worker id, line) for every line written from now on, as ``tail -F`` does: files that
    appear later (a worker started late) are followed too, a file rotated under us is read
    again from its start. Ends ``quiet_s`` after ``ended()`` turns true with nothing new."""
    offsets: dict[Path, tuple[int, int]] = {}  # path -> (inode, offset)
    for path in files().values():
        offsets[path] = _position(path, at_end=True)
    quiet_since: float | None = None
    while True:
        wrote = False
        for worker, path in files().items():
            inode, offset = offsets.get(path, (0, 0))
            new_inode, size = _position(path, at_end=True)
            if new_inode != inode or size < offset:  # rotated: its new file from the start
                offset = 0
            if size > offset:
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read(size - offset)
                whole = chunk[: chunk.rfind(b"\n") + 1]  # a line being written waits
                for line in whole.decode("utf-8", errors="replace").splitlines():
                    wrote = True
                    yield worker, line
                offset += len(whole)
            offsets[path] = (new_inode, offset)
        if wrote or not ended():
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return
        time.sleep(poll_s)


def _position(path: Path, at_end: bool) -> tuple[int, int]:
    try:
        stat = path.stat()
    except OSError:
        return 0, 0
    return stat.st_ino, stat.st_size if at_end else 0
