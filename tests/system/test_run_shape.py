"""A run's shape (system.run.shape): resolved once by the controller, sent in every configure, so
no worker builds an environment or a network it does not run."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from served import PollingThread

from api import registry
from api.config import make_experiment
from distributed.launch.local import ExternalLauncher
from legacy.environment.gym_adapter import GymnasiumEnvironment
from system.errors import WireError
from system.parameters.store import ParameterStore
from system.run import builders
from system.run.control_channel import ControlClient
from system.run.controller import Controller
from system.run.plan import ParameterServicePlan, PolicyWorkerPlan, TrainerPlan
from system.run.serial import InprocWiring
from system.run.shape import RunShape, space_from_wire, space_to_wire
from system.run.socket_wiring import Placement, SocketWiring
from system.streams import wire

ROOT = Path(__file__).resolve().parents[2]


class CountedCartPole(GymnasiumEnvironment):
    """CartPole that counts how often it is built in this process."""

    built = 0

    def __init__(self):
        CountedCartPole.built += 1
        super().__init__("CartPole-v1")


@pytest.mark.parametrize(
    "experiment",
    ["cartpole-ppo", "cartpole-dqn", "pendulum-sac", "gather-2p-ppo", "memory-gru-ppo"],
)
def test_a_shape_comes_back_from_the_wire_as_it_was(experiment):
    shape = RunShape.of(make_experiment(experiment))
    body = wire.decode(wire.encode("configure", {"shape": shape.to_wire()})).body["shape"]
    assert RunShape.from_wire(body) == shape


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
        gym.spaces.Box(np.zeros((2, 2)), np.array([[1, 2], [3, 4]]), dtype=np.float64),
        gym.spaces.Box(0, 255, (84, 84, 4), np.uint8),
        gym.spaces.Discrete(5, start=-2),
        gym.spaces.MultiDiscrete([3, 4]),
        gym.spaces.MultiBinary(7),
        gym.spaces.Dict({"grid": gym.spaces.Box(0, 1, (3, 3)), "mask": gym.spaces.MultiBinary(4)}),
        gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(-1, 1, (2,)))),
    ],
    ids=lambda s: type(s).__name__,
)
def test_every_space_kind_travels(space):
    body = wire.decode(wire.encode("s", space_to_wire(space))).body
    assert space_from_wire(body) == space


def test_a_space_without_a_wire_form_leaves_the_shape_to_the_workers():
    with pytest.raises(TypeError, match="Text space has no wire form"):
        space_to_wire(gym.spaces.Text(5))
    with pytest.raises(WireError, match="shape is malformed"):
        RunShape.from_wire({"observation": [{"cube": 3}]})
    broken = make_experiment("cartpole-ppo")
    broken.environment = dataclasses.replace(broken.environment, type="no-such-environment")
    assert RunShape.resolve(broken) is None  # the workers fail on it, each with its error


def test_a_configuration_its_environment_refutes_is_the_resolvers_to_say():
    """Every worker would fail on it: the resolver keeps it for the controller, which ends the
    run with it, and hands no shape out."""
    from api.errors import ConfigError
    from system.run import shape

    refuted = make_experiment("gather-2p-ppo", ["environment.args.n_agents=3"])
    with pytest.raises(ConfigError, match="lists 2 policies but environment"):
        RunShape.resolve(refuted)
    resolver = shape.ShapeResolver(refuted)
    resolver.start()
    resolver.settle()
    assert "has 3 agents" in str(resolver.refused) and resolver.get() is None
    fitting = shape.ShapeResolver(make_experiment("gather-2p-ppo"))
    assert fitting.get() is not None and fitting.refused is None


@pytest.fixture
def counted(tmp_path):
    registry.register_environment("counted-cartpole", CountedCartPole, override=True)
    config = make_experiment("cartpole-ppo", ["environment.type=counted-cartpole"])
    CountedCartPole.built = 0
    ctl = Controller(config, tmp_path, ExternalLauncher(), display=False)
    pump = PollingThread(lambda: ctl._receive(timeout_ms=20))  # its socket is used only there
    yield config, ctl
    pump.stop()
    ctl.server.close()
    ctl.metrics.close()
    registry.environments.unregister("counted-cartpole")


def _configured(address: str, worker_id: str, role: str, run_dir: Path, config) -> SocketWiring:
    client = ControlClient(address, worker_id)
    conf = client.hello(role)
    shape = None if conf.shape is None else RunShape.from_wire(conf.shape)
    return SocketWiring(client, Placement(), run_dir, config, shape)


def test_the_controller_builds_the_one_environment_and_the_workers_none(counted, tmp_path):
    config, ctl = counted
    assert CountedCartPole.built == 0  # resolved at the first need: a run's while it starts
    wirings, workers, server = [], [], None
    try:
        params = _configured(ctl.address, "params", "parameter_service", tmp_path, config)
        wirings.append(params)
        assert CountedCartPole.built == 1  # the controller's, for the spaces
        service = builders.build(ParameterServicePlan("params"), config, params).worker
        workers.append(service)
        server = PollingThread(service.poll)
        trainer = _configured(ctl.address, "trainer/default/0", "trainer", tmp_path, config)
        wirings.append(trainer)
        plan = TrainerPlan("trainer/default/0", policy="default")
        workers.append(builders.build(plan, config, trainer).worker)
        workers[-1].poll()  # publishes its first version
        policy = _configured(ctl.address, "policy/default/0", "policy", tmp_path, config)
        wirings.append(policy)
        plan = PolicyWorkerPlan("policy/default/0", policy="default")
        workers.append(builders.build(plan, config, policy).worker)
        assert CountedCartPole.built == 1  # a trainer and a policy worker built none
    finally:
        if server is not None:  # its last poll returns before the service is closed
            server.stop()
        for w in workers:
            w.close()
        for w in wirings:
            w.ctl.close()
    serial = InprocWiring(ParameterStore(), config)  # one process: one probe for all
    assert serial.spaces is serial.spaces and CountedCartPole.built == 2


def _maps_torch(pid: int) -> bool:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return "libtorch" in maps or "torch/_C" in maps


@pytest.mark.multiprocess
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/<pid>/maps")
def test_the_parameter_service_process_never_loads_torch(tmp_path):
    """A fresh process (as a container or a Slurm step starts one), not a forkserver's child:
    what the worker itself imports is what its memory holds."""
    config = make_experiment("cartpole-ppo")
    ctl = Controller(config, tmp_path, ExternalLauncher(), display=False)
    procs = {}
    try:
        for worker_id, role in (("params", "parameter_service"), ("trainer/default/0", "trainer")):
            code = (
                "from system.run import worker_process; "
                f"raise SystemExit(worker_process.main({worker_id!r}, {role!r}, {ctl.address!r}))"
            )
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            procs[role] = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env)
        deadline = time.monotonic() + 120
        while not {"params/request", "samples/default/0"} <= set(ctl.names.endpoints):
            assert time.monotonic() < deadline, ctl.names.endpoints
            assert all(p.poll() is None for p in procs.values())
            ctl._receive(timeout_ms=50)
        assert not _maps_torch(procs["parameter_service"].pid)
        assert _maps_torch(procs["trainer"].pid)  # the check sees torch where it is
    finally:
        for p in procs.values():
            p.kill()
            p.wait(timeout=10)
        ctl.server.close()
        ctl.metrics.close()


def test_a_stopped_controller_waits_for_a_shape_still_being_resolved(monkeypatch):
    """A run stopped a second after it started exited while the shape's thread was still in
    torch building a network: the process died of SIGABRT after writing its summary."""
    from system.run import shape

    slow = RunShape.resolve
    monkeypatch.setattr(RunShape, "resolve", classmethod(lambda cls, c: time.sleep(0.5) or slow(c)))
    resolver = shape.ShapeResolver(make_experiment("cartpole-ppo"))
    resolver.start()
    resolver.settle()
    assert resolver._done and not resolver._thread.is_alive()


def test_a_configure_waits_for_a_shape_slow_to_resolve_and_the_loop_does_not(monkeypatch):
    """An environment that took two minutes to make held the controller's loop in its first
    ``configure`` that long: every worker, its hello unanswered for a minute, exited saying no
    controller answered. The loop now asks :meth:`ready` and holds the configure back; once
    resolved, the shape goes in it. One under way past ``max_s`` is given up on: configures go
    without it (their workers resolve it)."""
    from system.run import shape

    made = threading.Event()
    real = RunShape.resolve
    monkeypatch.setattr(RunShape, "resolve", classmethod(lambda cls, c: made.wait(60) and real(c)))
    config = make_experiment("cartpole-ppo")
    assert shape.ShapeResolver(config).max_s == config.liveness.max_build_s == 900.0
    resolver = shape.ShapeResolver(config, max_s=600.0)
    resolver.start()
    assert not resolver.ready()
    made.set()
    resolver.settle()
    assert resolver.ready()
    resolved = resolver.get()
    assert resolved is not None and list(resolved["requests"]) == ["default"], resolved
    assert RunShape.from_wire(resolved).spaces.action == [gym.spaces.Discrete(2)]
    made.clear()
    hung = shape.ShapeResolver(config, max_s=0.0)  # under way past its bound at once
    hung.start()
    assert hung.ready() and hung.get() is None
    made.set()
    hung.settle()
