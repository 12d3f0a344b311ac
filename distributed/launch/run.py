"""``troupe run``: resolve the experiment, make the run folder, run the controller apart.

The command's own process only waits: the controller process starts every worker (as its
children, through the launcher) and writes the run folder. Ctrl+C reaches the whole process group;
workers ignore it and the controller turns it into an orderly stop, so the command waits for that
stop to finish, then exits with the controller's code.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from multiprocessing.process import BaseProcess
from pathlib import Path

from api.config import ExperimentConfig
from api.config.checks import check_portable
from api.errors import RunFolderError, UserError
from api.resolve import load_experiment
from distributed.launch.budget import warn_short_budget, warn_target_horizon
from distributed.launch.signals import (
    EXIT_ABANDONED,
    EXIT_FAILED,
    Interrupts,
    exit_code_of,
    forwarding,
    forwards_signals,
    own_process_group,
    run_interrupts,
    start_forked,
)
from distributed.ops import record as launch_record
from system import run_folder
from system.run import folder_lock

logger = logging.getLogger(__name__)

LAUNCHERS = ("local", "docker")
"""local: every role as a process of this machine; docker: every role in its own container."""


def default_run_dir(experiment: str) -> Path:
    return Path("runs") / f"{experiment}-{time.strftime('%Y%m%d-%H%M%S')}"


def new_default_run_dir(experiment: str) -> Path:
    """A new folder ``runs/<experiment>-<time>``, made here; ``-2``, ``-3``, ... where runs
    started in the same second took it first (a sweep of ``troupe.train(..., background=True)``
    calls: the second was refused as "run folder ... is not empty")."""
    base = default_run_dir(experiment)
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunFolderError.from_os_error(base.parent, e) from e
    for n in range(1, 1000):
        folder = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            folder.mkdir()  # atomic: of two runs making the same folder, one gets it
        except FileExistsError:
            continue
        except OSError as e:
            raise RunFolderError.from_os_error(folder, e) from e
        return folder
    raise UserError(f"no free run folder named {base}-N under {base.parent}: name one")


def prepare(
    experiment: str | ExperimentConfig | None,
    overrides: list[str],
    run_dir: str | None,
    resume: str | None,
    imports: list[str] = (),
) -> tuple[ExperimentConfig, Path]:
    """The checked config and the run folder (a new one, or the one being resumed).

    ``experiment``: a registered name, an experiment file, an environment id or a config (see
    :mod:`api.resolve`); ``imports``: the user's own files or modules, imported first."""
    if resume:
        folder = Path(resume)
        if not (folder / run_folder.CONFIG).exists():
            raise UserError(f"{folder} is not a run folder: it has no config.json")
        folder_lock.acquire(folder)  # before anything is read or written: one owner
        try:
            return _resumed(folder, overrides, imports), folder
        except BaseException:
            folder_lock.release(folder)
            raise
    if not experiment:
        raise UserError("name an experiment (troupe list shows them) or pass --resume RUN_DIR")
    config = load_experiment(experiment, overrides, imports)
    check_portable(config)
    _check_plan(config)
    warn_short_budget(config)
    warn_target_horizon(config)
    folder = Path(run_dir) if run_dir else new_default_run_dir(config.name)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunFolderError.from_os_error(folder, e) from e
    folder_lock.acquire(folder)  # first: a folder in use is refused naming who uses it
    try:
        _check_empty(folder)
        _check_writable(folder)
    except BaseException:
        folder_lock.release(folder)
        raise
    return config, folder


def _check_plan(config: ExperimentConfig) -> None:
    """Plan the run's workers once here, so that what only the plan can tell (a role in
    ``roles`` that no imported module defines) is said before a run folder is made."""
    from api.code import load_code
    from system.run.plan import plan_workers

    load_code(config.code)
    plan_workers(config)


def _resumed(folder: Path, overrides: list[str], imports) -> ExperimentConfig:
    """The config a run folder resumes with: its own, with ``overrides`` allowed to change
    what can change (:mod:`system.run.resume_check`), a stop budget left to run; the folder's
    checkpoints verified."""
    from system.run import resume_check

    saved = resume_check.saved_config(folder)
    _check_writable(folder)
    config = load_experiment(saved, overrides, imports)
    check_portable(config)
    frames = resume_check.check_budget_left(folder, config)
    resume_check.check_not_solved(folder, config)
    resume_check.check_compatible(saved, config, folder)
    resume_check.check_checkpoints(folder, config)
    warn_short_budget(config, frames)
    return config


