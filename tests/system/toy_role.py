"""A worker role defined outside Troupe, whole in this one module: its plan, its builder and its
worker. ``tests/system/test_new_role.py`` runs it serially, as processes and through the cluster
generators without any other file knowing it.

The role, ``version-watch``, follows one policy's published versions through the parameter
service, as a monitoring sidecar would: each worker counts the versions it saw, reports the
newest with its heartbeat, and at the stop writes what it saw into the run folder
(``version-watch/<index>.json``). An experiment asks for it with
``roles: {version-watch: {workers: 2, policy: default}}`` and ``code.imports`` naming this file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from api.config import ExperimentConfig
from system.run.builders import Built, Wiring, register_builder
from system.run.plan import Peers, SerialOptions, WorkerPlan
from system.workers.base import Worker

ROLE = "version-watch"


@dataclass(frozen=True)
class VersionWatchPlan(WorkerPlan):
    role: ClassVar[str] = ROLE
    stop_order: ClassVar[int] = 1
    poll_order: ClassVar[int] = 2
    needs_torch: ClassVar[bool] = False
    run_folder: ClassVar[Literal["", "read", "write"]] = "write"
    """It writes the versions it saw there (``<run>/version-watch/<index>.json``)."""
    index: int = 0
    policy: str = ""

    @classmethod
    def plans_for(cls, config: ExperimentConfig) -> list[WorkerPlan]:
        args = config.roles[ROLE]
        policy = args.get("policy") or next(iter(config.policies))
        count = int(args.get("workers", 1))
        return [cls(f"{ROLE}/{i}", index=i, policy=policy) for i in range(count)]

    def peers(self, config: ExperimentConfig) -> Peers:
        return Peers(parameters=[self.policy])

    def in_serial(self, options: SerialOptions) -> WorkerPlan | None:
        return self


class VersionWatchWorker(Worker):
    role = ROLE

    def __init__(self, worker_id: str, policy: str, params: Any, out: Any):
        super().__init__(worker_id)
        self.policy, self.params, self.out = policy, params, out
        self.seen: list[int] = []

    def poll(self) -> int:
        self.stages.enter("wait_versions")
        latest = self.params.poll_latest(self.policy, timeout_s=0.01)
        if latest is None:
            return 0
        self.seen.append(int(latest[0]))
        return 1

    def reconnect(self, params: Any) -> None:
        """The parameter service restarted: follow it to its new address."""
        self.params.close()
        self.params = params

    def collect_stats(self) -> dict[str, Any]:
        return {"versions_seen": len(self.seen), "newest": self.seen[-1] if self.seen else -1}

    def on_stop(self) -> None:
        if self.out is not None:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.out.write_text(json.dumps({"versions": self.seen}))

    def close(self) -> None:
        self.params.close()


def build_version_watch(plan: VersionWatchPlan, cfg: ExperimentConfig, wiring: Wiring) -> Built:
    params = wiring.parameter_client(plan.peers(cfg).parameters or [])
    out = None if wiring.run_dir is None else wiring.run_dir / ROLE / f"{plan.index}.json"
    return Built(VersionWatchWorker(plan.worker_id, plan.policy, params, out))


register_builder(ROLE, build_version_watch)
