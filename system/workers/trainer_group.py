"""Data-parallel trainers: ``trainer_workers=N`` trainer processes of one policy train as one.

Every rank (``TrainerPlan.index``) takes its own share of the policy's samples (actors spread
their segments over all trainers of a policy), runs the same trainer step on its own
``batch_segments`` segments, and DistributedDataParallel averages the gradients of every backward
pass over the group (``torch.distributed``, gloo backend), so all ranks apply the same update to
the same parameters. One step of the group therefore trains on ``N x batch_segments`` segments,
and N trainers keep up with N times the samples. Only rank 0 publishes versions: ranks step in
lockstep, so the version counters agree, and the parameter service sees one monotonic sequence.

Lockstep. Before every step the ranks agree (one tiny all-reduce) on whether *all* of them hold a
full batch and whether any of them is stopping; a rank with a batch waits (polling, heartbeating)
for the slowest one. So every rank runs the same sequence of collectives, a stop ends the group at
a step boundary (rank 0 still writes the final checkpoint), and no collective is ever left
waiting for a peer that has left. A trainer whose step issues a different number of backward
passes on different ranks (data-dependent minibatch counts) cannot be trained data-parallel.

Rendezvous. Rank 0 starts a ``TCPStore`` on a free port, writes a fresh *generation* key into it,
registers ``tcp://host:port`` under :func:`system.roles.trainer_group_endpoint` and forms the
group; once every rank has joined it deletes the key, closing that generation. A joining rank
looks the name up, and joins only a store whose generation is open: a store of an older
generation (its rank 0 about to fail) is left alone, and the name looked up again.

Failures. A rank that dies breaks the group: every other rank fails at its next collective
(gloo notices the closed connection at once), exits with the error, and is restarted by the
controller like any trainer. The restarted ranks form a new generation, each starting from the
latest published version; DDP broadcasts rank 0's parameters when it wraps the model. So a fault
restarts the whole group, simple and the same for every failure. Optimiser state: rank 0 ships
it to the parameter service with every persisted version, and every restarted rank asks the
service for it, so no rank needs the run folder (nor a folder shared with the others).

The group's traffic (the store and gloo's connections) is plain TCP: in cluster mode it is not
covered by CURVE, so keep trainers of one policy on a trusted network. Gloo finds its own address
from the host name; set ``GLOO_SOCKET_IFNAME`` where that is not the right interface.
"""

from __future__ import annotations

import datetime
import gc
import logging
import time
import uuid
import zlib
from typing import Any, Protocol

import torch
import torch.distributed as dist

from api.errors import ConfigError
from api.policy import SampleBatch
from system.errors import TrainerGroupError
from system.workers.trainer_worker import TrainerWorker

logger = logging.getLogger(__name__)

FORM_TIMEOUT_S = 120.0
"""How long a rank waits for the whole group to join (every trainer must start and build)."""
COLLECTIVE_TIMEOUT_S = 120.0
"""gloo's timeout for one collective; a rank that hangs is found sooner by the controller's
heartbeat timeout, so this only bounds a wait nothing else would end."""
STORE_CONNECT_TIMEOUT_S = 5.0
"""A joining rank's wait for a store to answer before it looks the name up again."""
OPEN_KEY = "open_generation"


class Rendezvous(Protocol):
    """Where rank 0 announces its store and the other ranks find it (the control channel)."""

    def announce(self, name: str, port: int) -> None: ...
    def lookup(self, name: str) -> tuple[str, int]: ...


class ControlRendezvous:
    """Process mode: the store's address goes through the controller's register/lookup."""

    def __init__(self, ctl: Any, advertise_host: str):
        self.ctl = ctl
        self.advertise_host = advertise_host

    def announce(self, name: str, port: int) -> None:
        self.ctl.register(name, f"tcp://{self.advertise_host}:{port}")

    def lookup(self, name: str) -> tuple[str, int]:
        host, port = self.ctl.lookup(name).removeprefix("tcp://").rsplit(":", 1)
        return host.strip("[]"), int(port)