def _check_empty(folder: Path) -> None:
    if not folder.exists() or all(p.name == folder_lock.LOCK_FILE for p in folder.iterdir()):
        return
    if (folder / run_folder.LAUNCH).exists() and not (folder / run_folder.CONFIG).exists():
        # "--resume it" was advice the resume then refused ("it has no config.json")
        raise UserError(
            f"run folder {folder} holds a run that failed before it started (no "
            f"{run_folder.CONFIG}: nothing to resume; its error is in "
            f"{folder / run_folder.LOGS / 'controller.log'}): remove the folder or pick "
            "another --run-dir"
        )
    raise UserError(f"run folder {folder} is not empty; pick another --run-dir or --resume it")


def _check_writable(folder: Path) -> None:
    """Fail before any process starts if the run folder cannot be written (read-only mount,
    permissions, a full disk): a message now, not a traceback from the controller later."""
    probe = folder / f".troupe-write-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"x" * 4096)
    except OSError as e:
        raise RunFolderError.from_os_error(folder, e) from e
    finally:
        # On a read-only mount even removing a file that is not there fails (EROFS): the
        # error above already says so.
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)


def controller_main(
    config_dict: dict,
    run_dir: str,
    display: bool | None,
    metrics_port: int | None = None,
    interrupts: Interrupts | None = None,
) -> int:
    """Entry point of the controller process. ``interrupts``: signals held back while it
    starts (:func:`run_interrupts`), armed as its loop begins; a stop asked for before then
    ends the run in order without starting a worker (exit 130, a summary)."""
    from distributed.launch.local import LocalLauncher
    from system import logs
    from system.run.controller import Controller
    from system.streams import transport

    logs.configure_process("controller")
    logs.keep_in_run_folder(run_dir, "controller")
    config = ExperimentConfig.from_dict(config_dict)
    try:
        transport.secure_from_environment()
    except UserError as e:  # the keys went bad after the launch checked them
        logger.error("%s", e)
        return EXIT_FAILED
    launcher = LocalLauncher()
    try:
        controller = Controller(
            config, Path(run_dir), launcher, display=display, metrics_port=metrics_port
        )
    except UserError as e:  # the metrics port is taken
        logger.error("%s", e)
        return EXIT_FAILED
    try:
        summary = controller.run(stopped=interrupts.arm if interrupts else None)
    except KeyboardInterrupt:  # a second signal while the run stopped in order
        logger.warning("stopping at once: every worker is killed; resume from the last "
                       "persisted version with `troupe run --resume %s`", run_dir)  # fmt: skip
        launcher.stop_all(timeout_s=0.0)
        controller.abandoned()
        return EXIT_ABANDONED
    return exit_code_of(summary)


def run_local(
    config: ExperimentConfig, run_dir: Path, display: bool | None = None, secure: bool = False
) -> int:
    """Run the controller process to the end; return its exit code.

    ``secure``: make CURVE keys for this run (``run_dir/keys``, owner-only) and use them on every
    socket, as cluster runs always do.
    """
    return wait_local(start_local(config, run_dir, display=display, secure=secure))


def check_keys(run_dir: Path, secure: bool) -> None:
    """Security fails closed: keys asked for (``--secure`` on a folder that has a keys file, or
    ``TROUPE_CURVE_KEYS_FILE``) but missing, empty or malformed stop the launch here, in one
    line, before any process starts; never plain sockets instead."""
    from system.streams import security

    keys_file = run_dir / "keys"
    if secure and keys_file.exists():
        security.load_keys_file(keys_file, f"--secure: {keys_file}")
    elif not secure:
        security.keys_from_environment()


def start_local(
    config: ExperimentConfig,
    run_dir: Path,
    display: bool | None = None,
    secure: bool = False,
    metrics_port: int | None = None,
) -> BaseProcess:
    """Start the controller process of a local run and return it (see :func:`run_local`).
    ``metrics_port``: serve Prometheus metrics there (:mod:`system.run.prometheus`)."""
    from system.streams import security

    check_keys(run_dir, secure)
    if secure:
        keys_file = run_dir / "keys"
        if not keys_file.exists():
            security.RunKeys.generate().save(keys_file)
        os.environ[security.ENV_KEYS_FILE] = str(keys_file.resolve())  # inherited by workers
    if threading.current_thread() is threading.main_thread():
        # A shell may start us with SIGINT ignored (background jobs); Ctrl+C must still stop.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # fork: the controller skips a fresh interpreter's imports, and a script's own classes stay
    # where the launching process has them. It holds no socket of ours; the controller's own
    # workers come from a forkserver (local.py), which never forks a thread-holding process.
    ctx = mp.get_context("fork")
    process = ctx.Process(
        target=_controller_entry,
        args=(config.to_dict(), str(run_dir), display, forwards_signals(), metrics_port),
        name="troupe-controller",
    )
    start_forked(process)  # a stop before its handlers are in waits for them
    launch_record.write(run_dir, launch_record.for_process("local", run_dir, process.pid))
    return process


