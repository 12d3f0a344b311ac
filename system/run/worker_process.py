"""The main function of every worker process: connect, get configured, loop, report, stop.

The loop is the same for every role: poll the worker, send a heartbeat with its stats a few times
a second, leave when the controller says stop (or disappears), and on any exception send the
traceback to the controller before exiting with a non-zero code. What differs per role is only
how the worker is built: by the role's builder (:mod:`system.run.builders`) from the typed plan
the controller sends, wired to its peers through sockets (:class:`SocketWiring`).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from threadpoolctl import threadpool_limits

from api import global_state
from api.code import load_code
from api.config import ExperimentConfig
from api.errors import ConfigError, EnvironmentCheckError, RegistryError, UserError
from api.user_code import OWN_CODE
from system import logs
from system.errors import CallbackError, ControllerGoneError, TrainerContractError
from system.run import builders, busy_heartbeat, launch_end, term_signal, worker_arguments
from system.run import control_protocol as cp
from system.run.busy_heartbeat import BusyHeartbeat, mark_alive, stage_seconds, with_memory
from system.run.control_channel import HEARTBEAT_S, ControlClient, StopRequested
from system.run.coordination.coordinator import follow_coordination
from system.run.peer_watch import ActorPeerWatchdog, ParameterServiceWatch, ReplayWorkerWatch
from system.run.plan import Peers, plan_from_wire
from system.run.shape import RunShape
from system.run.socket_wiring import BuildStopped, Placement, SocketWiring
from system.run.term_signal import EXIT_TERMINATED, Terminated, TermSignal
from system.run.worker_arguments import WorkerLaunchArgs
from system.streams import transport
from system.timing import CONTROL
from system.workers.base import Worker

logger = logging.getLogger(__name__)

STOP_CHECK_S = 0.05
EXIT_OK, EXIT_FAILED, EXIT_ORPHANED = 0, 1, 3


def _build(
    ctl: ControlClient, role: str, cfg: ExperimentConfig, conf: cp.Configure, place: Placement
):
    load_code(cfg.code)  # first: a role defined outside Troupe is defined there
    plan = plan_from_wire(role, conf.plan)
    # numpy's BLAS (OpenBLAS) starts a thread per core, which spin while they wait: a policy
    # worker acting through numpy (algorithm.modules.numpy_inference) on a 2-core machine used
    # 4.5x the CPU a frame it uses on one thread. Every worker computes on one thread, as torch.
    threadpool_limits(limits=1, user_api="blas")
    if plan.needs_torch:
        import torch  # only the roles that run a network pay for importing torch

        torch.set_num_threads(plan.torch_threads(cfg))
    shape = None if conf.shape is None else RunShape.from_wire(conf.shape)
    wiring = SocketWiring(ctl, place, Path(conf.run_dir), cfg, shape)
    built = builders.build(plan, cfg, wiring)
    built.heartbeat_hooks = [
        *follow_coordination(ctl.state, plan, cfg, built.worker),
        *_watch_peers(ctl, wiring, plan.peers(cfg), built.worker),
        *built.heartbeat_hooks,
    ]
    return built


def _watch_peers(
    ctl: ControlClient, wiring: SocketWiring, peers: Peers, worker: Any
) -> list[Callable[[], None]]:
    """The heartbeat hooks that follow the peers a worker looks up to their new addresses when
    the controller restarts them (system.run.peer_watch): its replay worker first, then the
    parameter service, then (an actor) its policy workers and trainers."""
    watches: list[Callable[[], None]] = []
    if peers.replay_batches:
        watches.append(ReplayWorkerWatch(ctl, worker.source.stream, peers.replay_batches))
    if peers.parameters is not None:
        subscribe = peers.parameters
        new_client = lambda: wiring.parameter_client(subscribe)  # noqa: E731
        watches.append(ParameterServiceWatch(ctl, worker, new_client))
    if peers.inference:  # an inference client: also follows the trainers it sends samples to
        watches.append(ActorPeerWatchdog(ctl, worker, peers.inference, peers.samples))
    return watches


def main(
    worker_id: str,
    role: str,
    controller: str,
    placement: dict | None = None,
    controller_pid: int | None = None,
    controller_wait_s: float | None = None,
) -> int:
    """Run one worker until stopped; the process's exit code is the return value.

    ``controller_pid``: the controller's process, when it runs on this machine (local runs).
    ``controller_wait_s``: how long to wait for a controller that never answered (a minute)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the controller's to handle
    term = TermSignal()
    term.install()
    logs.configure_process(worker_id)
    place = Placement(**(placement or {}))
    try:
        transport.secure_from_environment()  # cluster runs: CURVE on every socket
    except UserError as e:  # fail closed, in one line: never plain sockets instead
        logger.error("%s", e)
        return EXIT_FAILED
    if (launch := launch_end.WorkerLaunch(worker_id)).ended_before_start():  # Swarm restarts
        return EXIT_OK
    ctl = ControlClient(
        controller, worker_id, controller_pid=controller_pid, first_contact_s=controller_wait_s
    )
    worker: Worker | None = None
    try:
        with term.building():  # a SIGTERM here leaves at once; anywhere else it is noted
            conf = ctl.hello(role)
            logs.keep_in_run_folder(conf.run_dir, worker_id)
            logger.info(
                "%s (%s, pid %d) configured by %s", worker_id, role, os.getpid(), controller
            )
            global_state.install(ctl.state)  # user code in this process reads the run's state
            cfg = ExperimentConfig.from_dict(conf.config)
            ctl.lookup_timeout_s = max(ctl.timeout_s, cfg.liveness.max_build_s)  # peers build
            max_build = ("liveness.max_build_s", cfg.liveness.max_build_s)
            with busy_heartbeat.building(ctl, max_build):
                built = _build(ctl, role, cfg, conf, place)
        worker = built.worker
        ctl.send(cp.Ready())
        logger.info("%s ready", worker_id)
        max_poll = cfg.liveness.bound(role)
        return _loop(ctl, worker, built.heartbeat_hooks, max_poll, term, max_build)
    except (BuildStopped, StopRequested):
        ctl.send(cp.Bye())  # the controller's stop, while being built or in the loop
        return EXIT_OK
    except Terminated:  # the controller's, to a worker building at the stop, or someone else's
        return term_signal.leave(ctl)
    except ControllerGoneError as e:
        if launch.ended_while_waiting(heard=ctl.heard) or launch.controller_spent(ctl.heard):
            return EXIT_OK
        logger.error("%s", e)  # nobody to report to
        return EXIT_ORPHANED
    except Exception as e:
        message = f"{type(e).__name__}: {e}"
        tb = traceback.format_exc()
        logger.info("failed: %s\n%s", message, tb)  # its log file (the console shows warnings)
        shown = "" if said_in_full(e) else tb
        ctl.send(cp.Error(message, shown, type(e).__name__, fatal(e, built=worker is not None)))
        return EXIT_FAILED
    finally:
        if worker is not None:
            _close(worker)
        ctl.close()
        _flush_sockets()


