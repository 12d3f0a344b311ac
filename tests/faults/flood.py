"""Malformed traffic of every kind to every socket of a run: the attacker's side of the fault suite.

Run as its own process (``python tests/faults/flood.py RUN_DIR COUNT BIG_COUNT [PREFIX]``) so
that whatever the traffic does to a ZeroMQ client (libzmq 4.3.5's XSUB crashes on closing after a
huge subscription, for one) cannot take the test process with it. It reads the run's
``endpoints.json``, refuses any address that is not 127.0.0.1, sends ``COUNT`` messages of each
kind (``BIG_COUNT`` of the 50 MB ones) to every socket (or those whose name starts with
``PREFIX``), and prints what it sent as JSON.

Kinds: ``random_bytes`` (random frames), ``wrong_types`` (msgpack of the wrong shape of data),
``wrong_arrays`` (valid headers of the socket's own message kinds whose arrays have wrong
shapes, dtypes, row counts or NaN), ``oversized_claims`` (headers that claim arrays far larger
than their frames, and ZMTP frames that claim 2**62 bytes on a raw connection), ``truncated``
(valid messages missing frames or bytes), ``frames_50mb`` (counted as the connections the
receiver dropped at the frame's size header, one per message: a socket without ``MAXMSGSIZE``
would read them whole, and drop none).
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from api.namedarray import NamedArray
from api.policy import RolloutRequest, SampleBatch
from system.streams import wire

BIG = 50_000_000
SEND_TIMEOUT_MS = 20_000
BIG_TIMEOUT_S = 20.0
"""How long one 50 MB message may take to be refused (a millisecond or two, normally)."""
RESEND_S = 0.5
"""How long an XSUB waits for its message to be refused before it sends it again."""


def main(run_dir: str, count: int, big_count: int, prefix: str = "") -> None:
    endpoints = json.loads((Path(run_dir) / "endpoints.json").read_text())
    rng = np.random.default_rng(0)
    ctx = zmq.Context()
    report: dict[str, dict[str, int]] = {}
    big = b"\x02" + bytes(BIG)  # one buffer, sent without copies (0x02: not a subscription)
    for name, address in sorted(endpoints.items()):
        if not name.startswith(prefix):
            continue
        host, port = address.removeprefix("tcp://").rsplit(":", 1)
        if host != "127.0.0.1":
            raise SystemExit(f"refusing to send to {address}: not this machine's loopback")
        pub = name == "params/push"
        sent = report.setdefault(name, {})
        for kind, messages in kinds(name, rng, count):
            sent[kind] = send_all(ctx, address, pub, messages, delimit=kind != "random_bytes")
        sent["oversized_claims"] += raw_length_claims(host, int(port), pub, count)
        sent["frames_50mb"] = send_big(ctx, address, pub, big, big_count)
    ctx.term()
    print(json.dumps(report))


def kinds(name: str, rng: np.random.Generator, count: int):
    makers = {
        "random_bytes": random_bytes,
        "wrong_types": wrong_types,
        "wrong_arrays": wrong_arrays,
        "oversized_claims": oversized_claims,
        "truncated": truncated,
    }
    for kind, make in makers.items():
        yield kind, (make(name, rng, i) for i in range(count))


def send_all(ctx: zmq.Context, address: str, pub: bool, messages, delimit: bool = True) -> int:
    """Send every message (frames after the delimiter) on a fresh connection; returns how many
    went. A ROUTER peer gets ``[b"", *frames]`` from a DEALER (no delimiter unless
    ``delimit``); the push socket (an XPUB) gets each message as one frame from an XSUB, with a
    first byte that is not a subscription flag."""
    sock = ctx.socket(zmq.XSUB if pub else zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
    sock.setsockopt(zmq.LINGER, SEND_TIMEOUT_MS)
    sock.connect(address)
    sent = 0
    try:
        for frames in messages:
            if pub and not (len(frames) == 1 and frames[0][:1] == b"\x02"):
                frames = [b"\x02" + b"".join(bytes(f) for f in frames)]
            elif not pub and delimit:
                frames = [b"", *frames]
            sock.send_multipart(frames, copy=len(frames[-1]) < BIG)
            sent += 1
    except zmq.Again:
        pass  # the peer stopped reading for SEND_TIMEOUT_MS: report what went
    finally:
        sock.close()
    return sent


def send_big(ctx: zmq.Context, address: str, pub: bool, big: bytes, count: int) -> int:
    """Send ``count`` messages of the one 50 MB buffer (no copies), one per connection; return
    how many the receiver refused. A receiver with ``MAXMSGSIZE`` drops the connection when it
    reads the frame's size, and the socket reconnects within a millisecond; the next message goes
    once it has."""
    sock = ctx.socket(zmq.XSUB if pub else zmq.DEALER)
    sock.setsockopt(zmq.RECONNECT_IVL, 1)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
    sock.connect(address)
    frames = [big] if pub else [b"", big]
    refused = 0
    try:
        for _ in range(count):
            if not wait_event(monitor, zmq.EVENT_HANDSHAKE_SUCCEEDED, BIG_TIMEOUT_S):
                break
            if not refuse_one(sock, monitor, frames, pub):
                break  # the receiver read it whole: it has no bound
            refused += 1
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close()
    return refused


def refuse_one(sock: zmq.Socket, monitor: zmq.Socket, frames: list, pub: bool) -> bool:
    """Send one message; whether the receiver dropped the connection for it. An XSUB drops a
    message sent before it has taken its new connection (the handshake is reported first, and
    it drops what it queued when a connection ends), so it sends again until one goes."""
    deadline = time.monotonic() + BIG_TIMEOUT_S
    while time.monotonic() < deadline:
        sock.send_multipart(frames, copy=False)
        if wait_event(monitor, zmq.EVENT_DISCONNECTED, RESEND_S if pub else BIG_TIMEOUT_S):
            return True
        if not pub:
            return False
    return False


def wait_event(monitor: zmq.Socket, event: int, timeout_s: float) -> bool:
    """Whether ``event`` happened on the monitored socket within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if monitor.poll(50) and recv_monitor_message(monitor)["event"] == event:
            return True
    return False


