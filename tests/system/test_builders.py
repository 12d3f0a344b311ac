"""One builder per role: serial mode and process mode build the same worker from the same plan.

Process mode here is the real thing minus the OS processes: a real controller answers name
registrations and lookups on a real socket, and the roles bind and connect real ZeroMQ sockets.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from api.config import make_experiment
from api.errors import ConfigError
from distributed.launch.local import ExternalLauncher
from system.parameters.store import ParameterStore
from system.run import builders
from system.run.control_channel import ControlClient
from system.run.controller import Controller
from system.run.plan import (
    ActorPlan,
    ParameterServicePlan,
    PolicyWorkerPlan,
    Role,
    TrainerPlan,
    plan_from_wire,
    plan_workers,
)
from system.run.serial import InprocWiring
from system.run.worker_process import Placement, SocketWiring


def _describe(worker) -> dict:
    """What a worker is, apart from how it reaches its peers."""
    out = {"type": type(worker).__name__, "id": worker.worker_id}
    if hasattr(worker, "envs"):  # actor
        out |= {
            "envs": len(worker.envs),
            "groups": len(worker.groups),
            "seed": worker.seed,
            "evaluation": worker.is_evaluation,
            "validate": worker.validate_actions,
            "paced": worker.pace is not None,
            "policies": sorted({s.policy for env in worker.slots for s in env}),
        }
    if hasattr(worker, "batch_segments"):  # trainer
        out |= {"policy": worker.policy_name, "batch_segments": worker.batch_segments}
    if hasattr(worker, "max_batch_rows"):  # policy worker
        out |= {"policy": worker.policy_name, "rows": worker.max_batch_rows}
    return out


@pytest.fixture
def controller(tmp_path):
    """A real controller that only resolves names (an external launcher starts nothing)."""
    config = make_experiment("cartpole-ppo", ["actors.envs_per_worker=2"])
    ctl = Controller(config, tmp_path, ExternalLauncher(), display=False)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            ctl._receive(timeout_ms=20)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield config, ctl
    stop.set()
    thread.join(timeout=5)
    ctl.socket.close(linger=0)
    ctl.metrics.close()


def _socket_wiring(controller_address: str, worker_id: str, run_dir: Path, config) -> SocketWiring:
    return SocketWiring(ControlClient(controller_address, worker_id), Placement(), run_dir, config)


def test_each_role_is_built_alike_in_serial_and_process_mode(controller, tmp_path):
    config, ctl = controller
    plans = {p.worker_id: p for p in plan_workers(config)}
    serial = InprocWiring(ParameterStore())
    built_serial, built_process, wirings = {}, {}, []
    try:
        # Process mode in start order: the parameter service registers, the trainer publishes
        # its first version, the policy worker loads it, the actor finds both.
        for worker_id in ("params", "trainer/default/0", "policy/default/0", "actor/0", "eval/0"):
            plan = plans[worker_id]
            wiring = _socket_wiring(ctl.address, worker_id, tmp_path, config)
            wirings.append(wiring)
            built = builders.build(plan, config, wiring).worker
            built_process[worker_id] = built
            if isinstance(plan, ParameterServicePlan):
                threading.Thread(target=_serve_params, args=(built,), daemon=True).start()
                continue
            if isinstance(plan, TrainerPlan):
                built.poll()  # publishes version 0
            built_serial[worker_id] = builders.build(plan, config, serial).worker
        for worker_id, worker in built_serial.items():
            assert _describe(worker) == _describe(built_process[worker_id]), worker_id
        assert _describe(built_serial["eval/0"])["paced"]  # evaluation's max_fps, both modes
        assert not _describe(built_serial["actor/0"])["paced"]
    finally:
        for worker in [*built_serial.values(), *built_process.values()]:
            worker.close()
        for wiring in wirings:
            wiring.ctl.close()


def _serve_params(worker) -> None:
    try:
        while True:
            worker.poll()
    except Exception:  # closed by the test's teardown
        return


def test_plans_cross_the_wire_typed():
    config = make_experiment("gather-2p-ppo")
    for plan in plan_workers(config):
        again = plan_from_wire(plan.role.value, plan.to_wire())
        assert again == plan and type(again) is type(plan)
    with pytest.raises(ConfigError, match=r"plan of a trainer worker: unknown fields \['polcy'\]"):
        plan_from_wire("trainer", {"worker_id": "trainer/a/0", "polcy": "a"})


def test_endpoint_names_are_made_once():
    config = make_experiment("cartpole-ppo", ["policies.default.policy_workers=2"])
    plans = plan_workers(config)
    owned = [name for p in plans for name in p.endpoints()]
    assert len(owned) == len(set(owned))  # no two workers register one name
    actor = next(p for p in plans if isinstance(p, ActorPlan) and p.index == 1)
    wanted = [*actor.inference_endpoints(config).values()]
    wanted += [n for names in actor.sample_endpoints(config).values() for n in names]
    assert set(wanted) <= set(owned)  # everything an actor looks up, someone registers
    by_role = {p.role for p in plans}
    assert by_role == set(Role) - {Role.REPLAY}  # an on-policy trainer takes segments itself
    assert Role.REPLAY in {p.role for p in plan_workers(make_experiment("cartpole-dqn"))}
    assert [p.worker_id for p in plans if isinstance(p, PolicyWorkerPlan)] == [
        "policy/default/0",
        "policy/default/1",
    ]
    assert np.unique([p.stop_order for p in plans]).tolist() == [0, 1, 2]
