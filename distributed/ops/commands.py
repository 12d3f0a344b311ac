"""``troupe status|logs|stop|ps``: one set of operations commands for every launcher.

``RUN`` is a run folder, the name of a folder under ``--runs-dir`` (``runs/`` by default), or
the name of a Swarm, Kubernetes or Slurm run (:func:`distributed.ops.backends.resolve`). What the
run folder says (workers, metrics, summary, logs) is read the same way for every launcher; the
launcher's backend adds its scheduler's view and does the stopping
(:mod:`distributed.ops.backends`).
"""

from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path

from rich.table import Table
from rich.text import Text

from distributed.errors import OpsError
from distributed.launch import stop_request
from distributed.launch.last_lines import warning_lines
from distributed.ops import backends, folder
from distributed.ops.backends import resolve
from distributed.ops.record import DEFAULT_RUNS_DIR, LaunchRecord, read
from system.console import Console

STOP_WAIT_S = 180.0


def _add_run_argument(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument(
        "run",
        metavar="RUN",
        nargs=None if required else "?",
        help="run folder, or run name (a folder under --runs-dir, or a Swarm, Kubernetes or "
        "Slurm run)",
    )
    parser.add_argument(
        "--runs-dir", default=DEFAULT_RUNS_DIR, help="where run names are looked up (runs)"
    )


def _state(record: LaunchRecord, alive: bool | None) -> str:
    run_dir = record.folder()
    summary = folder.summary(run_dir) if run_dir else None
    if alive:
        return "running"
    if summary is not None:
        reason = summary.get("stop_reason", "?")
        return f"ended ({reason}{', solved' if summary.get('solved') else ''})"
    if alive is None:
        return "unknown from this machine"
    return "not running (no summary: killed, or not started)"


# --------------------------------------------------------------------- troupe status
def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    _add_run_argument(parser)


def run_status(args: argparse.Namespace, console: Console) -> int:
    """The run's state, its last figures, each worker's state; the scheduler's view."""
    record = resolve(args.run, Path(args.runs_dir))
    be = backends.backend(record)
    unasked = None  # why the scheduler could not be asked (no squeue here): the folder still says
    try:
        alive = be.alive(record)
    except OpsError as e:
        alive, unasked = None, e
    console.print(Text(f"run {record.run} ({record.launcher}): {_state(record, alive)}"))
    run_dir = record.folder()
    if record.started:
        started = datetime.fromtimestamp(record.started).strftime("%Y-%m-%d %H:%M:%S")
        console.print(Text(f"started {started} on {record.host or 'the cluster'}"))
    if run_dir is None:
        console.print(Text(f"run folder {record.run_dir or '(unknown)'}: not on this machine"))
    else:
        _print_folder(run_dir, console, record, alive)
    if unasked is not None:
        console.print(Text(f"{record.launcher} view: not asked ({unasked})"))
    elif record.launcher != "local":
        rows = be.processes(record)
        console.print(_process_table(f"{record.launcher} view", rows))
        if alive is False and run_dir is not None and folder.summary(run_dir) is not None:
            _say_leftovers(record, rows, console)
    return 0


def _say_leftovers(record: LaunchRecord, rows: list[backends.Process], console: Console) -> None:
    """Workers that run on after their run ended: Swarm starts a run's worker tasks again after
    its engine's restart, and Docker a run's containers whose launching process was killed,
    with no controller left for them (each fails after a minute, and is started again)."""
    left = [row for row in rows if row.running and row.worker != "controller"]
    if left:
        names = ", ".join(row.name for row in left)
        console.print(Text(f"the run has ended, but workers of it still run ({names}), with no "
                           f"controller: `troupe stop {record.run}` removes them"))  # fmt: skip


def _print_folder(
    run_dir: Path, console: Console, record: LaunchRecord, alive: bool | None
) -> None:
    console.print(Text(f"run folder {run_dir.resolve()}"))
    last = folder.headline(folder.last_metrics(run_dir))
    if last:
        console.print(Text("last metrics: " + ", ".join(f"{k} {v}" for k, v in last.items())))
    summary = folder.summary(run_dir)
    if summary and summary.get("failure"):
        console.print(Text(f"failure: {summary['failure']}"))
    for line in warning_lines(summary or {}):  # what the run's last lines said of its workers
        console.print(Text(line, style="yellow"))
    workers = folder.workers(run_dir)
    if not workers:
        return
    table = _table("workers", ("worker", "role", "state", "restarts", "peak MB", "version"))
    for worker, info in workers.items():
        state = backends.worker_state(record, info, alive)
        cells = [
            info.get("role"),
            state,
            *(info.get(k) for k in ("restarts", "peak_rss_mb", "version")),
        ]
        table.add_row(worker, *("" if c is None else str(c) for c in cells))
    console.print(table)


def _process_table(title: str, rows: list[backends.Process]) -> Table:
    table = _table(title, ("name", "worker", "state", "where", "detail"))
    for row in rows:
        table.add_row(row.name, row.worker, row.state, row.where, row.detail)
    return table


WHOLE_COLUMNS = frozenset({"run", "worker", "name", "env_frames", "fps", "restarts", "peak MB",
                           "version"})  # fmt: skip
"""Columns never cut: what names a run, a worker or a container, and the figures. On an
80-column terminal, and in a pipe (rich's 80 columns), ``troupe ps`` showed
``arrreward-v0-ppo-20…`` and ``trainer/default…``: names a user types into ``troupe logs``."""


def _table(title: str, columns: tuple[str, ...]) -> Table:
    """A table of the ops commands: the :data:`WHOLE_COLUMNS` kept whole, the others wrapped,
    breaking a word too long for its column rather than cutting it short."""
    table = Table(title=title, title_justify="left")
    for column in columns:
        whole = column in WHOLE_COLUMNS
        table.add_column(column, no_wrap=whole, overflow="ellipsis" if whole else "fold")
    return table


# --------------------------------------------------------------------- troupe logs
def add_logs_arguments(parser: argparse.ArgumentParser) -> None:
    _add_run_argument(parser)
    parser.add_argument(
        "--worker", metavar="ID", help="one worker (actor/2, controller) or a role (actor)"
    )
    parser.add_argument("--tail", type=int, default=50, metavar="N", help="last N lines of each")
    parser.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new lines until the run ends"
    )
    parser.add_argument(
        "--source",
        choices=("auto", "folder", "scheduler"),
        default="auto",
        help="folder: the run folder's INFO logs; scheduler: the containers', services', pods' "
        "or job's own output; auto: the folder where this machine sees it",
    )


