"""How a worker process meets its peers: ZeroMQ sockets, found by name through the controller.

A role's builder (:mod:`system.run.builders`) asks its wiring for what it needs (an inference
server, a sample producer, the parameter service's client); in a worker process each is a socket
this worker binds and registers under a name, or one it connects to the address a peer
registered (:meth:`ControlClient.lookup` waits for it). Where it binds and what it advertises is
its :class:`Placement` (loopback locally, the host's address in a cluster).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from api.config import ExperimentConfig
from system.parameters.client import ParameterClient
from system.parameters.service import ParameterServer
from system.parameters.store import ParameterStore
from system.roles import PARAMS_PUSH, PARAMS_REQUEST
from system.run import builders
from system.run.control_channel import ControlClient
from system.run.shape import RunShape
from system.streams.inference import ZmqInferenceClient, ZmqInferenceServer
from system.streams.obs_slots import SlotWriter
from system.streams.replay import ZmqReplayClient, ZmqReplayServer
from system.streams.samples import ZmqSampleConsumer, ZmqSampleProducer
from system.workers.base import Worker
from system.workers.parameter_worker import ParameterServiceWorker

logger = logging.getLogger(__name__)


class BuildStopped(Exception):
    """The controller asked this worker to stop while it was being built."""


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


class SocketWiring:
    """Process mode: peers are ZeroMQ sockets, found by name through the controller."""

    waits_for_peers = True
    threads = True

    def __init__(
        self,
        ctl: ControlClient,
        place: Placement,
        run_dir: Path,
        config: ExperimentConfig,
        shape: RunShape | None = None,
    ):
        self.ctl, self.place, self.run_dir, self.config = ctl, place, run_dir, config
        self._shape = shape
        self._obs_slots: SlotWriter | bool | None = None

    @property
    def shape(self) -> RunShape:
        """The run's spaces and message layouts: as the controller sent them, or (where it
        could not: a space without a wire form) resolved here, once."""
        if self._shape is None:
            self._shape = RunShape.of(self.config)
        return self._shape

    @property
    def spaces(self) -> builders.AgentSpaces:
        return self.shape.spaces

    def keep_alive(self) -> None:
        """While a builder waits (for a first version, say): heartbeats go out, a stop request
        is noticed, and a controller that is gone ends the wait."""
        if self.ctl.stop_requested():
            raise BuildStopped()
        self.ctl.heartbeat({})
        self.ctl.check_controller()

    def parameter_client(self, subscribe: list[str]) -> ParameterClient:
        push = self.ctl.lookup(PARAMS_PUSH) if subscribe else None
        request = self.ctl.lookup(PARAMS_REQUEST)
        limit = self.shape.params.max_message_bytes
        names = (PARAMS_REQUEST, PARAMS_PUSH)
        return ParameterClient(
            request,
            push,
            subscribe=subscribe,
            max_message_bytes=limit,
            abandon=lambda: self.ctl.has_moved(names),
        )

    def inference_server(self, name: str, policy_name: str) -> ZmqInferenceServer:
        server = ZmqInferenceServer(self.place.bind(), layout=self.shape.requests[policy_name])
        self._register(name, server.endpoint)
        return server

    def inference_client(self, client_id: str, names: dict[str, str]) -> ZmqInferenceClient:
        return ZmqInferenceClient(
            {p: self.ctl.lookup(n) for p, n in names.items()}, slots=self.obs_slots()
        )

    def obs_slots(self) -> SlotWriter | None:
        """This actor's shared memory for observations (one for both streams), or None when
        this host has none to offer (``TROUPE_SHM_DIR=off``, no writable directory)."""
        if self._obs_slots is None:
            try:
                self._obs_slots = SlotWriter()
            except OSError as e:
                logger.info("observations go over sockets only: %s", e)
                self._obs_slots = False
        return self._obs_slots or None

    def sample_consumer(self, name: str, policy_name: str) -> ZmqSampleConsumer:
        consumer = ZmqSampleConsumer(self.place.bind(), layout=self.shape.segments[policy_name])
        self._register(name, consumer.endpoint)
        return consumer

    def sample_producer(self, names: dict[str, list[str]]) -> ZmqSampleProducer:
        return ZmqSampleProducer(
            {p: [self.ctl.lookup(n) for n in ns] for p, ns in names.items()},
            slots=self.obs_slots(),
        )

    def replay_server(self, name: str, policy_name: str) -> ZmqReplayServer:
        server = ZmqReplayServer(self.place.bind(), layout=self.shape.priorities[policy_name])
        self._register(name, server.endpoint)
        return server

    def replay_client(self, name: str, policy_name: str, client_id: str) -> ZmqReplayClient:
        return ZmqReplayClient(self.ctl.lookup(name), layout=self.shape.batches[policy_name])

    def parameter_server(self, store: ParameterStore) -> Worker:
        layout = self.shape.params
        server = ParameterServer(store, self.place.bind(), self.place.bind(), layout=layout)
        self._register(PARAMS_REQUEST, server.request_endpoint)
        self._register(PARAMS_PUSH, server.push_endpoint)
        return ParameterServiceWorker(self.ctl.worker_id, server)

    def _register(self, name: str, endpoint: str) -> None:
        """Tell the controller that ``name`` is served at ``endpoint`` (its advertised form)."""
        self.ctl.register(name, self.place.advertise(endpoint))

    def trainer_group(self, name: str, policy_name: str, rank: int, size: int):
        """Trainers of one policy form a data-parallel group (system.workers.trainer_group)."""
        from system.workers.trainer_group import ControlRendezvous, form_group

        rendezvous = ControlRendezvous(self.ctl, self.place.advertise_host)
        return form_group(policy_name, rank, size, rendezvous, name, self.place.bind_host)
