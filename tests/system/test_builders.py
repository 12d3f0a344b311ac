"""One builder per role: serial mode and process mode build the same worker from the same plan.

Process mode here is the real thing minus the OS processes: a real controller answers name
registrations and lookups on a real socket, and the roles bind and connect real ZeroMQ sockets.
"""

from __future__ import annotations

import ast
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from api.config import make_experiment
from api.errors import ConfigError
from api.policy import RolloutRequest
from distributed.launch.local import ExternalLauncher
from system.parameters.store import ParameterStore
from system.roles import Role
from system.run import builders
from system.run import serial as serial_module
from system.run import worker_process as worker_process_module
from system.run.control_channel import ControlClient
from system.run.controller import Controller
from system.run.plan import (
    PLAN_TYPES,
    ActorPlan,
    PolicyWorkerPlan,
    SerialOptions,
    plan_from_wire,
    plan_workers,
)
from system.run.serial import InprocWiring, serial_plans
from system.run.socket_wiring import Placement, SocketWiring
from system.run.worker_process import _watch_peers
from system.workers.batch_source import ReplaySource, SegmentSource


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
    if hasattr(worker, "source"):  # trainer
        source = worker.source
        out |= {
            "policy": worker.policy_name,
            "batch_segments": getattr(source, "batch_segments", None),
            "from_replay": isinstance(source, ReplaySource),
            "from_samples": isinstance(source, SegmentSource),
        }
    if hasattr(worker, "max_batch_rows"):  # policy worker
        out |= {"policy": worker.policy_name, "rows": worker.max_batch_rows}
    if hasattr(worker, "batches_served"):  # replay worker
        out |= {
            "policy": worker.policy_name,
            "batch_size": worker.batch_size,
            "buffer": worker.buffer.config,
        }
    return out


@pytest.fixture(params=["cartpole-ppo", "cartpole-dqn"])
def controller(request, tmp_path):
    """A real controller that only resolves names (an external launcher starts nothing), for an
    on-policy experiment and one whose trainer learns from a replay worker."""
    config = make_experiment(request.param, ["actors.envs_per_worker=2"])
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
    ctl.server.close()
    ctl.metrics.close()


def _socket_wiring(controller_address: str, plan, run_dir: Path, config) -> SocketWiring:
    """A worker's wiring after its hello, as a worker process has it (a controller refuses a
    worker that speaks without one: it is of an earlier controller process)."""
    client = ControlClient(controller_address, plan.worker_id)
    client.hello(str(plan.role))
    return SocketWiring(client, Placement(), run_dir, config)


def test_each_role_is_built_alike_in_serial_and_process_mode(controller, tmp_path):
    config, ctl = controller
    in_serial = {
        p.worker_id: p for p in serial_plans(config, SerialOptions(train=True, evaluation=True))
    }
    serial = InprocWiring(ParameterStore(), config)
    built_serial, built_process, wirings = {}, {}, []
    try:
        # Process mode in start order: the parameter service registers, a replay worker its
        # streams, the trainer publishes its first version, the policy worker loads it, the
        # actors find them all. Serial mode builds the same plan after each.
        for plan in plan_workers(config):
            wiring = _socket_wiring(ctl.address, plan, tmp_path, config)
            wirings.append(wiring)
            built = builders.build(plan, config, wiring).worker
            built_process[plan.worker_id] = built
            if plan.role is Role.PARAMETER_SERVICE:  # serial mode has its store instead
                assert plan.worker_id not in in_serial
                threading.Thread(target=_serve_params, args=(built,), daemon=True).start()
                continue
            if plan.role is Role.TRAINER:
                built.poll()  # publishes version 0
            assert in_serial[plan.worker_id] == plan  # the same plan, both ways
            built_serial[plan.worker_id] = builders.build(plan, config, serial).worker
        for worker_id, worker in built_serial.items():
            assert _describe(worker) == _describe(built_process[worker_id]), worker_id
        roles = {p.role for p in in_serial.values()}
        assert roles == {p.role for p in plan_workers(config)} - {Role.PARAMETER_SERVICE}
        trainer = _describe(built_serial["trainer/default/0"])
        replayed = Role.REPLAY in roles
        assert (trainer["from_replay"], trainer["from_samples"]) == (replayed, not replayed)
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


def test_a_worker_process_follows_the_peers_its_plan_looks_up():
    config = make_experiment("cartpole-dqn", ["actors.workers=2"])  # two actors, one watch each
    wiring = SimpleNamespace(parameter_client=lambda subscribe: subscribe)
    chains = {}
    for plan in plan_workers(config):
        worker = SimpleNamespace(worker_id=plan.worker_id, source=SimpleNamespace(stream="its"))
        watches = _watch_peers(None, wiring, plan.peers(config), worker)
        chains[plan.worker_id] = [type(w).__name__ for w in watches]
        for watch in watches:
            if hasattr(watch, "new_client"):  # the parameter client it would make again
                assert watch.new_client() == ([] if "trainer" in plan.worker_id else ["default"])
    actor = ["ActorPeerWatchdog"]
    assert chains == {
        "params": [],
        "replay/default": [],
        "trainer/default/0": ["ReplayWorkerWatch", "ParameterServiceWatch"],
        "policy/default/0": ["ParameterServiceWatch"],
        "actor/0": actor,
        "actor/1": actor,
        "eval/0": actor,
    }