QUIET_CONSOLE = (
    ": a worker's own output holds NOTICE and above only (TROUPE_LOG_LEVEL=INFO at launch "
    "puts INFO there too); its INFO lines are in the run folder's logs"
)


def run_logs(args: argparse.Namespace, console: Console) -> int:
    """Each worker's lines, prefixed with its id, interleaved by time."""
    record = resolve(args.run, Path(args.runs_dir))
    run_dir = record.folder()
    use_folder = args.source == "folder" or (args.source == "auto" and run_dir is not None)
    if use_folder and run_dir is None:
        console.print(Text(f"run folder of '{record.run}' is not on this machine: --source "
                           "scheduler reads the scheduler's output"))  # fmt: skip
        return 1
    if not use_folder and record.launcher == "local":
        console.print(Text("error: a local run has no scheduler's output: its workers print to "
                           "the console of the troupe run that started them, and every line "
                           "is in the run folder (--source folder)", style="red"),
                      soft_wrap=True)  # fmt: skip
        return 1
    if use_folder and args.worker and (unknown := folder.unknown_worker(args.worker, run_dir)):
        console.print(Text(f"error: {unknown}", style="red"), soft_wrap=True)
        return 1
    if use_folder:
        lines = _folder_lines(record, run_dir, args)
    else:
        lines = backends.backend(record).logs(record, args.worker, args.tail, args.follow)
    shown = 0
    try:
        for worker, line in lines:
            console.print(Text(f"[{worker}] {line}"), highlight=False, soft_wrap=True)
            shown += 1
            if getattr(console, "reader_gone", False):  # `troupe logs -f | head`: done
                return 0
    except KeyboardInterrupt:
        return 0
    if not shown and not args.follow:
        what = f"worker '{args.worker}'" if args.worker else "any worker"
        known = ", ".join(folder.log_files(run_dir)) if use_folder else ""
        console.print(Text(f"no lines from {what} of run '{record.run}'"
                           + (f" (logs of: {known})" if known else QUIET_CONSOLE)))  # fmt: skip
    return 0


