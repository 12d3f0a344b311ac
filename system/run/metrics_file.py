"""Reading a run's `metrics.jsonl`: all of it, only its last records, or only what was added since
the previous read.

A run writes a record a second; over days that is hundreds of MB of JSON and several GB as dicts.
So every reader here goes line by line, keeps only the keys it is asked for, and can start at a
byte offset: the last records are found from the file's end (a resume counts on from the last
one; a notebook shows the latest) and a poller reads only what is new since its previous call
(a live plot). None of them reads a long run's file whole for a few records.

The file is being appended to while it is read: a last line that is not yet a whole record is
left unread, so a reader never sees half a record and a poller takes that line on its next call.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from system import run_folder

logger = logging.getLogger("system.run.report")  # where a broken line has always been reported

METRICS_FILE = run_folder.METRICS

Keep = Callable[[str], bool]
"""Which keys of a record to keep."""


def read_metrics(
    run_dir: str | Path, keep: Keep | None = None, last: int | None = None
) -> list[dict[str, Any]]:
    """The records of `run_dir/metrics.jsonl`, oldest first; an absent file gives [].

    `keep`: the keys to keep of each record (all when None); `last`: only the last so many
    records, read from the file's end. A run killed mid-write leaves a truncated last line: it is
    skipped quietly. A broken line anywhere else (for instance a truncated line a resumed run
    appended after) is skipped with a warning naming it, so one bad line never costs the rest.
    """
    if last is not None and last <= 0:
        return []
    path = Path(run_dir) / METRICS_FILE
    if last is None:
        return read_from(path, 0, keep)[0]
    lines = last
    while True:  # more lines than records when some are blank or broken
        start = tail_offset(path, lines)
        records = read_from(path, start, keep)[0]
        if len(records) >= last or start == 0:
            return records[-last:]
        lines *= 2


def last_metrics(run_dir: str | Path) -> dict[str, Any] | None:
    """The last whole record of `run_dir/metrics.jsonl` (what a resumed run counts on from),
    read from the file's end; up to 7 broken lines after it are passed over."""
    records = read_metrics(run_dir, last=8)
    return records[-1] if records else None


def newest_record(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's record of now: `latest.json`, or the last record of `metrics.jsonl` where that
    is newer by `wall_s` (a folder an older Troupe wrote has no `latest.json`). After a day a
    thinned `metrics.jsonl` may hold nothing of the last minute: a run killed then resumes, and
    `troupe status` shows it, from its last second instead."""
    last = last_metrics(run_dir)
    latest = _read_latest(Path(run_dir) / run_folder.LATEST)
    if latest is None or (last is not None and _wall_s(last) > _wall_s(latest)):
        return last
    return latest


def _read_latest(path: Path) -> dict[str, Any] | None:
    try:
        record = _parse(path.read_bytes())  # written whole or not at all (write_atomically)
    except OSError:
        return None
    if record is None:
        logger.warning("%s is not a JSON object; using the last record of %s", path, METRICS_FILE)
        return None
    return record if _wall_s(record) >= 0 else None


def _wall_s(record: dict[str, Any]) -> float:
    """A record's `wall_s`; -1 where it has none that is a number."""
    wall = record.get("wall_s")
    return float(wall) if isinstance(wall, (int, float)) and not isinstance(wall, bool) else -1.0


def key_filter(keys: Iterable[str] | None) -> Keep | None:
    """A `keep` for the named keys; a name ending in "/" keeps every key under it
    ("trainer/default/" keeps that trainer's losses and counters). None keeps everything."""
    if keys is None:
        return None
    if isinstance(keys, str):  # a single name, not its letters
        keys = [keys]
    exact = frozenset(k for k in keys if not k.endswith("/"))
    prefixes = tuple(k for k in keys if k.endswith("/"))
    return lambda key: key in exact or key.startswith(prefixes)


class MetricsTail:
    """The records added to a run's `metrics.jsonl` since the previous :meth:`read` (the first
    one: every record so far), for a loop or a notebook that follows a run as it trains."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / METRICS_FILE
        self.offset = 0
        """Where the next read starts: just after the last whole line read."""

    def read(self, keep: Keep | None = None) -> list[dict[str, Any]]:
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            return []
        if size < self.offset:  # not this run's file any more (replaced by hand): start over
            logger.warning("%s is shorter than before; reading it from its start", self.path)
            self.offset = 0
        records, self.offset = read_from(self.path, self.offset, keep)
        return records


def read_from(path: Path, start: int, keep: Keep | None) -> tuple[list[dict[str, Any]], int]:
    """The records of the whole lines from byte `start` on, and the offset after the last one
    (a line still being written is left for the next read)."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return [], start
    records: list[dict[str, Any]] = []
    offset, number = start, 0
    broken: str | None = None  # a bad line, said once another line follows it
    with f:
        f.seek(start)
        for line in f:
            record = _parse(line) if line.strip() else None
            if record is None and not line.endswith(b"\n"):
                break  # being written, or cut by a crash: read again from here next time
            number += 1
            where = f"{path}:{number}" if start == 0 else f"{path} (byte {offset})"
            offset += len(line)
            if not line.strip():
                continue
            if broken:
                logger.warning("%s is not a JSON object; skipping that line", broken)
                broken = None
            if record is None:
                broken = where
            elif keep is None:
                records.append(record)
            else:
                records.append({k: v for k, v in record.items() if keep(k)})
    if broken:  # the last line: a crash cut it, and a resumed run ended it with a newline
        logger.debug("%s: ignoring a broken last line", broken)
    return records, offset


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line.decode("utf-8", errors="replace"))
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def tail_offset(path: Path, n: int, block: int = 65536) -> int:
    """The byte offset at which the last `n` whole lines of a file begin (0 when it has fewer,
    or is absent). Reads back from the end in doubling blocks, so finding many lines costs
    about as much as reading them."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return 0
    with f:
        pos = end = f.seek(0, os.SEEK_END)
        data = b""
        while pos > 0:
            start = max(0, pos - max(block, end - pos))
            f.seek(start)
            data = f.read(pos - start) + data
            pos = start
            found = _nth_line_start(data, n)
            if found is not None:
                return pos + found
    return 0


def _nth_line_start(data: bytes, n: int) -> int | None:
    """Where in `data` the last `n` lines ending in a newline begin, if `data` holds the newline
    before them (without it, the first of them may begin earlier)."""
    i = data.rfind(b"\n")  # what follows it is a line still being written
    for _ in range(n):
        if i < 0:
            return None
        i = data.rfind(b"\n", 0, i)
    return i + 1 if i >= 0 else None
