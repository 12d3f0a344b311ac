"""Keeping a worker connected to peers that were restarted at new addresses.

Actors follow their policy workers and trainers or replay worker (:class:`ActorPeerWatchdog`);
trainers and policy workers follow the parameter service, off-policy trainers their replay
worker.

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
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from system.parameters.interfaces import ParameterClientBase
from system.roles import PARAMS_PUSH, PARAMS_REQUEST
from system.run.control_channel import ControlClient
from system.streams.replay import ZmqReplayClient

if TYPE_CHECKING:
    from system.workers.actor_worker import ActorWorker

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
    ):
        self.ctl = ctl
        self.worker = worker
        self.new_client = new_client
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


class ReplayWorkerWatch:
    """Moves an off-policy trainer's replay client to a restarted replay worker's new address
    (on the trainer's heartbeat)."""

    def __init__(self, ctl: ControlClient, client: ZmqReplayClient, name: str):
        self.ctl = ctl
        self.client = client
        self.name = name
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
        names = [
            *self.inference_names.values(),
            *(n for ns in self.sample_names.values() for n in ns),
        ]
        self._follow(self.ctl.moved(names))
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

    def _follow(self, moved: dict[str, str]) -> None:
        """Peers the controller says were restarted at new addresses: reconnect now, rather
        than after a stall."""
        for policy, name in self.inference_names.items():
            if name in moved:
                self.worker.inference.connect(policy, moved[name])
                self.worker.repost({policy})
        samples = self.worker.samples
        for policy, names in self.sample_names.items():
            if samples is not None and any(n in moved for n in names):
                samples.connect(policy, [self.ctl.lookup(n) for n in names])
