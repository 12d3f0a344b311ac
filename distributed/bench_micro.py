"""Round-trip benchmarks for ``troupe bench``: inference latency and weight-push latency.

Both start the runtime's real classes in separate processes, wired by hand (no controller):

- ``latency``: one process runs :class:`system.policy_worker.PolicyWorker` (a
  :class:`ZmqInferenceServer`, cartpole-ppo's actor-critic policy, the worker's default batching)
  and the bench process is the actor, sending :class:`RolloutRequest` batches through
  :class:`ZmqInferenceClient` and timing each round trip.
- ``push``: one process runs :class:`ParameterServer`, ``k`` processes each hold a subscribed
  :class:`ParameterClient` and report, on the system-wide monotonic clock, when ``poll_latest``
  handed them each new version; the bench process publishes and takes the slowest arrival.

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

from api.errors import PeerTimeoutError

START_TIMEOUT_S = 120.0
REPLY_TIMEOUT_S = 10.0


# --------------------------------------------------------------------- inference latency
def _policy_worker_main(out: Any, stop: Any, report: Any) -> None:
    """Child: a policy worker for cartpole-ppo's policy, answering on a fresh loopback port."""
    import torch

    from api.config import make_experiment
    from system import builders
    from system.inference_stream import ZmqInferenceServer
    from system.policy_worker import PolicyWorker

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
    from system.inference_stream import ZmqInferenceClient

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
    from system.inference_stream import ZmqInferenceClient

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
def _parameter_server_main(out: Any, stop: Any, subscribers: int) -> None:
    """Child: the parameter server, in memory; says when ``subscribers`` have subscribed."""
    from system.parameter_service import ParameterServer
    from system.parameter_store import ParameterStore

    server = ParameterServer(ParameterStore(keep=2))
    out.put({"request": server.request_endpoint, "push": server.push_endpoint})
    announced = False
    try:
        while not stop.is_set():
            server.poll(timeout_ms=20)
            if not announced and server.subscriber_count("bench") >= subscribers:
                announced = True
                out.put("subscribed")
    finally:
        server.close()


def _subscriber_main(index: int, request: str, push: str, out: Any, stop: Any) -> None:
    """Child: a policy worker's parameter client; reports when each version arrives."""
    from system.parameter_service import ParameterClient

    client = ParameterClient(request, push, subscribe=["bench"])
    try:
        while not stop.is_set():
            latest = client.poll_latest("bench", timeout_s=0.1)
            if latest is not None:
                out.put((index, latest[0], time.monotonic()))
    finally:
        client.close()


def push_latency(sizes: tuple[int, ...], publishes: int, subscribers: int) -> dict[str, Any]:
    """Milliseconds from ``publish`` until every subscriber holds the version, per model size."""
    from system.parameter_service import ParameterClient

    ctx = mp.get_context("spawn")
    server_out, arrivals, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    server = ctx.Process(
        target=_parameter_server_main, args=(server_out, stop, subscribers), daemon=True
    )
    server.start()
    with ExitStack() as cleanup:
        cleanup.callback(_end, server, stop)
        endpoints = _get(server_out, START_TIMEOUT_S, "the parameter server did not start", server)
        children = [server]
        for i in range(subscribers):
            child = ctx.Process(
                target=_subscriber_main,
                args=(i, endpoints["request"], endpoints["push"], arrivals, stop),
                daemon=True,
            )
            child.start()
            children.append(child)
            cleanup.callback(_end, child, stop)
        _get(server_out, START_TIMEOUT_S, "the subscribers did not subscribe", *children)
        publisher = ParameterClient(endpoints["request"])
        cleanup.callback(publisher.close)
        result: dict[str, Any] = {"subscribers": subscribers, "sizes": {}}
        version = 0
        for size in sizes:
            every, acks = [], []
            weights = np.zeros(size, dtype=np.float32)
            for i in range(publishes + 1):  # the first one warms up
                version += 1
                weights[0] = version
                started = time.monotonic()
                publisher.publish(
                    "bench", version, {"version": version, "model": {"w": weights}}, timeout_s=30.0
                )
                acked = time.monotonic()
                arrived = _arrivals(arrivals, version, subscribers, children)
                if i > 0:
                    every.append((max(arrived) - started) * 1000.0)
                    acks.append((acked - started) * 1000.0)
            result["sizes"][str(size)] = {
                "megabytes": size * 4 / 1e6,
                **_percentiles(every, "ms"),
                "ack_p50_ms": float(np.median(acks)),
            }
    return result


def _arrivals(arrivals: Any, version: int, subscribers: int, children: list) -> list[float]:
    got: dict[int, float] = {}
    deadline = time.monotonic() + 60.0
    while len(got) < subscribers:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PeerTimeoutError(
                f"version {version} reached {len(got)} of {subscribers} subscribers in 60s"
            )
        index, arrived_version, at = _get(arrivals, left, "no push arrived", *children)
        if arrived_version >= version:
            got.setdefault(index, at)
    return list(got.values())


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