def _folder_lines(record: LaunchRecord, run_dir: Path, args: argparse.Namespace):
    files = lambda: folder.select(  # noqa: E731
        folder.log_files(run_dir), args.worker, folder.workers(run_dir)
    )
    yield from folder.tail(files(), args.tail)
    if args.follow:
        be = backends.backend(record)
        yield from folder.follow(files, ended=lambda: be.alive(record) is False)


# --------------------------------------------------------------------- troupe stop
def add_stop_arguments(parser: argparse.ArgumentParser) -> None:
    _add_run_argument(parser)
    parser.add_argument(
        "--now",
        action="store_true",
        help="stop at once (a second signal): workers are killed, the summary is not written; "
        "resume from the last persisted version",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=STOP_WAIT_S,
        metavar="S",
        help=f"how long to wait for the run to end ({STOP_WAIT_S:.0f}); 0: do not wait",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the scheduler's objects (services, Jobs)"
    )


def run_stop(args: argparse.Namespace, console: Console) -> int:
    """Stop the run in order (the controller stops every worker and writes the summary), wait
    for it to end, then remove what its scheduler keeps. Exit 0 once it has ended, 1 if it
    is still running after ``--wait`` seconds."""
    record = resolve(args.run, Path(args.runs_dir))
    be = backends.backend(record)
    console.print(Text(be.stop(record, args.now)))
    ended = backends.wait_until_ended(be, record, args.wait)
    if not ended and args.wait > 0:
        console.print(Text(f"run '{record.run}' still runs after {args.wait:.0f}s"))
        return 1
    run_dir = record.folder()
    if ended and run_dir is not None:  # a request its run ended without taking: not the next's
        stop_request.clear(run_dir)
    summary = folder.summary(run_dir) if run_dir else None
    if ended and summary:
        console.print(Text(f"run '{record.run}' ended: {summary.get('stop_reason')}"))
    if not args.keep and (ended or args.now):
        removed = be.remove(record)
        if removed:
            console.print(Text(removed))
    return 0


# --------------------------------------------------------------------- troupe ps
def add_ps_arguments(parser: argparse.ArgumentParser) -> None:
    _add_run_argument(parser, required=False)


def run_ps(args: argparse.Namespace, console: Console) -> int:
    """With RUN: its processes (pids, containers, services, pods or job steps) and their state;
    without: every run under ``--runs-dir`` and whether it still runs."""
    if args.run:
        record = resolve(args.run, Path(args.runs_dir))
        rows = backends.backend(record).processes(record)
        console.print(_process_table(f"run {record.run} ({record.launcher})", rows))
        return 0
    table = _table(
        f"runs under {args.runs_dir}/", ("run", "launcher", "state", "env_frames", "fps")
    )
    root = Path(args.runs_dir)
    runs = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    for path in runs:
        try:
            record = read(path)
        except OpsError as e:  # one bad record does not hide the other runs
            table.add_row(path.name, "?", str(e), "", "")
            continue
        if record is None:
            continue
        try:
            alive = backends.backend(record).alive(record)
        except OpsError:  # a cluster run whose scheduler cannot be asked from here (no squeue)
            alive = None
        last = folder.headline(folder.last_metrics(record.folder() or path))
        table.add_row(record.run, record.launcher, _state(record, alive),
                      str(last.get("env_frames", "")), str(last.get("fps", "")))  # fmt: skip
    if not table.row_count:  # an empty table's header read as if something failed to list
        where = "no such folder" if not root.is_dir() else "none there"
        console.print(Text(f"no runs under {args.runs_dir}/ ({where}); a run given --run-dir "
                           "elsewhere: troupe ps --runs-dir ITS_PARENT, or troupe status "
                           "RUN_DIR"))  # fmt: skip
        return 0
    console.print(table)
    return 0
