"""``troupe run``: resolve the experiment, make the run folder, run the controller apart.

The command's own process only waits: the controller process starts every worker (as its
children, through the launcher) and writes the run folder. Ctrl+C reaches the whole process group;
workers ignore it and the controller turns it into an orderly stop, so the command waits for that
stop to finish, then exits with the controller's code.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

from api.config import ExperimentConfig, check, make_experiment
from api.errors import RunFolderError, UserError

logger = logging.getLogger(__name__)

EXIT_SOLVED_OR_DONE, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


def default_run_dir(experiment: str) -> Path:
    return Path("runs") / f"{experiment}-{time.strftime('%Y%m%d-%H%M%S')}"


def prepare(
    experiment: str | None, overrides: list[str], run_dir: str | None, resume: str | None
) -> tuple[ExperimentConfig, Path]:
    """The checked config and the run folder (a new one, or the one being resumed)."""
    if resume:
        folder = Path(resume)
        config_file = folder / "config.json"
        if not config_file.exists():
            raise UserError(f"{folder} is not a run folder: it has no config.json")
        config = ExperimentConfig.from_dict(json.loads(config_file.read_text()))
        if overrides:
            from api.config import apply_overrides

            config = apply_overrides(config, overrides)
        _check_writable(folder)
        return check(config), folder
    if not experiment:
        raise UserError("name an experiment (troupe list shows them) or pass --resume RUN_DIR")
    config = make_experiment(experiment, overrides)
    folder = Path(run_dir) if run_dir else default_run_dir(config.name)
    if folder.exists() and any(folder.iterdir()):
        raise UserError(f"run folder {folder} is not empty; pick another --run-dir or --resume it")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunFolderError.from_os_error(folder, e) from e
    _check_writable(folder)
    return config, folder


def _check_writable(folder: Path) -> None:
    """Fail before any process starts if the run folder cannot be written (read-only mount,
    permissions, a full disk): a message now, not a traceback from the controller later."""
    probe = folder / f".troupe-write-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"x" * 4096)
    except OSError as e:
        raise RunFolderError.from_os_error(folder, e) from e
    finally:
        probe.unlink(missing_ok=True)


def controller_main(config_dict: dict, run_dir: str, display: bool | None) -> int:
    """Entry point of the controller process."""
    from distributed.launch.local import LocalLauncher
    from system.run.controller import Controller
    from system.streams import wire

    logging.basicConfig(
        level=os.environ.get("TROUPE_LOG_LEVEL", "WARNING"),
        format="%(asctime)s controller %(levelname)s %(name)s: %(message)s",
    )
    config = ExperimentConfig.from_dict(config_dict)
    wire.secure_from_environment()
    controller = Controller(config, Path(run_dir), LocalLauncher(), display=display)
    summary = controller.run()
    if summary.get("stop_reason") == "failed":
        return EXIT_FAILED
    if summary.get("stop_reason") == "interrupted":
        return EXIT_INTERRUPTED
    return EXIT_SOLVED_OR_DONE


def run_local(
    config: ExperimentConfig, run_dir: Path, display: bool | None = None, secure: bool = False
) -> int:
    """Run the controller process to the end; return its exit code.

    ``secure``: make CURVE keys for this run (``run_dir/keys``, owner-only) and use them on every
    socket, as cluster runs always do.
    """
    if secure:
        from system.streams.security import ENV_KEYS_FILE, RunKeys

        keys_file = run_dir / "keys"
        if not keys_file.exists():
            RunKeys.generate().save(keys_file)
        os.environ[ENV_KEYS_FILE] = str(keys_file.resolve())  # inherited by every worker
    # A shell may start us with SIGINT ignored (background jobs); Ctrl+C must still stop the run.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # fork: this process holds no thread or socket yet, and a forked controller skips a fresh
    # interpreter's imports. The controller's own workers come from a forkserver (local.py).
    ctx = mp.get_context("fork")
    process = ctx.Process(
        target=_controller_entry,
        args=(config.to_dict(), str(run_dir), display),
        name="troupe-controller",
    )
    process.start()
    while True:
        try:
            process.join()
            return process.exitcode if process.exitcode is not None else EXIT_FAILED
        except KeyboardInterrupt:
            # The controller got the same SIGINT and is stopping the run; wait for it.
            continue


def _interrupt(signum, frame):
    raise KeyboardInterrupt()


def _controller_entry(config_dict: dict, run_dir: str, display: bool | None) -> None:
    import sys

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    sys.exit(controller_main(config_dict, run_dir, display))