def start(
    config: ExperimentConfig,
    run_dir: Path,
    *,
    launcher: str = "local",
    image: str | None = None,
    display: bool | None = None,
    secure: bool = False,
    metrics_port: int | None = None,
) -> BaseProcess:
    """Start a run with ``launcher`` and return the process to wait for (:func:`wait_local`):
    ``troupe run`` and ``troupe.train`` both start runs here.

    local: the controller process (:func:`start_local`). docker: a process running every role's
    container to the end (:func:`distributed.launch.docker_run.run_docker`), ``image`` the worker
    image (default: ``troupe image build``'s tag); CURVE is always on there, so ``secure`` is
    for local runs. Either process exits with the run's code and stops the run in order on
    SIGINT."""
    if launcher == "local":
        return start_local(config, run_dir, display, secure, metrics_port)
    if launcher != "docker":
        raise UserError(f"unknown launcher '{launcher}'; launchers are {', '.join(LAUNCHERS)}")
    from distributed.images.build import DEFAULT_TAG, connect
    from distributed.launch.docker_run import check_can_run

    image = image or DEFAULT_TAG
    client = connect()  # no engine, no image, a leftover run: said here, before any process
    try:
        check_can_run(client, image, run_dir)
    finally:
        client.close()
    run_folder.write_json(run_dir / run_folder.CONFIG, config.to_dict(), indent=2)
    process = mp.get_context("fork").Process(
        target=_docker_entry,
        args=(config.to_dict(), str(run_dir), image, display, forwards_signals(), metrics_port),
        name="troupe-docker",
    )
    start_forked(process)  # a stop before its handlers are in waits for them
    from distributed.launch.docker_run import run_name

    run = run_name(run_dir)
    launch_record.write(run_dir, launch_record.for_process("docker", run_dir, process.pid, run))
    return process


def wait_local(process: BaseProcess, timeout_s: float | None = None) -> int | None:
    """The run's exit code once it ends (None if ``timeout_s`` passes first). Meanwhile every
    SIGINT or SIGTERM this process gets goes on to the run (:mod:`.signals`)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with forwarding(process.pid):
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            process.join(left)
            if process.exitcode is not None:
                return process.exitcode
            if deadline is not None and time.monotonic() >= deadline:
                return None


def _controller_entry(
    config_dict: dict, run_dir: str, display: bool | None, own_group: bool, metrics_port: int | None
) -> None:
    interrupts = run_interrupts(defer=True)  # first: a stop during the imports is noted
    import sys
    import types

    # Forked from the launching program, which may be a user's script. multiprocessing would
    # run that script's top level again in every worker it starts (its "__mp_main__" fix-up);
    # workers get the user's code from the config instead (api.code), by import, so the
    # controller's __main__ is made an empty module.
    sys.modules["__main__"] = types.ModuleType("__main__")
    _forget_launchers_forkserver()
    own_process_group(own_group)  # signals come through the launcher (.signals)
    sys.exit(controller_main(config_dict, run_dir, display, metrics_port, interrupts))


def _forget_launchers_forkserver() -> None:
    """The launching program may have started multiprocessing's forkserver (its own code, or a
    test suite): forked from it, this process holds that server's handle, whose process is not
    its child, and starting the first worker would fail in ``os.waitpid`` (the run ending at
    once, with no summary). Forget it: the launching program keeps its server, and this process
    starts its own on first use. (The attributes are those ``ForkServer.__init__`` sets.)"""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        with contextlib.suppress(OSError):  # our copy would keep the launcher's server waiting
            os.close(server._forkserver_alive_fd)
    server._forkserver_address = server._forkserver_alive_fd = server._forkserver_pid = None
    server._inherited_fds = None
    server._lock = threading.Lock()  # a fork may have copied it held


def _docker_entry(
    config_dict: dict,
    run_dir: str,
    image: str,
    display: bool | None,
    own_group: bool,
    metrics_port: int | None,
) -> None:
    """Entry point of the process that runs a docker run's containers (see :func:`start`)."""
    interrupts = run_interrupts(defer=True)  # run_docker passes a stop on once it can
    import sys

    from distributed.launch.docker_run import run_docker

    own_process_group(own_group)
    config = ExperimentConfig.from_dict(config_dict)
    try:
        code = run_docker(
            config, Path(run_dir), image=image, display=display, metrics_port=metrics_port,
            interrupts=interrupts,
        )  # fmt: skip
    except UserError as e:  # checked before the fork; something changed since (a race)
        logger.error("%s", e)
        code = EXIT_FAILED
    sys.exit(code)
