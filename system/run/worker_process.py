"""The main function of every worker process: connect, get configured, loop, report, stop.

The loop is the same for every role: poll the worker, send a heartbeat with its stats a few times
a second, leave when the controller says stop (or disappears), and on any exception send the
traceback to the controller before exiting with a non-zero code. What differs per role is only
how the worker is built (:data:`BUILDERS`), from the configuration the controller sends.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from api.config import ExperimentConfig
from system.parameters.client import ParameterClient
from system.parameters.service import ParameterServer
from system.parameters.store import ParameterStore
from system.run import builders
from system.run.control_channel import ControlClient
from system.streams import wire
from system.streams.inference import ZmqInferenceClient, ZmqInferenceServer
from system.streams.samples import ZmqSampleConsumer, ZmqSampleProducer
from system.workers.actor_worker import ActorWorker
from system.workers.base import Worker
from system.workers.policy_worker import PolicyWorker

logger = logging.getLogger(__name__)

HEARTBEAT_S = 0.25
STOP_CHECK_S = 0.05
EXIT_OK, EXIT_FAILED, EXIT_ORPHANED = 0, 1, 3


@dataclass
class Placement:
    """Where a worker binds and what address it advertises to its peers."""

    bind_host: str = "127.0.0.1"
    advertise_host: str = "127.0.0.1"

    def bind(self) -> str:
        return f"tcp://{self.bind_host}:*"

    def advertise(self, endpoint: str) -> str:
        port = endpoint.rsplit(":", 1)[1]
        return f"tcp://{self.advertise_host}:{port}"


class ParameterServiceWorker(Worker):
    """Wraps the parameter server as a worker, so it shares the loop and supervision."""

    role = "parameter_service"

    def __init__(self, worker_id: str, server: ParameterServer):
        super().__init__(worker_id)
        self.server = server

    def poll(self) -> int:
        return self.server.poll(timeout_ms=50)

    def collect_stats(self) -> dict[str, Any]:
        stats = {k: int(v) for k, v in self.server.stats.items()}
        return stats

    def close(self) -> None:
        self.server.close()


def _build_parameter_service(ctl: ControlClient, cfg: ExperimentConfig, conf: dict, place):
    run_dir = Path(conf["run_dir"])
    store = ParameterStore(run_dir, keep=3)
    restored = store.load_from_disk()
    if restored:
        logger.info("parameter service restored versions %s", restored)
    server = ParameterServer(store, place.bind(), place.bind())
    ctl.register("params/request", place.advertise(server.request_endpoint))
    ctl.register("params/push", place.advertise(server.push_endpoint))
    return ParameterServiceWorker(ctl.worker_id, server), None


def _build_trainer(ctl: ControlClient, cfg: ExperimentConfig, conf: dict, place):
    import torch  # only trainers and policy workers pay for importing torch

    from system.workers.trainer_worker import TrainerWorker

    name, index = conf["args"]["policy"], conf["args"]["index"]
    torch.set_num_threads(max(1, int(conf["args"].get("threads", 1))))
    spaces = builders.probe_spaces(cfg)
    policy = builders.make_policy(cfg, name, spaces, cfg.seed)
    trainer = builders.make_trainer(cfg, name, policy)
    params = ParameterClient(ctl.lookup("params/request"))
    consumer = ZmqSampleConsumer(place.bind())
    ctl.register(f"samples/{name}/{index}", place.advertise(consumer.endpoint))
    worker = TrainerWorker(
        ctl.worker_id,
        name,
        trainer,
        consumer,
        params,
        batch_segments=cfg.policies[name].batch_segments,
        checkpoint_every=cfg.checkpoint_every,
        checkpoint_dir=Path(conf["run_dir"]) / "checkpoints",
        max_policy_lag=cfg.policies[name].max_policy_lag,
    )
    latest = _latest(params, name)
    if latest is not None:  # resuming, or restarted after a failure
        worker.restore(latest[1])
        worker.mark_published()
    return worker, None


def _latest(params: ParameterClient, name: str):
    from system.parameters.store import ParameterNotFoundError

    try:
        return params.get(name)
    except ParameterNotFoundError:
        return None


def _build_policy_worker(ctl: ControlClient, cfg: ExperimentConfig, conf: dict, place):
    import torch

    name, index = conf["args"]["policy"], conf["args"]["index"]
    torch.set_num_threads(1)
    spaces = builders.probe_spaces(cfg)
    policy = builders.make_policy(cfg, name, spaces, cfg.seed + 1)
    params = ParameterClient(
        ctl.lookup("params/request"), ctl.lookup("params/push"), subscribe=[name]
    )
    if cfg.policies[name].trainer.type:
        _, checkpoint = _wait_first_version(params, name)
        policy.load_checkpoint(checkpoint)
    server = ZmqInferenceServer(place.bind())
    ctl.register(f"inference/{name}/{index}", place.advertise(server.endpoint))
    return PolicyWorker(ctl.worker_id, name, policy, server, params), None


def _wait_first_version(params: ParameterClient, name: str, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while True:
        latest = _latest(params, name)
        if latest is not None:
            return latest
        if time.monotonic() > deadline:
            raise TimeoutError(f"no parameters of policy '{name}' were published in {timeout_s}s")
        time.sleep(0.1)


def _build_actor(ctl: ControlClient, cfg: ExperimentConfig, conf: dict, place):
    args = conf["args"]
    index, evaluation = int(args["index"]), bool(args.get("evaluation", False))
    inference_names = {
        name: f"inference/{name}/{index % pc.policy_workers}" for name, pc in cfg.policies.items()
    }
    sample_names = {
        name: [f"samples/{name}/{i}" for i in range(pc.trainer_workers)]
        for name, pc in cfg.policies.items()
        if pc.trainer.type and not evaluation
    }
    inference = ZmqInferenceClient({p: ctl.lookup(n) for p, n in inference_names.items()})
    samples = None
    if not evaluation:
        samples = ZmqSampleProducer(
            {p: [ctl.lookup(n) for n in names] for p, names in sample_names.items()}
        )
    group = cfg.evaluation if evaluation else cfg.actors
    worker = ActorWorker(
        ctl.worker_id,
        builders.env_factory(cfg),
        group.envs_per_worker,
        cfg.policy_of_agent,
        inference,
        samples,
        segment_length=cfg.actors.segment_length,
        is_evaluation=evaluation,
        seed=cfg.seed * 100_003 + (index + (1000 if evaluation else 0)) * 1_009,
        on_env_error=cfg.actors.on_env_error,
        # Evaluation is not in a hurry: one request a step for all its environments is cheaper.
        groups=1 if evaluation else cfg.actors.groups,
        max_fps=cfg.evaluation.max_fps if evaluation else None,
    )
    return worker, ActorPeerWatchdog(ctl, worker, inference_names, sample_names)


class ActorPeerWatchdog:
    """Reconnects an actor to peers that were restarted elsewhere (new addresses).

    A request that no policy worker answers for ``STALL_S`` seconds, or a sample backlog that
    does not drain for as long, means the peer may have been restarted: look its name up again,
    reconnect (the sample stream only if a trainer's address changed), and send the unanswered
    requests again.
    """

    STALL_S = 5.0

    def __init__(self, ctl: ControlClient, worker: ActorWorker, inference_names, sample_names):
        self.ctl = ctl
        self.worker = worker
        self.inference_names = inference_names
        self.sample_names = sample_names
        self.backlogged_since: float | None = None

    def __call__(self) -> None:
        stalled = self.worker.stalled_policies(self.STALL_S)
        if stalled:
            logger.warning("%s: no answer from %s; reconnecting", self.ctl.worker_id, stalled)
            for policy in stalled:
                self.worker.inference.connect(policy, self.ctl.lookup(self.inference_names[policy]))
            self.worker.repost(stalled)
        samples = self.worker.samples
        if samples is None or not samples.backlogged:
            self.backlogged_since = None
            return
        now = time.monotonic()
        if self.backlogged_since is None:
            self.backlogged_since = now
        elif now - self.backlogged_since > self.STALL_S:
            # A slow trainer also leaves actors backlogged: reconnect only to trainers that moved
            # (reconnecting drops what the old socket still held).
            self.backlogged_since = None
            for policy, names in self.sample_names.items():
                addresses = [self.ctl.lookup(n) for n in names]
                if addresses != samples.addresses.get(policy):
                    logger.warning("%s: trainers of '%s' moved; reconnecting", self.ctl.worker_id,
                                   policy)  # fmt: skip
                    samples.connect(policy, addresses)


BUILDERS = {
    "parameter_service": _build_parameter_service,
    "trainer": _build_trainer,
    "policy": _build_policy_worker,
    "actor": _build_actor,
}


def main(worker_id: str, role: str, controller: str, placement: dict | None = None) -> int:
    """Run one worker until stopped; the process's exit code is the return value."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the controller's to handle
    signal.signal(signal.SIGTERM, _raise_stop)
    logging.basicConfig(
        level=os.environ.get("TROUPE_LOG_LEVEL", "WARNING"),
        format=f"%(asctime)s {worker_id} %(levelname)s %(name)s: %(message)s",
    )
    place = Placement(**(placement or {}))
    wire.secure_from_environment()  # cluster runs: CURVE on every socket
    ctl = ControlClient(controller, worker_id)
    worker: Worker | None = None
    try:
        conf = ctl.hello(role)
        cfg = ExperimentConfig.from_dict(conf["config"])
        worker, watchdog = BUILDERS[role](ctl, cfg, conf, place)
        ctl.send("ready", {})
        return _loop(ctl, worker, watchdog)
    except _Stop:
        return EXIT_OK
    except Exception as e:
        message = f"{type(e).__name__}: {e}"
        ctl.send("error", {"message": message, "traceback": traceback.format_exc()})
        return EXIT_FAILED
    finally:
        if worker is not None:
            _close(worker)
        ctl.close()


def _loop(ctl: ControlClient, worker: Worker, watchdog) -> int:
    parent = os.getppid()
    next_beat = next_check = 0.0
    while True:
        worker.poll()
        now = time.monotonic()
        if now < next_check:
            continue
        # Stop requests are looked for more often than heartbeats go out: a run stops role by
        # role, so each wait for a worker's bye adds to the time the command takes to return.
        next_check = now + STOP_CHECK_S
        if now >= next_beat:
            next_beat = now + HEARTBEAT_S
            ctl.send("heartbeat", {"stats": _with_memory(worker.collect_stats())})
            _mark_alive()
            if watchdog is not None:
                watchdog()
        if ctl.stop_requested():
            worker.on_stop()
            ctl.send("heartbeat", {"stats": worker.collect_stats()})
            ctl.send("bye", {})
            return EXIT_OK
        if os.getppid() != parent:
            logger.error("controller process is gone; %s exits", ctl.worker_id)
            return EXIT_ORPHANED


def _mark_alive() -> None:
    """Touch ``$TROUPE_HEARTBEAT_FILE``, when set, with every heartbeat: a cluster's liveness
    probe checks its age, so a worker whose loop hangs is restarted (distributed/deploy/k8s.py)."""
    path = os.environ.get("TROUPE_HEARTBEAT_FILE")
    if path:
        with open(path, "a"):
            os.utime(path)


def _with_memory(stats: dict[str, Any]) -> dict[str, Any]:
    """Add this process's peak resident memory (MiB), for the run's per-role memory figures."""
    stats["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return stats


def _close(worker: Worker) -> None:
    try:
        worker.close()
    except Exception:  # closing is best effort at exit
        logger.debug("closing %s raised", worker.worker_id, exc_info=True)


class _Stop(Exception):
    pass


def _raise_stop(signum, frame):
    raise _Stop()


if __name__ == "__main__":  # for launchers that start workers as commands (containers)
    import argparse

    parser = argparse.ArgumentParser(description="Run one Troupe worker process.")
    parser.add_argument("--id", required=True)
    parser.add_argument("--role", required=True, choices=sorted(BUILDERS))
    parser.add_argument("--controller", required=True)
    parser.add_argument("--bind-host", default="127.0.0.1")
    parser.add_argument("--advertise-host", default="127.0.0.1")
    a = parser.parse_args()
    place = {"bind_host": a.bind_host, "advertise_host": a.advertise_host}
    sys.exit(main(a.id, a.role, a.controller, place))
