"""Workers sent SIGTERM by someone else than their controller, waiting for its stop (see
:mod:`system.run.term_signal`): when the controller stops each of them alone, and in which
order."""

from __future__ import annotations

from system.roles import Role
from system.run.worker_record import WorkerRecord

SIGNAL_SETTLE_S = 1.0
"""How long a worker sent SIGTERM by someone else waits before it is stopped alone: a signal
that ends the whole job (a preempted Slurm job, ``kubectl delete``) reaches the controller
within it, whose ordered stop then stops the worker in its turn."""


class Signalled:
    """The signalled workers not stopped yet: since when, and by which signal."""

    def __init__(self) -> None:
        self.since: dict[str, tuple[float, str]] = {}

    def add(self, worker_id: str, signal: str, now: float) -> None:
        self.since.setdefault(worker_id, (now, signal))

    def forget(self, record: WorkerRecord) -> None:
        """A new process of the worker says hello: a worker like any other."""
        record.left = record.evicted = None
        self.since.pop(record.plan.worker_id, None)

    def due(self, workers: dict[str, WorkerRecord], now: float) -> list[tuple[str, bool]]:
        """The workers to stop alone now, each marked ``evicted``: each
        :data:`SIGNAL_SETTLE_S` after its signal, in the run's stop order, none while one of
        an earlier order is still stopping (a trainer's last version needs the parameter
        service it goes to). With each, whether it leaves without its stop instead: a rank of
        a data-parallel trainer group, whose stop would stop every rank for good (gone, it
        fails the group, which restarts whole)."""
        if not self.since:  # asked every loop of the controller's
            return []
        stopping = [r.plan.stop_order for r in workers.values() if r.evicted and r.state.running]
        due = []
        for wid in sorted(self.since, key=lambda w: workers[w].plan.stop_order):
            record, (since, signal) = workers[wid], self.since[wid]
            if not record.state.running:  # it left meanwhile, or died: supervision has it
                del self.since[wid]
                continue
            order = record.plan.stop_order
            if now - since < SIGNAL_SETTLE_S or any(o < order for o in stopping):
                continue
            del self.since[wid]
            record.evicted = signal
            stopping.append(order)
            due.append((wid, _in_a_group(record, workers)))
        return due


def _in_a_group(record: WorkerRecord, workers: dict[str, WorkerRecord]) -> bool:
    if record.plan.role is not Role.TRAINER:
        return False
    policy = getattr(record.plan, "policy", None)
    ranks = [r for r in workers.values() if r.plan.role is Role.TRAINER and
             getattr(r.plan, "policy", None) == policy]  # fmt: skip
    return len(ranks) > 1
