"""The controller's end of the control channel: one ROUTER socket every worker connects to.

Each worker's DEALER carries its worker id as identity, so a message arrives with exactly one
routing frame, its sender's id; anything else (a foreign peer, a frame too many) is counted
and dropped, never fatal. The worker's end is :class:`system.run.control_channel.ControlClient`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import zmq

from system.errors import WireError
from system.ratelimit import BadMessages
from system.run.control_channel import CONTROL_MAX_BYTES
from system.run.control_protocol import ControlMessage, send
from system.streams import transport, wire

logger = logging.getLogger(__name__)


class ControlServer:
    def __init__(self, bind: str, advertise_host: str | None = None):
        self.socket = transport.make_socket(
            zmq.ROUTER, server=True, hwm=10_000, max_message_bytes=CONTROL_MAX_BYTES
        )
        # A worker's replacement (restarted by Docker, Kubernetes, Slurm) connects under the same
        # identity while the hung original's connection may still be open: the newcomer takes
        # the name over, or every message meant for the worker would go to the dead one.
        self.socket.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.socket.bind(bind)
        endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        port = endpoint.rsplit(":", 1)[1]
        self.address = f"tcp://{advertise_host}:{port}" if advertise_host else endpoint
        """Where workers connect: the bound endpoint, or ``advertise_host`` with its port (a
        controller bound to every interface, reached by its host's name)."""
        self.bad_messages = BadMessages(logger, "controller")

    def receive(self, timeout_ms: int) -> Iterator[tuple[str, wire.Message]]:
        """Every message that came within ``timeout_ms`` (then without waiting), with its
        sender's id."""
        first = True
        while True:
            try:
                got = transport.recv(self.socket, timeout_ms=timeout_ms if first else 0)
            except WireError as e:
                self.bad_messages.record(e)
                continue
            first = False
            if got is None:
                return
            envelope, message = got
            if len(envelope) != 1:  # a worker's DEALER gives exactly its identity
                self.bad_messages.record(
                    WireError(f"control message with {len(envelope)} routing frames, not 1")
                )
                continue
            try:
                sender = envelope[0].decode()
            except UnicodeDecodeError as e:
                self.bad_messages.record(WireError(f"control message from a foreign peer: {e}"))
                continue
            yield sender, message

    def send(self, worker_id: str, message: ControlMessage) -> None:
        send(self.socket, message, envelope=[worker_id.encode()])

    def close(self) -> None:
        self.socket.close(linger=0)