# --------------------------------------------------------------------------------- the kinds
def random_bytes(name, rng, i):
    return [rng.bytes(int(rng.integers(0, 2000))) for _ in range(int(rng.integers(1, 4)))]


def wrong_types(name, rng, i):
    kind = message_kind(name)
    bodies = [
        1,
        "rollout",
        [1, 2, 3],
        {"v": "1", "k": kind, "b": {}},
        {"v": 1, "k": 7, "b": {}},
        {"v": 1, "k": kind, "b": [1, 2]},
        {"v": 1, "k": kind, "b": {"group": "g", "seq": [], "request": {"__na__": {"obs": 5}}}},
        {"v": 1, "k": kind, "b": {"segment": {"__na__": {"obs": None, "reward": "x"}}}},
        {"v": 1, "k": kind, "b": {"id": "x", "policy": 5, "version": [1]}},
        {"v": 1, "k": kind, "b": {"id": 1, "policy": "default", "version": {"a": 1}}},
        {"v": 1, "k": kind, "b": {"stats": {"peak_rss_mb": "x"}, "name": 3}},
        {"v": 2, "k": kind, "b": {}},
        {"v": 1, "k": kind, "b": {"__nd__": 1, "dtype": "O", "shape": [1]}},
        {"v": 1, "k": kind, "b": {"__tu__": 5}},
    ]
    return [msgpack.packb(bodies[i % len(bodies)], use_bin_type=True)]


def message_kind(name: str) -> str:
    if name.startswith("inference/"):
        return "rollout"
    if name.startswith("samples/") or name.endswith("/samples"):  # a trainer's, a replay worker's
        return "samples"
    if name.endswith("/batches"):  # a replay worker's requests
        return "replay_sample"
    if name == "params/request":
        return "publish"
    return "heartbeat"


def wrong_arrays(name, rng, i):
    """Valid messages of the socket's own kinds whose arrays do not fit the run."""
    if name.startswith("inference/"):
        body = {"group": 0, "seq": i, "request": bad_request(rng, i)}
    elif message_kind(name) == "samples":
        body = {"segment": bad_segment(rng, i)}
    elif message_kind(name) == "replay_sample":
        body = bad_priorities(i)
    elif name == "params/request":
        bad = [np.zeros((3, 3), np.float32), np.zeros(0), np.full(4, np.nan, np.float32)]
        params = {"version": 10**9, "model": {"layer.weight": bad[i % len(bad)]}}
        body = {"id": i, "policy": "default", "version": 10**9, "params": params, "persist": False}
        return wire.encode("publish", body)
    else:  # the controller: a heartbeat from a stranger
        body = {"stats": {"env_frames": np.zeros((3, 3)), "episodes": [np.ones(2)]}}
        return wire.encode("heartbeat", body)
    return wire.encode(message_kind(name), body)


