"""Run observability: metrics on disk (JSON lines + TensorBoard) and per-component stage timing.

The controller owns one `MetricsWriter` per run folder and one `LiveDisplay` for the terminal; every
component may keep a `StageTimer` and ship `timer.report()` with its stats. The end-of-run files
(`learning_curve.png`, `summary.json`) are written by
`system.run.report`, the terminal panel lives in
`system.run.display`; both are re-exported here so callers need one import.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from system.run.display import LiveDisplay
from system.run.report import (
    METRICS_FILE,
    build_summary,
    jsonable,
    read_metrics,
    write_learning_curve,
    write_summary,
)

__all__ = [
    "LiveDisplay",
    "MetricsWriter",
    "StageTimer",
    "build_summary",
    "read_metrics",
    "write_learning_curve",
    "write_summary",
]

logger = logging.getLogger(__name__)

# Events reach disk within this many seconds, so TensorBoard follows a live run.
_TB_FLUSH_SECS = 10
_tb_unavailable_warned = False

Record = dict[str, float | int | str | None]
# Module-level alias: cheaper than an attribute lookup in the timing hot path, and a test seam.
_perf_counter = time.perf_counter


class _ScalarEvents:
    """TensorBoard scalars through tensorboard's own event-file writer.

    Not torch's SummaryWriter: importing torch costs the controller seconds of CPU while the
    workers it just started need that CPU to boot.
    """

    def __init__(self, run_dir: Path):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        _quiet_writer_thread_errors()
        self._writer = EventFileWriter(str(run_dir), flush_secs=_TB_FLUSH_SECS)

    def add_scalar(self, tag: str, value: float, global_step: int) -> None:
        summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=float(value))])
        self._writer.add_event(
            self._event(wall_time=time.time(), step=global_step, summary=summary)
        )

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _quiet_writer_thread_errors() -> None:
    """Keep an OSError of tensorboard's writer thread (a full disk) from printing a traceback.

    The thread keeps the error and tensorboard raises it again in the thread that writes or
    flushes next: there the controller turns it into its one-line run-folder error. Every other
    exception of every other thread still reaches the previous hook."""
    previous = threading.excepthook
    if getattr(previous, "troupe_quiet", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and issubclass(
            args.exc_type, OSError
        ):
            logger.debug("tensorboard's writer thread stopped: %s", args.exc_value)
            return
        previous(args)

    hook.troupe_quiet = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def _open_summary_writer(run_dir: Path) -> Any | None:
    """A TensorBoard scalar writer on `run_dir`, or None (warned once per process) without it."""
    global _tb_unavailable_warned
    try:
        return _ScalarEvents(run_dir)
    except ImportError as e:
        if not _tb_unavailable_warned:
            _tb_unavailable_warned = True
            logger.warning(
                "TensorBoard logging is off (%s); metrics still go to %s. "
                "Install the 'tensorboard' package to get event files.",
                e,
                METRICS_FILE,
            )
        return None


def _ends_without_newline(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            if f.tell() == 0:
                return False
            f.seek(-1, 2)
            return f.read(1) != b"\n"
    except FileNotFoundError:
        return False


class MetricsWriter:
    """Append metric records to `run_dir/metrics.jsonl` and, optionally, TensorBoard scalars.

    Each `write` is one JSON line, flushed at once, so the file is readable mid-run and complete up
    to the last record after a Ctrl+C. Numeric entries become TensorBoard scalars (tag = key) at
    step `env_frames` when the record has it, otherwise at the record's index. Non-finite floats
    are written as null and left out of TensorBoard. Safe to call from several threads.
    """

    def __init__(self, run_dir: str | Path, tensorboard: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self._start = time.monotonic()
        self._count = 0
        self._lock = threading.Lock()
        # A resumed run appends to the old file; if that run died mid-line, start on a fresh line
        # so only the old fragment is lost, not our first record too.
        needs_newline = _ends_without_newline(self.path)
        self._file = self.path.open("a", buffering=1, encoding="utf-8")
        if needs_newline:
            self._file.write("\n")
        self._tb = _open_summary_writer(self.run_dir) if tensorboard else None
        self._closed = False

    @property
    def tensorboard_enabled(self) -> bool:
        return self._tb is not None

    def write(self, record: Record) -> None:
        """Append one record; adds "wall_s" (seconds since this writer was made) if absent."""
        clean = jsonable(dict(record))
        clean.setdefault("wall_s", round(time.monotonic() - self._start, 3))
        line = json.dumps(clean, allow_nan=False)
        with self._lock:
            if self._closed:
                raise ValueError(f"MetricsWriter for {self.run_dir} is closed; cannot write")
            self._file.write(line + "\n")
            self._file.flush()
            if self._tb is not None:
                self._write_scalars(clean)
            self._count += 1

    def _write_scalars(self, record: dict[str, Any]) -> None:
        frames = record.get("env_frames")
        has_frames = isinstance(frames, (int, float)) and not isinstance(frames, bool)
        step = int(frames) if has_frames else self._count
        for key, value in record.items():
            # jsonable already turned non-finite floats into None; bools are flags, not curves.
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._tb.add_scalar(key, value, global_step=step)

    def flush(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._file.flush()
            if self._tb is not None:
                self._tb.flush()

    def close(self) -> None:
        """Flush and close the JSON-lines file and the event file; calling it again does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._file.close()
            finally:
                if self._tb is not None:
                    self._tb.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class _Stage:
    """One node of a StageTimer tree; also the context manager that times it."""

    __slots__ = ("_started", "children", "count", "name", "parent", "timer", "total")

    def __init__(self, timer: StageTimer, name: str, parent: _Stage | None) -> None:
        self.timer = timer
        self.name = name
        self.parent = parent
        self.children: dict[str, _Stage] = {}
        self.total = 0.0
        self.count = 0
        self._started = 0.0

    def __enter__(self) -> _Stage:
        self.timer._current = self
        self._started = _perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.total += _perf_counter() - self._started
        self.count += 1
        self.timer._current = self.parent


