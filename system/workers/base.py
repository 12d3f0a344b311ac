"""The worker base class: a worker only says what one ``poll`` does.

Who calls ``poll`` differs by mode, and nothing else does: in a run,
:mod:`system.run.worker_process` loops over it inside the worker's own OS process, with
heartbeats, stats and stop handling around it; in one process (``test_pipeline``, fast tests),
:mod:`system.run.serial` calls the ``poll`` of every worker in turn. Either way the production
code path is the tested one.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from system.roles import Role
from system.timing import SharedStageClock, StageClock


class Worker(abc.ABC):
    """Base class of actor, policy, replay and trainer workers and the parameter service."""

    role: ClassVar[Role]
    """The role a subclass plays (its plan's role)."""

    def __init__(self, worker_id: str):
        self.worker_id = worker_id
        self.stats: dict[str, Any] = {}
        """Counters since the last ``collect_stats``; subclasses add to it."""
        self.stages: StageClock = SharedStageClock()
        """Where this worker's loop spends its time: ``poll`` enters the stage it works on
        (its first one at once), the process loop enters ``control`` after it and sends the
        seconds with every heartbeat (:mod:`system.timing`). Shared: during a long poll (a
        trainer's step) the busy-heartbeat thread takes its seconds, so the shares of a worker
        in one long stage stay current instead of repeating its last heartbeat's."""
        self.building: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext
        """Wraps a part of a poll that builds (an environment made again): the worker loop
        bounds it by ``liveness.max_build_s``, not by the poll's bound."""

    @abc.abstractmethod
    def poll(self) -> int:
        """Do one unit of work without blocking for long; return how much was done (0: idle)."""

    def thread_stages(self) -> dict[str, StageClock]:
        """The stage clocks of threads this worker runs besides its loop, by name (a trainer's
        loader): their stages are reported as a part of the role of their own
        (``timing/trainer.loader/...``)."""
        return {}

    def collect_stats(self) -> dict[str, Any]:
        """Stats since the last call (counters are reset)."""
        stats, self.stats = self.stats, {}
        return stats

    def on_stop(self) -> None:  # noqa: B027 - most workers have nothing to finish
        """The run is ending: finish what must outlive it (a final checkpoint, say)."""

    def close(self) -> None:  # noqa: B027 - workers without resources need nothing
        """Release sockets, environments and files. Called once, also after a failure."""