def bad_request(rng, i) -> RolloutRequest:
    rows = [2, 0, 3, 100][i % 4]
    shapes = [(rows, 5), (rows,), (rows, 4, 1), (rows, 4)]
    dtypes = [np.float32, np.complex64, np.int8, np.float64]
    obs = np.zeros(shapes[i % 4], dtypes[(i // 4) % 4])
    if obs.dtype.kind == "f" and obs.size:
        obs.flat[0] = np.nan
    flags = np.zeros((rows, 1), bool)
    return RolloutRequest(obs=obs, is_evaluation=flags, on_reset=flags, client_id=None)


def bad_segment(rng, i) -> SampleBatch:
    t, k = [(0, 1), (65, 0), (3, 2), (65, 1)][i % 4]
    flags = np.zeros((t, k, 1), bool)
    obs = [np.zeros((0,), np.float32), np.zeros((t, k, 4), np.float32), np.zeros((t, k, 9))]
    return SampleBatch(
        obs=obs[i % 3],
        action=np.zeros((t, k), np.float64),
        policy_output=NamedArray(value=np.full((t, k, 1), np.inf, np.float32)),
        reward=np.zeros((t, k, 1), np.float32),
        done=flags,
        truncated=flags,
        on_reset=flags,
        policy_version=np.zeros((t, k, 1), np.int64),
    )


def bad_priorities(i) -> dict:
    """Replay requests whose keys and priorities do not fit: NaN, mismatched rows, 2-D keys,
    float keys, more rows than a batch, one without the other."""
    rows = np.arange(4)
    bodies = [
        {"keys": rows, "priorities": np.full(4, np.nan)},
        {"keys": rows, "priorities": np.ones(3)},
        {"keys": rows.reshape(2, 2), "priorities": np.ones((2, 2))},
        {"keys": rows.astype(np.float64), "priorities": np.ones(4)},
        {"keys": np.arange(10_000), "priorities": np.ones(10_000)},
        {"keys": rows, "priorities": None},
        {"keys": rows, "priorities": np.full(4, np.inf, np.float32)},
        {"keys": rows, "priorities": np.ones(4, np.complex64)},
    ]
    return bodies[i % len(bodies)]


def oversized_claims(name, rng, i):
    """Headers whose arrays claim far more bytes than the message carries."""
    shape = [[2**40], [2**31, 2**31], [2**61 // 4], [1 << 20, 1 << 20, 1 << 20]][i % 4]
    node = {"__nd__": 1, "dtype": "<f4", "shape": shape}
    body = {"request": node, "segment": node, "keys": node, "priorities": node}
    header = {"v": 1, "k": message_kind(name), "b": body}
    return [msgpack.packb(header, use_bin_type=True), b"\x00" * 16]


def truncated(name, rng, i):
    """A well-formed message cut short: a frame missing, an array frame or the header cut."""
    body = {"group": 0, "seq": i, "request": bad_request(rng, 3), "segment": None}
    frames = [bytes(f) for f in wire.encode(message_kind(name), body, inline_budget=0)]
    cut = i % 3
    if cut == 0:
        return frames[:-1]
    if cut == 1:
        return [frames[0], frames[-1][: len(frames[-1]) // 2]]
    return [frames[0][: len(frames[0]) // 2], *frames[1:]]


def raw_length_claims(host: str, port: int, pub: bool, count: int) -> int:
    """ZMTP 3.0 handshakes (NULL mechanism) that then claim a 2**62-byte frame, each on a raw
    connection of its own (the peer drops the connection, as it should)."""
    greeting = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\x00")
    greeting += b"\x00" + bytes(31)
    kind = b"SUB" if pub else b"DEALER"
    ready = b"\x05READY" + bytes([11]) + b"Socket-Type" + struct.pack(">I", len(kind)) + kind
    command = bytes([0x04, len(ready)]) + ready
    claim = bytes([0x02]) + struct.pack(">Q", 2**62) + bytes(64)
    done = 0
    for _ in range(count):
        try:
            with socket.create_connection((host, port), timeout=5) as raw:
                raw.sendall(greeting + command + claim)
            done += 1
        except OSError:
            continue
    return done


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:5])
