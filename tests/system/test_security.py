"""Cluster mode's CURVE: with the run's keys a peer is answered; without them, or with other keys,
not a single message gets through. Checked against a real ``troupe run --secure``."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import zmq
from e2e_support import finish, read_json, start, wait_for

from api.policy import RolloutRequest
from system.streams import transport
from system.streams.security import RunKeys

pytestmark = pytest.mark.multiprocess


def client(ctx: zmq.Context, address: str, keys: RunKeys | None, *, identity: bytes | None = None):
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    # a DEALER with no peer blocks on send: a refused handshake must end in "not answered"
    sock.setsockopt(zmq.SNDTIMEO, 3000)
    if identity:
        sock.setsockopt(zmq.IDENTITY, identity)
    if keys is not None:
        sock.curve_serverkey = keys.server_public
        sock.curve_publickey = keys.client_public
        sock.curve_secretkey = keys.client_secret
    sock.connect(address)
    return sock


def answered(sock: zmq.Socket, kind: str, body: dict, timeout_ms: int = 3000) -> bool:
    try:
        transport.send(sock, kind, body)
    except zmq.Again:  # no peer to queue it for within SNDTIMEO: the handshake was refused
        return False
    return transport.recv(sock, timeout_ms=timeout_ms) is not None


def probes(endpoints: dict) -> list[tuple[str, str, dict, bytes | None]]:
    n = 2
    request = RolloutRequest(
        obs=np.zeros((n, 4), np.float32),
        is_evaluation=np.ones((n, 1), bool),
        on_reset=np.ones((n, 1), bool),
        client_id=np.zeros((n, 1), np.int64),
        request_id=np.zeros((n, 1), np.int64),
    )
    return [
        # the controller tells an authenticated stranger that it is not part of the run
        (endpoints["controller"], "lookup", {"name": "params/request"}, b"probe"),
        (
            endpoints["params/request"],
            "get",
            {"id": 1, "policy": "default", "version": "latest"},
            None,
        ),
        (
            endpoints["inference/default/0"],
            "rollout",
            {"group": 0, "seq": 1, "request": request},
            None,
        ),
    ]


def _served_version(run_dir) -> int:
    """The version the run's policy worker has loaded, as workers.json reports it."""
    worker = read_json(run_dir / "workers.json").get("policy/default/0") or {}
    return worker.get("version") or 0


def test_only_a_peer_with_the_run_keys_is_answered(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(
        [
            "run",
            "cartpole-ppo",
            "stop.eval_return=None",
            "stop.env_frames=100000000",
            "--run-dir",
            str(run_dir),
            "--no-display",
            "--secure",
        ]
    )
    wait_for(lambda: len(read_json(run_dir / "endpoints.json")) >= 5, proc, what="endpoints")
    keys = RunKeys.from_text((run_dir / "keys").read_text())
    strangers = RunKeys.generate()
    wrong_client = RunKeys(
        keys.server_public, b"", strangers.client_public, strangers.client_secret
    )
    ctx = zmq.Context()
    try:
        for address, kind, body, identity in probes(read_json(run_dir / "endpoints.json")):
            for label, k in (("no keys", None), ("a stranger's client key", wrong_client)):
                sock = client(ctx, address, k, identity=identity)
                assert not answered(sock, kind, body, 2000), f"{address} answered {label}"
                sock.close()
            sock = client(ctx, address, keys, identity=identity)
            assert answered(sock, kind, body), f"{address} did not answer the run's own keys"
            sock.close()
        # and the run's own workers still get what they need through CURVE: new versions are
        # pushed to the policy worker (a handshake larger than the push socket's message cap
        # once dropped every encrypted subscriber, so policy workers never left version 0)
        wait_for(
            lambda: _served_version(run_dir) >= 3,
            proc,
            timeout=300,
            what="the policy worker loading version 3 from the parameter service",
        )
    finally:
        ctx.term()
        os.killpg(proc.pid, signal.SIGINT)
        finish(proc, timeout=90)
    assert oct((run_dir / "keys").stat().st_mode & 0o777) == "0o600"
