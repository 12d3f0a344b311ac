"""Round-trip benchmarks for ``troupe bench``: inference latency and weight-push latency.

Both start the runtime's real classes in separate processes, wired by hand (no controller):

- ``latency``: one process runs :class:`system.workers.policy_worker.PolicyWorker` (a
  :class:`ZmqInferenceServer`, cartpole-ppo's actor-critic policy, the worker's default batching)
  and the bench process is the actor, sending :class:`RolloutRequest` batches through
  :class:`ZmqInferenceClient` and timing each round trip.
- ``push``: one process runs :class:`ParameterServer`, ``k`` processes each hold a subscribed
  :class:`ParameterClient` and a torch module and report, on the system-wide monotonic clock,
  when ``poll_latest`` handed them each new version and when it was loaded into the module; the
  bench process publishes and takes the slowest arrival. Run once with the service's shared
  memory (what a local run uses) and once without (the socket, as across hosts or containers).

Child processes are spawned (never forked), are daemons of the bench process, and stop when
told; every wait has a deadline.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from contextlib import ExitStack
from typing import Any

import numpy as np
import zmq

from system.errors import PeerTimeoutError

START_TIMEOUT_S = 120.0
REPLY_TIMEOUT_S = 10.0


# --------------------------------------------------------------------- inference latency
def _policy_worker_main(out: Any, stop: Any, report: Any) -> None:
    """Child: a policy worker for cartpole-ppo's policy, answering on a fresh loopback port."""
    import torch

    from api.config import make_experiment
    from system.run import builders
    from system.streams.inference import ZmqInferenceServer
    from system.workers.policy_worker import PolicyWorker

    torch.set_num_threads(1)  # as worker_process sets it for policy workers
    config = make_experiment("cartpole-ppo")
    policy = builders.make_policy(config, "default", builders.probe_spaces(config), seed=1)
    server = ZmqInferenceServer("tcp://127.0.0.1:*")
    worker = PolicyWorker("policy/bench/0", "default", policy, server, None)
    out.put({"endpoint": server.endpoint, "max_wait_ms": worker.max_wait_ms})
    try:
        while not stop.is_set():
            worker.poll()
            if report.is_set():
                report.clear()
                out.put(worker.collect_stats())
    finally:
        worker.close()


def _request(rows: int, seq: int) -> Any:
    from api.policy import RolloutRequest

    rng = np.random.default_rng(seq)
    return RolloutRequest(
        obs=rng.standard_normal((rows, 4), dtype=np.float32),
        is_evaluation=np.zeros((rows, 1), dtype=np.bool_),
        on_reset=np.zeros((rows, 1), dtype=np.bool_),
        client_id=np.arange(rows, dtype=np.int64).reshape(rows, 1),
        request_id=np.full((rows, 1), seq, dtype=np.int64),
    )


def _round_trip(client: Any, request: Any, seq: int) -> float:
    """Seconds from posting ``request`` to receiving its answer."""
    started = time.perf_counter()
    client.post("default", 0, seq, request)
    deadline = started + REPLY_TIMEOUT_S
    while time.perf_counter() < deadline:
        for reply in client.poll(timeout_ms=100):
            if reply.seq == seq:
                return time.perf_counter() - started
    raise PeerTimeoutError(f"the policy worker did not answer request {seq} in {REPLY_TIMEOUT_S}s")