class TrainerGroup:
    """This process's membership of its policy's data-parallel group (one per process)."""

    def __init__(self, policy: str, rank: int, size: int, store: dist.Store):
        self.policy = policy
        self.rank = rank
        self.size = size
        self.store = store  # rank 0 serves it: it must live as long as the group
        self._flags = torch.zeros(2, dtype=torch.int32)

    def agree(self, ready: bool, stopping: bool) -> tuple[bool, bool]:
        """One collective every poll: (every rank holds a batch, some rank is stopping)."""
        self._flags[0] = 0 if ready else 1
        self._flags[1] = 1 if stopping else 0
        try:
            dist.all_reduce(self._flags, op=dist.ReduceOp.MAX)
        except RuntimeError as e:
            raise TrainerGroupError(
                f"trainer rank {self.rank} of policy '{self.policy}' lost its group ({e}); every "
                "rank exits and is restarted, and the group forms again"
            ) from e
        return bool(self._flags[0] == 0), bool(self._flags[1] == 1)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def form_group(
    policy: str,
    rank: int,
    size: int,
    rendezvous: Rendezvous,
    name: str,
    bind_host: str = "127.0.0.1",
) -> TrainerGroup:
    """Join (rank 0: open) a new generation of ``policy``'s group, found through ``rendezvous``
    under ``name``; returns once all ``size`` ranks have joined."""
    timeout = datetime.timedelta(seconds=FORM_TIMEOUT_S)
    if rank == 0:
        store = dist.TCPStore(bind_host, 0, size, True, timeout=timeout, wait_for_workers=False)
        generation = uuid.uuid4().hex
        store.set(OPEN_KEY, generation)
        rendezvous.announce(name, store.port)
    else:
        store, generation = _find_open_generation(policy, rank, name, rendezvous)
    logger.info("trainer rank %d/%d of '%s' joins generation %s", rank, size, policy, generation)
    try:
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(generation, store),
            rank=rank,
            world_size=size,
            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        )
    except RuntimeError as e:
        raise TrainerGroupError(
            f"trainer rank {rank} of policy '{policy}': the group of {size} did not form in "
            f"{FORM_TIMEOUT_S:.0f}s ({e}); are all its trainer workers running?"
        ) from e
    if rank == 0:
        store.delete_key(OPEN_KEY)  # everyone is in: this generation takes no one else
    store.set_timeout(datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    return TrainerGroup(policy, rank, size, store)


def _find_open_generation(
    policy: str, rank: int, name: str, rendezvous: Rendezvous
) -> tuple[dist.Store, str]:
    deadline = time.monotonic() + FORM_TIMEOUT_S
    short = datetime.timedelta(seconds=STORE_CONNECT_TIMEOUT_S)
    while True:
        host, port = rendezvous.lookup(name)
        try:
            store = dist.TCPStore(host, port, None, False, timeout=short)
            if store.check([OPEN_KEY]):
                store.set_timeout(datetime.timedelta(seconds=FORM_TIMEOUT_S))
                return store, store.get(OPEN_KEY).decode()
        except RuntimeError as e:  # torch's DistNetworkError: a store that is gone
            logger.info("trainer rank %d of '%s': store %s:%d: %s", rank, policy, host, port, e)
        if time.monotonic() > deadline:
            raise TrainerGroupError(
                f"trainer rank {rank} of policy '{policy}' found no open group at '{name}' in "
                f"{FORM_TIMEOUT_S:.0f}s; is trainer rank 0 of the policy running?"
            )
        time.sleep(0.5)  # an old generation's rank 0 is about to fail; its successor registers


def parameter_checksum(module: torch.nn.Module) -> int:
    """A CRC-32 of every parameter and buffer's bytes: equal on every rank, or they diverged."""
    crc = 0
    for tensor in module.state_dict().values():
        crc = zlib.crc32(tensor.detach().cpu().contiguous().numpy().tobytes(), crc)
    return crc


class GroupTrainerWorker(TrainerWorker):
    """A :class:`TrainerWorker` that is one rank of a data-parallel group (see module docstring).

    Built like a trainer worker; :meth:`join` makes it a member. Until then (and for good in
    serial mode, where no group forms) it trains alone, exactly as a :class:`TrainerWorker`.
    Rank 0 reports its stats as the policy's trainer stats, as a single trainer does; every other
    rank reports its own under ``rank<r>/``. Each adds ``param_checksum``
    (:func:`parameter_checksum`), so divergence between ranks is visible in ``metrics.jsonl``.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.group: TrainerGroup | None = None
        self.ready: SampleBatch | None = None
        self.group_stopped = False

    def join(self, group: TrainerGroup) -> None:
        """Become rank ``group.rank``: wrap the model so that gradients are averaged over the
        group; DDP gives every rank rank 0's parameters as it does.

        Called once the worker's parameters are restored, so a restarted group goes on from rank
        0's restored version on every rank."""
        policy = self.trainer.policy
        if not callable(getattr(policy, "distributed_setup", None)):
            raise ConfigError(
                [
                    f"policies.{self.policy_name}.trainer_workers: {group.size} trainers need a "
                    f"policy with distributed_setup() (algorithm.policy.SingleModelPytorchPolicy); "
                    f"{type(policy).__name__} has none: set trainer_workers=1"
                ]
            )
        self.group = group
        policy.distributed_setup()
        checksum = parameter_checksum(policy.module)
        self.stats["param_checksum"] = checksum
        # Where a re-formed group goes on from: an operator reading a restart needs it (and so
        # does a test that must tell the new group's versions from the old one's). The checksum
        # shows every rank starting from rank 0's parameters, before any report is written.
        logger.info(
            "trainer rank %d/%d of '%s' trains on from version %d (parameter checksum %d)",
            group.rank,
            group.size,
            self.policy_name,
            policy.version,
            checksum,
        )

    @property
    def publishes(self) -> bool:
        return self.group is None or self.group.rank == 0

    def take_batch(self, timeout_ms: int = 0) -> SampleBatch | None:
        """A batch once every rank holds one (the base class's poll then trains on it)."""
        if self.group is None:
            return super().take_batch(timeout_ms)
        if self.group_stopped:
            return None
        if self.ready is None:
            self.ready = super().take_batch(timeout_ms)
        else:
            # Waiting for a peer's batch: keep taking (and acking) up to one more batch, or the
            # actors' credits would sit in this rank's queue while the peer starves.
            self.source.prefetch(self.stages)
        self.stages.enter("wait_group")
        everyone_ready, stopping = self.group.agree(self.ready is not None, stopping=False)
        if stopping:  # a peer is stopping: no step may start that it would not join
            self.group_stopped = True
            return None
        if not everyone_ready:
            return None
        batch, self.ready = self.ready, None
        return batch

    def train(self, batch: SampleBatch) -> dict[str, float]:
        stats = super().train(batch)
        self.stats["param_checksum"] = parameter_checksum(self.trainer.policy.module)
        return stats

    def publish(self, persist: bool, wait: bool = False) -> None:
        if self.publishes:
            super().publish(persist, wait)
        else:
            self.mark_published()

    def collect_stats(self) -> dict[str, Any]:
        stats = super().collect_stats()
        if self.publishes:
            return stats
        return {f"rank{self.group.rank}/{k}": v for k, v in stats.items()}

    def on_stop(self) -> None:
        """Tell the group (the ranks still polling learn it from their next agreement), then let
        rank 0 write the final version."""
        if self.group is not None and not self.group_stopped:
            self.group_stopped = True
            try:
                self.group.agree(False, stopping=True)
            except TrainerGroupError as e:  # a peer already gone: rank 0 still checkpoints
                logger.warning("%s", e)
        if self.publishes:
            super().on_stop()

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.group is not None:
                self.leave()

    def leave(self) -> None:
        """Free the policy's DDP wrapper, then destroy the group (the order gloo needs: see
        ``SingleModelPytorchPolicy.distributed_teardown``)."""
        teardown = getattr(self.trainer.policy, "distributed_teardown", None)
        if callable(teardown):
            teardown()
        gc.collect()  # the wrapper's reducer, if a cycle (an autograd graph) still holds it
        self.group.close()
