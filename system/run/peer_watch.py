"""Keeping a worker connected to the parameter service (and a replay worker) across restarts.

A trainer publishes through, and a policy worker listens on, sockets connected to the addresses
the parameter service registered. When the service dies and the controller restarts it, the new
process binds new addresses and registers them; the controller then tells every worker that had
looked those names up (``moved``, see :mod:`system.run.control_channel`). This watchdog, run with
every heartbeat, reads those notices and gives the worker a fresh client on the new addresses;
the worker decides what it still owes the service (:meth:`reconnect` of the trainer and policy
workers). Versions are never lost on the way: the service wrote each one to the run folder before
it announced it, and starts from the newest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from system.parameters.interfaces import ParameterClientBase
from system.run.control_channel import ControlClient
from system.run.plan import PARAMS_PUSH, PARAMS_REQUEST
from system.streams.replay import ZmqReplayClient

logger = logging.getLogger(__name__)


class Reconnectable(Protocol):
    worker_id: str

    def reconnect(self, params: ParameterClientBase) -> None: ...


class ParameterServiceWatch:
    """Swaps a worker's parameter client when the service's addresses move."""

    NAMES = (PARAMS_REQUEST, PARAMS_PUSH)

    def __init__(
        self,
        ctl: ControlClient,
        worker: Reconnectable,
        new_client: Callable[[], ParameterClientBase],
        then: Callable[[], None] | None = None,
    ):
        self.ctl = ctl
        self.worker = worker
        self.new_client = new_client
        self.then = then
        self.reconnects = 0

    def __call__(self) -> None:
        moved = self.ctl.moved(self.NAMES)
        if any(name in moved for name in self.NAMES):
            self.reconnects += 1
            logger.warning(
                "%s: the parameter service was restarted; reconnecting (%d)",
                *(self.worker.worker_id, self.reconnects),
            )
            # Both names are looked up again: the second may not be registered yet, and a
            # lookup waits for it, so the new client never mixes old and new addresses.
            self.worker.reconnect(self.new_client())
        if self.then is not None:
            self.then()


class ReplayWorkerWatch:
    """Moves an off-policy trainer's replay client to a restarted replay worker's new address.

    Runs on the trainer's heartbeat, before the watches it wraps (``then``)."""

    def __init__(
        self,
        ctl: ControlClient,
        client: ZmqReplayClient,
        name: str,
        then: Callable[[], None] | None = None,
    ):
        self.ctl = ctl
        self.client = client
        self.name = name
        self.then = then
        self.reconnects = 0

    def __call__(self) -> None:
        moved = self.ctl.moved([self.name])
        if self.name in moved:
            self.reconnects += 1
            logger.warning(
                "%s: the replay worker was restarted; reconnecting (%d)",
                *(self.ctl.worker_id, self.reconnects),
            )
            self.client.reconnect(moved[self.name])
        if self.then is not None:
            self.then()