class StageTimer:
    """Nested wall-clock timing per component, in the spirit of Sample Factory's timing tree.

        timer = StageTimer()
        with timer.stage("rollout"):
            with timer.stage("inference"):
                ...
        timer.report()  # {"rollout": 1.2, "rollout/inference": 0.8}

    Entering a stage costs one dict lookup and one `perf_counter` call; nodes are created once and
    reused. One timer belongs to one thread (a worker's loop); give each thread its own.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every stage and restart the wall clock used for top-level percentages."""
        self._root = _Stage(self, "", None)
        self._current = self._root
        self._created = _perf_counter()

    def stage(self, name: str) -> _Stage:
        """Context manager timing `name` inside whichever stage is open now."""
        current = self._current
        node = current.children.get(name)
        if node is None:
            if not name or "/" in name:
                raise ValueError(f"stage name must be non-empty and contain no '/': {name!r}")
            node = current.children[name] = _Stage(self, name, current)
        return node

    def _walk(self) -> list[tuple[str, int, _Stage]]:
        """(path, depth, node) for every stage, depth first, in first-entered order."""
        out: list[tuple[str, int, _Stage]] = []
        pending = [("", 0, child) for child in reversed(self._root.children.values())]
        while pending:
            prefix, depth, node = pending.pop()
            path = f"{prefix}/{node.name}" if prefix else node.name
            out.append((path, depth, node))
            pending.extend((path, depth + 1, c) for c in reversed(node.children.values()))
        return out

    def report(self) -> dict[str, float]:
        """Total seconds in each stage path, e.g. {"rollout": 3.1, "rollout/inference": 2.0}."""
        return {path: node.total for path, _, node in self._walk()}

    def counts(self) -> dict[str, int]:
        """How many times each stage path was entered."""
        return {path: node.count for path, _, node in self._walk()}

    def format(self) -> str:
        """An indented tree: total seconds, entries, and share of the parent stage.

        Top-level stages show their share of the wall time since the timer was made (or reset),
        so the time spent outside every stage is visible too.
        """
        wall = _perf_counter() - self._created
        lines = [f"{'wall':<32} {wall:10.3f}s"]
        for _, depth, node in self._walk():
            parent_total = node.parent.total if node.parent is not self._root else wall
            share = 100.0 * node.total / parent_total if parent_total > 0 else 0.0
            label = "  " * (depth + 1) + node.name
            lines.append(f"{label:<32} {node.total:10.3f}s {share:6.1f}%  n={node.count}")
        return "\n".join(lines)
