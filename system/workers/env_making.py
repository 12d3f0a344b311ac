"""An actor's environments, made at once when one is slow to make.

A simulator that starts a process, loads assets or connects to a server can take minutes to
make. An actor made its environments one after another, so one of 125 s took 250 s to start
two and over half an hour to start sixteen, while the CPU idled. The first environment is made
alone: it is what fails with the clearest error, and it times the make. When it took
:data:`SLOW_MAKE_S` or more, the others are made on up to ``threads`` threads
(``actors.make_threads``); a quick one (CartPole, Atari) keeps the plain loop, with no thread.
Environments that must not be made from several threads set ``actors.make_threads=1``.

If a make fails, no other starts (a simulator that cannot start fails every make alike, and
the worker's error waited for all of them), the environments made are closed (a simulator's
process would otherwise outlive the worker's error) and the first error in environment order
is raised. A SIGTERM while they are made (the run stopped) closes what was made and kills what
the makes still running had started.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable

from api.environment import Environment
from system.processes import descendants

logger = logging.getLogger(__name__)

SLOW_MAKE_S = 1.0
"""A first environment that took this long to make has the others made at once."""


def make_environments(
    make: Callable[[int], Environment], n: int, threads: int, who: str
) -> list[Environment]:
    """Environments ``0..n-1`` by ``make``; made at once on up to ``threads`` threads when the
    first was slow to make. ``who``: the worker, for its log."""
    started = time.monotonic()
    first = make(0)
    took = time.monotonic() - started
    if n == 1 or threads <= 1 or took < SLOW_MAKE_S:
        return _one_after_another(make, first, n)
    at_once = min(threads, n - 1)
    logger.info(
        "%s: its first environment took %.1fs to make; making the other %d, %d at once",
        *(who, took, n - 1, at_once),
    )
    return _at_once(make, first, n, at_once)


def _one_after_another(
    make: Callable[[int], Environment], first: Environment, n: int
) -> list[Environment]:
    envs = [first]
    try:
        envs.extend(make(e) for e in range(1, n))
    except BaseException:
        close_all(envs)
        raise
    return envs


def _at_once(
    make: Callable[[int], Environment], first: Environment, n: int, threads: int
) -> list[Environment]:
    """Environments ``1..n-1`` made on ``threads`` daemon threads, which take the next index
    until none is left. Daemon threads, not a pool: a SIGTERM while they make (raised in the
    main thread, which waits) must let the process leave at once, where an executor's threads
    are joined at exit, a simulator's start-up later."""
    made: list[Environment | None] = [first] + [None] * (n - 1)
    errors: list[BaseException | None] = [None] * n
    indices = iter(range(1, n))
    lock, failed = threading.Lock(), threading.Event()

    def work() -> None:
        while not failed.is_set():
            with lock:
                e = next(indices, None)
            if e is None:
                return
            try:
                made[e] = make(e)
            except BaseException as error:  # raised in the main thread, in order
                errors[e] = error
                failed.set()

    workers = [
        threading.Thread(target=work, name=f"make-env-{i}", daemon=True) for i in range(threads)
    ]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    except BaseException:  # a SIGTERM while they make: what is made is closed, as on an error
        failed.set()
        close_all([env for env in made if env is not None])
        _kill_started()
        raise
    error = next((error for error in errors if error is not None), None)
    envs = [env for env in made if env is not None]
    if error is not None:
        close_all(envs)
        raise error
    return envs


def _kill_started() -> None:
    """SIGKILL what the makes still running have started (a simulator's process): they never
    return, as the process leaves now, so nothing would close it; it ran on, reparented. What
    was made is closed first, so only theirs are left below this process."""
    for pid in descendants(os.getpid()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def close_all(envs: list[Environment]) -> None:
    """Close each environment, best effort: the worker is going away with another error."""
    for env in envs:
        with contextlib.suppress(Exception):
            env.close()