def inference_latency(
    batch_sizes: tuple[int, ...], requests: int, clients: int, client_rows: int
) -> dict[str, Any]:
    """p50/p99 round trips per batch size, then batches realised with ``clients`` at once."""
    from system.streams.inference import ZmqInferenceClient

    ctx = mp.get_context("spawn")
    out, stop, report = ctx.Queue(), ctx.Event(), ctx.Event()
    child = ctx.Process(target=_policy_worker_main, args=(out, stop, report), daemon=True)
    child.start()
    with ExitStack() as cleanup:
        cleanup.callback(_end, child, stop)
        hello = _get(out, START_TIMEOUT_S, "the policy worker process did not start", child)
        result: dict[str, Any] = {"max_wait_ms": hello["max_wait_ms"], "batches": {}}
        client = ZmqInferenceClient({"default": hello["endpoint"]})
        cleanup.callback(client.close)
        seq = 0
        for rows in batch_sizes:
            times = []
            for i in range(requests + max(5, requests // 10)):  # the first ones warm up
                seq += 1
                seconds = _round_trip(client, _request(rows, seq), seq)
                if i >= max(5, requests // 10):
                    times.append(seconds * 1000.0)
            result["batches"][str(rows)] = _percentiles(times, "ms")
        result["concurrent"] = _concurrent(
            hello["endpoint"], out, report, requests, clients, client_rows
        )
    return result


def _concurrent(
    endpoint: str, out: Any, report: Any, requests: int, clients: int, rows: int
) -> dict[str, Any]:
    """``clients`` actors, each keeping one request of ``rows`` rows in flight, in one thread
    (one poller over their sockets, so no client waits on another's empty socket)."""
    from system.streams.inference import ZmqInferenceClient

    report.set()
    _get(out, REPLY_TIMEOUT_S, "the policy worker did not report its stats")  # resets counters
    actors = [ZmqInferenceClient({"default": endpoint}) for _ in range(clients)]
    try:
        posted: dict[int, float] = {}
        seqs = [0] * clients
        times: list[float] = []
        prepared = [_request(rows, c) for c in range(clients)]
        poller = zmq.Poller()
        for actor in actors:
            poller.register(actor.sockets["default"], zmq.POLLIN)
        for c, actor in enumerate(actors):
            seqs[c] = 1
            posted[c] = time.perf_counter()
            actor.post("default", c, 1, prepared[c])
        deadline = time.perf_counter() + REPLY_TIMEOUT_S + requests * 0.05
        while len(times) < requests and time.perf_counter() < deadline:
            ready = dict(poller.poll(100))
            for c, actor in enumerate(actors):
                if actor.sockets["default"] not in ready:
                    continue
                for reply in actor.poll(timeout_ms=0):
                    if reply.seq != seqs[c]:
                        continue
                    now = time.perf_counter()
                    times.append((now - posted[c]) * 1000.0)
                    seqs[c] += 1
                    posted[c] = now
                    actor.post("default", c, seqs[c], prepared[c])
        report.set()
        stats = _get(out, REPLY_TIMEOUT_S, "the policy worker did not report its stats")
    finally:
        for actor in actors:
            actor.close()
    batches = max(1, int(stats.get("batches", 0)))
    return {
        "clients": clients,
        "rows_per_request": rows,
        "answered": len(times),
        "mean_rows_per_batch": stats.get("rows", 0) / batches,
        "mean_requests_per_batch": stats.get("requests", 0) / batches,
        **_percentiles(times, "ms"),
    }


# --------------------------------------------------------------------- weight push
PUSH_POLICY = "bench"


def _parameter_server_main(out: Any, stop: Any, subscribers: int, shm: bool) -> None:
    """Child: the parameter server, in memory (``shm``: with its shared memory, else none); says
    when ``subscribers`` have subscribed to the kind of push they will use."""
    from system.parameters.service import AUTO, ParameterServer
    from system.parameters.store import ParameterStore

    server = ParameterServer(ParameterStore(keep=2), shm_dir=AUTO if shm else None)
    local = server.shm is not None
    out.put({"request": server.request_endpoint, "push": server.push_endpoint, "shm": local})
    announced = False
    try:
        while not stop.is_set():
            server.poll(timeout_ms=20)
            # Subscribers add shared-memory notices once hello is answered: wait for that.
            if not announced and server.subscriber_count(PUSH_POLICY, shm=local) >= subscribers:
                announced = True
                out.put("subscribed")
    finally:
        server.close()


def _subscriber_main(index: int, request: str, push: str, size: int, out: Any, stop: Any) -> None:
    """Child: a policy worker's parameter client and a ``size``-parameter torch module; reports
    when each version was handed out by ``poll_latest`` and when it was loaded into the module
    (as a policy's ``load_checkpoint`` does: ``load_state_dict`` of the arrays as tensors)."""
    import torch

    from system.parameters.client import ParameterClient

    torch.set_num_threads(1)  # as worker_process sets it for policy workers
    module = torch.nn.Module()
    module.w = torch.nn.Parameter(torch.zeros(size))
    client = ParameterClient(request, push, subscribe=[PUSH_POLICY])
    try:
        while not stop.is_set():
            latest = client.poll_latest(PUSH_POLICY, timeout_s=0.1)
            if latest is None:
                continue
            received = time.monotonic()
            version, checkpoint = latest
            weights = checkpoint["model"]["w"]
            if tuple(module.w.shape) != weights.shape:  # the next model size: once
                module.w = torch.nn.Parameter(torch.zeros(weights.shape))
            module.load_state_dict({k: torch.as_tensor(v) for k, v in checkpoint["model"].items()})
            loaded = time.monotonic()
            first = float(module.w.detach()[0])
            if first != version:
                raise RuntimeError(f"version {version} loaded {first} as its first weight")
            del latest, checkpoint, weights  # as a policy worker drops the checkpoint it loaded
            out.put((index, version, received, loaded))
    finally:
        client.close()


def push_latency(
    sizes: tuple[int, ...], publishes: int, subscribers: int, *, shm: bool = True
) -> dict[str, Any]:
    """Milliseconds from ``publish`` until every subscriber has the version loaded into its
    torch module (``p50_ms``...), and until ``poll_latest`` handed it out (``received_*``), per
    model size. ``shm=False``: the service offers no shared memory, so weights go by socket."""
    from system.parameters.client import ParameterClient

    ctx = mp.get_context("spawn")
    server_out, arrivals, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    server = ctx.Process(
        target=_parameter_server_main, args=(server_out, stop, subscribers, shm), daemon=True
    )
    server.start()
    with ExitStack() as cleanup:
        cleanup.callback(_end, server, stop)
        endpoints = _get(server_out, START_TIMEOUT_S, "the parameter server did not start", server)
        children = [server]
        for i in range(subscribers):
            child = ctx.Process(
                target=_subscriber_main,
                args=(i, endpoints["request"], endpoints["push"], sizes[0], arrivals, stop),
                daemon=True,
            )
            child.start()
            children.append(child)
            cleanup.callback(_end, child, stop)
        _get(server_out, START_TIMEOUT_S, "the subscribers did not subscribe", *children)
        publisher = ParameterClient(endpoints["request"])
        cleanup.callback(publisher.close)
        result: dict[str, Any] = {
            "subscribers": subscribers,
            "transport": "shared memory" if endpoints["shm"] else "socket",
            "sizes": {},
        }
        version = 0
        for size in sizes:
            loaded, received, acks = [], [], []
            weights = np.zeros(size, dtype=np.float32)
            for i in range(publishes + 2):  # the first two warm up (and resize the modules)
                version += 1
                weights[0] = version
                started = time.monotonic()
                publisher.publish(
                    PUSH_POLICY,
                    version,
                    {"version": version, "model": {"w": weights}},
                    timeout_s=30.0,
                )
                acked = time.monotonic()
                got, done = _arrivals(arrivals, version, subscribers, children)
                if i > 1:
                    loaded.append((max(done) - started) * 1000.0)
                    received.append((max(got) - started) * 1000.0)
                    acks.append((acked - started) * 1000.0)
            figures = _percentiles(received, "ms")
            result["sizes"][str(size)] = {
                "megabytes": size * 4 / 1e6,
                **_percentiles(loaded, "ms"),
                "received_p50_ms": figures["p50_ms"],
                "received_max_ms": figures["max_ms"],
                "ack_p50_ms": float(np.median(acks)),
            }
        result["publisher_shm_publishes"] = int(publisher.stats["shm_publishes"])
    return result


def _arrivals(
    arrivals: Any, version: int, subscribers: int, children: list
) -> tuple[list[float], list[float]]:
    """When each subscriber received ``version`` and when it had loaded it."""
    got: dict[int, tuple[float, float]] = {}
    deadline = time.monotonic() + 60.0
    while len(got) < subscribers:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PeerTimeoutError(
                f"version {version} reached {len(got)} of {subscribers} subscribers in 60s"
            )
        index, arrived_version, received, loaded = _get(
            arrivals, left, "no push arrived", *children
        )
        if arrived_version >= version:
            got.setdefault(index, (received, loaded))
    return [r for r, _ in got.values()], [d for _, d in got.values()]


# --------------------------------------------------------------------- helpers
def _percentiles(values: list[float], unit: str) -> dict[str, Any]:
    if not values:
        return {"n": 0, f"p50_{unit}": None, f"p99_{unit}": None, f"max_{unit}": None}
    data = np.asarray(values)
    return {
        "n": len(values),
        f"p50_{unit}": float(np.percentile(data, 50)),
        f"p99_{unit}": float(np.percentile(data, 99)),
        f"max_{unit}": float(data.max()),
    }


def _get(q: Any, timeout_s: float, what: str, *processes: Any) -> Any:
    """The next item of ``q``; fails early if one of ``processes`` has died meanwhile."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return q.get(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
        except queue.Empty:
            pass
        dead = [p for p in processes if not p.is_alive()]
        if dead:
            raise PeerTimeoutError(
                f"{what}: process {dead[0].name} exited with code {dead[0].exitcode}"
            )
        if time.monotonic() >= deadline:
            raise PeerTimeoutError(f"{what} within {timeout_s:.0f}s")


def _end(process: Any, stop: Any) -> None:
    stop.set()
    process.join(timeout=10)
    if process.is_alive():
        process.kill()
        process.join(timeout=5)
