"""The control channel between the controller and its workers, and name resolution.

Every worker process has one DEALER socket (identity = its worker id) connected to the
controller's ROUTER. Over it the worker says hello, receives its configuration, registers the
endpoints it bound, looks up its peers' endpoints, sends heartbeats with stats, reports a failure
with its traceback, and receives ``stop``.

Messages (kind: body):
  worker -> controller: hello {role, pid} | register {name, address} | lookup {name}
                        heartbeat {stats} | error {message, traceback} | bye {}
  controller -> worker: configure {config, run_dir, args} | lookup_result {name, address}
                        stop {}
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import zmq

from api.errors import PeerTimeoutError, WireError
from system.ratelimit import BadMessages
from system.streams import wire

logger = logging.getLogger(__name__)

CONTROL_MAX_BYTES = 16 << 20
"""The largest control message either end accepts (ZeroMQ ``MAXMSGSIZE``): a configuration, a
heartbeat's stats or an error's traceback are kilobytes; 16 MiB leaves room for any of them."""


class StopRequested(Exception):
    """The controller said stop while this worker was still waiting to be set up."""


class ControlClient:
    """The worker's end of the control channel."""

    def __init__(self, controller: str, worker_id: str, *, timeout_s: float = 60.0):
        self.worker_id = worker_id
        self.timeout_s = timeout_s
        self.socket = wire.make_socket(
            zmq.DEALER, server=False, max_message_bytes=CONTROL_MAX_BYTES
        )
        self.socket.setsockopt(zmq.IDENTITY, worker_id.encode())
        self.socket.connect(controller)
        self.inbox: list[wire.Message] = []
        self.bad_messages = BadMessages(logger, f"control channel of {worker_id}")

    def send(self, kind: str, body: dict[str, Any]) -> None:
        wire.send(self.socket, kind, body)

    def hello(self, role: str) -> dict[str, Any]:
        """Announce this worker and wait for its configuration."""
        self.send("hello", {"role": role, "pid": os.getpid()})
        return self.wait_for("configure").body

    def register(self, name: str, address: str) -> None:
        self.send("register", {"name": name, "address": address})

    def lookup(self, name: str) -> str:
        """The address a peer registered under ``name`` (waits until it has registered)."""
        self.send("lookup", {"name": name})
        while True:
            message = self.wait_for("lookup_result")
            if message.body.get("name") == name:
                return str(message.body["address"])

    def wait_for(self, kind: str) -> wire.Message:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            for i, message in enumerate(self.inbox):
                if message.kind == kind:
                    return self.inbox.pop(i)
                if message.kind == "stop":  # e.g. the run failed while we wait for a peer
                    raise StopRequested(f"{self.worker_id} was told to stop")
            self._receive(timeout_ms=100)
        raise PeerTimeoutError(
            f"{self.worker_id} waited {self.timeout_s:.0f}s for '{kind}' from the controller; "
            "is the controller running and reachable?"
        )

    def _receive(self, timeout_ms: int) -> None:
        try:
            got = wire.recv(self.socket, timeout_ms=timeout_ms)
        except WireError as e:
            self.bad_messages.record(e)
            return
        if got is not None:
            self.inbox.append(got[1])

    def stop_requested(self) -> bool:
        """Non-blocking: has the controller said stop?"""
        while True:
            before = len(self.inbox)
            self._receive(timeout_ms=0)
            if len(self.inbox) == before:
                break
        return any(m.kind == "stop" for m in self.inbox)

    def close(self) -> None:
        self.socket.close(linger=200)  # let bye/error reach the controller