def said_in_full(e: BaseException) -> bool:
    """Whether ``e`` is a user error that Troupe's own checks raised (every frame of its
    traceback, and of what it was raised from or during, in Troupe's code): its message says
    what is wrong and where (an observation that does not fit its space, with the environment,
    agent and step), and the 30 lines of traceback the controller showed with it pointed only
    into the runtime. One raised from the user's code (an environment's step that raised) is
    shown with its traceback. The worker's own log keeps every one."""
    if not isinstance(e, UserError):
        return False
    chain: list[BaseException] = []
    at: BaseException | None = e
    while at is not None and at not in chain:
        chain.append(at)
        at = at.__cause__ or at.__context__
    frames = [f for link in chain for f in traceback.extract_tb(link.__traceback__)]
    return bool(frames) and all(f.filename.startswith(OWN_CODE) for f in frames)


def fatal(e: Exception, built: bool) -> bool:
    """Whether ``e`` fails the same way in every restart, so that the controller ends the run
    with its message instead of restarting the worker: an unknown name, a bad argument, an
    environment that declares its spaces wrongly. Before the worker exists (``built``), a
    ValueError or TypeError is a constructor refusing its arguments, and an import that failed
    is a package missing from this machine or image (``PettingZoo environments need the
    'pettingzoo' package``), which a restart does not install: it was restarted five times."""
    if isinstance(e, (RegistryError, ConfigError, CallbackError, EnvironmentCheckError,
                      TrainerContractError)):  # fmt: skip
        return True
    return not built and (isinstance(e, (ValueError, TypeError)) or import_failed(e))