def test_plans_cross_the_wire_typed():
    config = make_experiment("gather-2p-ppo")
    for plan in plan_workers(config):
        again = plan_from_wire(plan.role.value, plan.to_wire())
        assert again == plan and type(again) is type(plan)
    with pytest.raises(ConfigError, match=r"plan of a trainer worker: unknown fields \['polcy'\]"):
        plan_from_wire("trainer", {"worker_id": "trainer/a/0", "polcy": "a"})


@pytest.mark.parametrize("experiment", ["cartpole-ppo", "cartpole-dqn"])
def test_endpoint_names_are_made_once(experiment):
    # two actors, so that the second one's peers show the spread over policy workers
    config = make_experiment(experiment, ["policies.default.policy_workers=2", "actors.workers=2"])
    plans = plan_workers(config)
    owned = [name for p in plans for name in p.endpoints()]
    assert len(owned) == len(set(owned))  # no two workers register one name
    wanted = set()
    for plan in plans:
        peers = plan.peers(config)
        wanted |= {*peers.inference.values(), *(n for ns in peers.samples.values() for n in ns)}
        wanted |= {peers.replay_batches} - {""}
    assert wanted <= set(owned)  # everything a worker looks up, someone registers
    actor = next(p for p in plans if isinstance(p, ActorPlan) and p.index == 1)
    assert actor.peers(config).inference == {"default": "inference/default/1"}
    if experiment == "cartpole-dqn":  # the actors' samples go to the replay worker
        assert actor.peers(config).samples == {"default": ["replay/default/samples"]}
    assert [p.worker_id for p in plans if isinstance(p, PolicyWorkerPlan)] == [
        "policy/default/0",
        "policy/default/1",
    ]
    assert np.unique([p.stop_order for p in plans]).tolist() == [0, 1, 2]


def test_every_role_has_a_plan_and_a_builder():
    config = make_experiment("gather-2p-ppo")
    assert {p.role for p in plan_workers(config)} == set(Role) - {Role.REPLAY}
    assert Role.REPLAY in {p.role for p in plan_workers(make_experiment("cartpole-dqn"))}
    own = {role.value for role in Role}
    assert own <= set(PLAN_TYPES) and set(PLAN_TYPES) == set(builders.BUILDERS)
    for name, cls in PLAN_TYPES.items():
        assert str(cls.role) == name and (name not in own or isinstance(cls.role, Role))
        # Each plan class says itself what the runtime decides per role; none inherits it.
        for decision in ("stop_order", "poll_order", "needs_torch"):
            assert decision in vars(cls), f"{cls.__name__} does not set {decision}"


# Serial mode counts its progress from the actors' frames and the trainers' steps.
PROGRESS_ROLES = {"Role.ACTOR", "Role.TRAINER"}


def _role_names(module) -> set[str]:
    """The concrete plan classes and ``Role`` members a module's source names."""
    plan_classes = {cls.__name__ for cls in PLAN_TYPES.values()}
    names = set()
    for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
        if isinstance(node, ast.Name) and node.id in plan_classes:
            names.add(node.id)
        elif isinstance(node, ast.alias) and node.name in plan_classes:
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "Role":
            names.add(f"Role.{node.attr}")
    return names


def test_a_new_role_needs_no_change_to_serial_or_process_mode():
    """Adding a role touches its plan class, its builder and its worker module only: what
    serial mode and worker processes do per role, the plan classes say (the wirings connect
    streams by name). So these two modules name no plan class and no role beyond progress."""
    assert _role_names(worker_process_module) == set()
    assert _role_names(serial_module) <= PROGRESS_ROLES


def test_a_trainer_process_runs_torch_on_its_trainer_threads_and_others_on_one():
    from system.run.plan import plan_workers

    config = make_experiment("cartpole-ppo", ["policies.default.trainer_threads=3"])
    threads = {p.role.value: p.torch_threads(config) for p in plan_workers(config)}
    assert threads["trainer"] == 3
    assert threads["policy"] == threads["actor"] == 1


def test_each_policy_worker_of_a_policy_draws_its_own_actions():
    """Two policy workers answering the same batch drew the same actions: each was seeded
    with the run's seed + 1. The first still draws what a one-worker run drew."""
    config = make_experiment("cartpole-ppo")
    config.policies["default"].policy_workers = 2
    obs = np.zeros((256, 4), dtype=np.float32)

    def actions(index: int) -> np.ndarray:
        plan = PolicyWorkerPlan(f"policy/default/{index}", policy="default", index=index)
        worker = builders.build(plan, config, InprocWiring(ParameterStore(), config)).worker
        request = RolloutRequest(obs=obs, on_reset=np.ones((256, 1), dtype=bool))
        return np.asarray(worker.policy.rollout(request).action)

    first, second = actions(0), actions(1)
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(actions(0), first)  # each stream replays
    single = builders.make_policy(config, "default", builders.probe_spaces(config), config.seed + 1)
    request = RolloutRequest(obs=obs, on_reset=np.ones((256, 1), dtype=bool))
    np.testing.assert_array_equal(np.asarray(single.rollout(request).action), first)
