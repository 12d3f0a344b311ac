"""The parameter-service worker: the versioned parameter store and its server, as a worker role.

The server itself (:class:`~system.parameters.service.ParameterServer`) knows nothing of runs;
this wrapper gives it the same loop, heartbeats and supervision as every other role.
"""

from __future__ import annotations

from typing import Any

from system.parameters.service import ParameterServer
from system.roles import Role
from system.workers.base import Worker


class ParameterServiceWorker(Worker):
    """Polls the parameter server; its stats are the server's counters."""

    role = Role.PARAMETER_SERVICE

    def __init__(self, worker_id: str, server: ParameterServer):
        super().__init__(worker_id)
        self.server = server

    def poll(self) -> int:
        """Stages: ``wait_requests`` (no traffic), ``serve`` (publishes, requests, pushes,
        checkpoint files)."""
        self.stages.enter("wait_requests")
        self.server.wait(timeout_ms=50)
        self.stages.enter("serve")
        return self.server.poll(timeout_ms=0)

    def collect_stats(self) -> dict[str, Any]:
        return {k: int(v) for k, v in self.server.stats.items()}

    def close(self) -> None:
        self.server.close()