def import_failed(e: BaseException | None) -> bool:
    """Whether ``e`` is, or was raised ``from``, an ImportError (or gymnasium's
    ``DependencyNotInstalled``). Only an explicit cause counts: an error raised later in an
    ``except ImportError:`` block's fallback (a connection refused) is no missing package."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, ImportError) or type(e).__name__ == "DependencyNotInstalled":
            return True
        seen.add(id(e))
        e = e.__cause__
    return False


def _flush_sockets(linger_ms: int = 1000) -> None:
    """Deliver what is still queued (the bye, an error report) before the process exits.

    Closing a socket only hands its messages to ZeroMQ's I/O thread; a process that then exits
    without terminating its context kills that thread with them, and the controller would never
    hear that this worker stopped. Terminating waits for them, at most ``linger_ms``.
    """
    from system.streams import security

    security.shutdown()  # its ZAP thread owns sockets of this context
    transport.context().destroy(linger=linger_ms)


Bound = tuple[str, float]


def _loop(ctl: ControlClient, worker: Worker, hooks, max_poll: Bound,
          term: TermSignal | None = None, max_build: Bound | None = None) -> int:  # fmt: skip
    """Poll until stopped; ``hooks`` run with every heartbeat (and once more at the stop).
    ``max_poll``: one poll's bound (:meth:`api.config.LivenessConfig.bound`); ``max_build``:
    a build's within a poll (``liveness.max_build_s``). ``term``: the process's SIGTERM handler
    (None: no signal is handled here)."""
    term = term or TermSignal()
    ctl.looping = True
    beat = term.on_beat(ctl, mark_alive)  # in a long poll: a SIGTERM is told now, not after it
    busy = BusyHeartbeat(ctl, max_poll, on_beat=beat, stats=lambda: stage_seconds(worker))
    if max_build is not None:
        worker.building = lambda: busy.building(max_build)
    try:
        return _polls(ctl, worker, list(hooks or ()), busy, term)
    finally:
        busy.stop()


def _polls(
    ctl: ControlClient, worker: Worker, hooks: list, busy: BusyHeartbeat, term: TermSignal
) -> int:
    next_beat = next_check = 0.0
    clock = worker.stages
    while True:
        with busy:  # a poll that runs long (a trainer step) still sends heartbeats
            worker.poll()
        if busy.reported:  # the controller took it for hung and restarts this worker
            logger.error("the poll taken for hung returned after all; leaving")
            return EXIT_FAILED
        clock.enter(CONTROL)
        now = time.monotonic()
        if now < next_check:
            continue
        # Stop requests are looked for more often than heartbeats go out: a run stops role by
        # role, so each wait for a worker's bye adds to the time the command takes to return.
        next_check = now + STOP_CHECK_S
        if now >= next_beat:
            next_beat = now + HEARTBEAT_S
            ctl.heartbeat(with_memory(_timed(worker)))
            mark_alive()
            for hook in hooks:
                hook()
        term.check(ctl, now)  # a SIGTERM noted: the controller is told, and its stop awaited
        if ctl.stop_requested():
            if ctl.leave_requested():  # a trainer rank signalled alone: its group restarts
                raise Terminated()
            for hook in hooks:  # a peer restarted elsewhere gets the last words there
                hook()
            with busy.unbounded():  # a long last save still beats, and is waited for
                worker.on_stop()
            ctl.heartbeat(_timed(worker))
            ctl.send(cp.Bye())
            logger.info("stopped by the controller")
            # signalled and stopped alone: to be started again (a Kubernetes Job counts 0 as
            # its index done); stopped by the run's stop: done, whatever signal came
            return EXIT_TERMINATED if term.at is not None and ctl.stopped_alone() else EXIT_OK
        ctl.check_controller()


def _timed(worker: Worker) -> dict[str, Any]:
    """The worker's stats and where its time went since the last heartbeat (stage seconds)."""
    return {**worker.collect_stats(), **stage_seconds(worker)}


def _close(worker: Worker) -> None:
    try:
        worker.close()
    except Exception:  # closing is best effort at exit
        logger.debug("closing %s raised", worker.worker_id, exc_info=True)


def run(launch: WorkerLaunchArgs) -> int:
    """:func:`main` from a command line's checked arguments (``troupe worker`` and this module's
    own, which are the same: :mod:`system.run.worker_arguments`)."""
    return main(
        launch.worker_id,
        launch.role,
        launch.controller,
        launch.placement,
        controller_wait_s=launch.controller_wait_s,
    )


def _command_line(argv: list[str] | None = None) -> int:
    """``python -m system.run.worker_process``: for an image whose entrypoint is replaced; the
    arguments, checks and exit codes of ``troupe worker`` (a refusal: one line, exit 1)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m system.run.worker_process",
        description="Run one Troupe worker process (as `troupe worker` does).",
    )
    worker_arguments.add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(message)s")  # a refusal's warning, before main
    try:
        launch = worker_arguments.checked(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    return run(launch)


if __name__ == "__main__":  # for launchers that start workers as commands (containers)
    sys.exit(_command_line())
