"""The launch record: which launcher runs a run, and how an operator's command reaches it.

Every launcher leaves one (``launch.json``, :data:`system.run_folder.LAUNCH`): ``troupe run``
in the run folder (local and ``--launcher docker``: the host and the pid to signal), ``troupe
deploy swarm`` in the run folder, ``troupe deploy k8s`` in its output folder (the namespace),
``troupe deploy slurm`` in its output folder and the job, once it starts, in the run folder (the
job id). ``troupe status|logs|stop|ps RUN`` read it from a folder, or find a run by its name
(:func:`distributed.ops.backends.resolve`): a folder under ``runs/``, else a Swarm, Kubernetes
or Slurm run of that name.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from distributed.errors import OpsError
from system import run_folder
from system.processes import process_alive as pid_alive
from system.processes import process_start
from system.run import folder_lock

LAUNCHERS = ("local", "docker", "swarm", "k8s", "slurm")
DEFAULT_RUNS_DIR = "runs"
"""Where run names are looked up, and where a deployment leaves its record (:func:`point`)."""


@dataclass(frozen=True)
class LaunchRecord:
    launcher: str
    """One of :data:`LAUNCHERS`."""
    run: str
    """The run's name: its folder's name, or the name its scheduler's objects carry."""
    run_dir: str | None = None
    """The run folder, where this machine sees it (None: only the cluster sees it)."""
    host: str | None = None
    """local, docker: the machine whose process :attr:`pid` is."""
    pid: int | None = None
    """local: the controller process; docker: the process that runs the containers. Either
    stops the run in order on SIGINT and at once on a second one."""
    pid_start: int | None = None
    """When :attr:`pid` started (clock ticks after boot, ``/proc/PID/stat``): a pid the kernel
    gave to another process since is never signalled as this run's."""
    namespace: str | None = None
    """k8s: the run's namespace."""
    job_id: str | None = None
    """slurm: the job, once submitted (written by the job itself when it starts)."""
    started: float | None = None
    """Unix time of the launch."""

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise OpsError(
                f"launch record names launcher '{self.launcher}': expected one of "
                f"{', '.join(LAUNCHERS)}"
            )

    def running_here(self) -> bool:
        """Whether :attr:`pid` is still this run's process on this machine."""
        return self.here and pid_alive(self.pid, self.pid_start)

    @property
    def here(self) -> bool:
        """Whether :attr:`pid` is a process of this machine."""
        return self.host == socket.gethostname()

    def folder(self) -> Path | None:
        """The run folder when this machine sees it: one with a config, or logs (a run that
        failed before it wrote its config, which ``status`` and ``logs`` then said was "not on
        this machine"); not a folder :func:`point` left, which holds a launch record alone."""
        folder = Path(self.run_dir) if self.run_dir else None
        if folder and any((folder / n).exists() for n in (run_folder.CONFIG, run_folder.LOGS)):
            return folder
        return None


def write(folder: Path, record: LaunchRecord) -> None:
    run_folder.write_json(Path(folder) / run_folder.LAUNCH, asdict(record), sync=False)


def point(runs_dir: Path, record: LaunchRecord) -> Path | None:
    """Leave ``runs_dir/<run>/launch.json``, the record of a run deployed from here, so that the
    run is found by its name, and listed by ``troupe ps``, after its scheduler has forgotten it:
    a Slurm job leaves ``squeue`` when it ends, and ``troupe status NAME`` then found no run.
    The folder where it is (None): not where the run folder is that folder already, nor over
    a folder of another run or of something else."""
    folder = Path(runs_dir) / record.run
    if record.run_dir and Path(record.run_dir).resolve() == folder.resolve():
        return None
    if folder.exists():
        try:
            there = read(folder) if folder.is_dir() else None
        except OpsError:
            return None
        if there is None or (there.launcher, there.run) != (record.launcher, record.run):
            return None
    folder.mkdir(parents=True, exist_ok=True)
    write(folder, record)
    return folder


def for_process(launcher: str, run_dir: Path, pid: int, run: str | None = None) -> LaunchRecord:
    """The record of a run whose process ``pid`` runs on this machine (local, docker)."""
    return LaunchRecord(
        launcher,
        run or Path(run_dir).resolve().name,
        run_dir=str(Path(run_dir).resolve()),
        host=socket.gethostname(),
        pid=pid,
        pid_start=process_start(pid),
        started=time.time(),
    )


def read(folder: Path) -> LaunchRecord | None:
    """The record in ``folder``; a run folder from before records is a local run whose
    controller holds the folder's lock."""
    path = Path(folder) / run_folder.LAUNCH
    if not path.exists():
        if not (Path(folder) / run_folder.CONFIG).exists():
            return None
        holder = folder_lock.holder(Path(folder))
        return LaunchRecord(
            "local",
            Path(folder).resolve().name,
            run_dir=str(Path(folder).resolve()),
            host=socket.gethostname() if holder else None,
            pid=holder,
        )
    try:
        record = _from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as e:
        raise OpsError(f"{path} is not a launch record: {e}") from e
    if record.launcher in ("local", "docker"):  # its record lives in the run folder itself,
        record = _as_found(record, Path(folder).resolve())  # wherever it is mounted
    return _follow_run_folder(record, path)


def _as_found(record: LaunchRecord, here: Path) -> LaunchRecord:
    """A local or docker record read from ``here``. A copy of a run folder (``cp -a``) holds
    its original's record, while that folder still exists where the record says: the copy is
    a run of its own name, and the original's process is not its to signal (its status and
    ``ps`` were listed under the original's name, and a stop of the copy would have stopped a
    live original). It keeps where the original started (``host``), and no process: it is
    not running anywhere. A folder moved, or mounted at a path of a container's, is still its
    run."""
    recorded = Path(record.run_dir) if record.run_dir else None
    if (
        recorded is not None
        and recorded.resolve() != here
        and (recorded / run_folder.CONFIG).exists()
    ):
        return replace(record, run=here.name, run_dir=str(here), pid=None, pid_start=None)
    return replace(record, run_dir=str(here))


def _follow_run_folder(record: LaunchRecord, source: Path) -> LaunchRecord:
    """A deploy folder's record names the run folder; the job writes its own record there once
    it starts (the Slurm job id), which then says more."""
    if record.run_dir is None:
        return record
    inner = Path(record.run_dir) / run_folder.LAUNCH
    if not inner.exists() or inner.resolve() == source.resolve():
        return record
    try:
        data = json.loads(inner.read_text())
    except (OSError, ValueError):
        return record
    return _from_dict({**asdict(record), **{k: v for k, v in data.items() if v is not None}})


def _from_dict(data: dict) -> LaunchRecord:
    """A record from its JSON, keys of newer Troupes (unknown here) left out."""
    known = {f.name for f in fields(LaunchRecord)}
    return LaunchRecord(**{k: v for k, v in data.items() if k in known})
