"""Messages that decode fine but do not fit the run: each is dropped and counted, never a crash.

Real CartPole environments, the registered actor-critic policy and PPO trainer, and the real
ZeroMQ streams, with the layouts the worker processes build (:mod:`system.run.declared`). Each
test sends good and bad messages side by side and checks that the good ones are served.
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
import zmq
from test_parameter_service import Service, shm_dir  # noqa: F401 (a fixture)

from api.config import make_experiment
from api.namedarray import NamedArray
from api.policy import RolloutRequest
from system.errors import WireError
from system.parameters.inproc import InprocParameterService
from system.parameters.service import ParameterServer
from system.parameters.store import ParameterStore
from system.run import builders, declared
from system.streams import transport
from system.streams.inference import InprocInferenceHub, ZmqInferenceClient, ZmqInferenceServer
from system.streams.samples import InprocSampleHub, ZmqSampleConsumer
from system.workers.actor_worker import ActorWorker
from system.workers.policy_worker import PolicyWorker
from system.workers.trainer_worker import TrainerWorker, segment_source

SEGMENT = 8


@pytest.fixture(scope="module")
def run():
    config = make_experiment(
        "cartpole-ppo",
        [
            f"actors.segment_length={SEGMENT}",
            "actors.envs_per_worker=4",
            "evaluation.envs_per_worker=2",
            "policies.default.batch_segments=4",
        ],
    )
    spaces = builders.probe_spaces(config)
    return config, spaces


def request(rows: int, obs: np.ndarray | None = None) -> RolloutRequest:
    rng = np.random.default_rng(rows)
    return RolloutRequest(
        obs=rng.normal(size=(rows, 4)).astype(np.float32) if obs is None else obs,
        is_evaluation=np.zeros((rows, 1), bool),
        on_reset=np.ones((rows, 1), bool),
        client_id=np.arange(rows).reshape(rows, 1),
        request_id=np.ones((rows, 1), np.int64),
    )


def bad_requests() -> list[RolloutRequest]:
    nan = request(2)
    nan.obs[1, 2] = np.nan
    missing = request(2)
    missing.on_reset = None
    return [
        request(2, np.zeros((2, 5), np.float32)),  # wrong shape: crashed concatenate on main
        request(2, np.zeros((2, 4), np.complex64)),  # wrong dtype
        request(0, np.zeros((0, 4), np.float32)),  # no rows
        request(5, np.zeros((5, 4), np.float32)),  # more rows than an actor of this run asks
        request(2, NamedArray(a=np.zeros((2, 4), np.float32))),  # a structure, not an array
        nan,
        missing,
    ]


def test_policy_worker_drops_requests_that_do_not_fit_and_answers_the_rest(run):
    config, spaces = run
    policy = builders.make_policy(config, "default", spaces, 0)
    layout = declared.request_layout(config, spaces, policy, "default")
    assert layout.max_rows == 4
    server = ZmqInferenceServer(layout=layout)
    worker = PolicyWorker("policy/default/0", "default", policy, server, None)
    client = ZmqInferenceClient({"default": server.endpoint})
    try:
        bad = bad_requests()
        client.post("default", 0, 1, request(2))
        for i, r in enumerate(bad):
            client.post("default", 0, 2 + i, r)
        client.post("default", 1, 99, request(3))
        replies, deadline = [], time.monotonic() + 10
        while len(replies) < 2 and time.monotonic() < deadline:
            worker.poll()
            replies += client.poll(timeout_ms=10)
        assert sorted((r.group, r.seq) for r in replies) == [(0, 1), (1, 99)]
        assert [len(r.result.action) for r in sorted(replies, key=lambda r: r.seq)] == [2, 3]
        assert server.bad_messages.count == len(bad)
    finally:
        client.close()
        worker.close()


def real_segments(config, spaces, count: int, hooks=None) -> list:
    """Chunks of segments as a real actor records them, answered by a real policy worker
    (``hooks``: the actor's callbacks, if any)."""
    hub, samples = InprocInferenceHub(), InprocSampleHub()
    policy = builders.make_policy(config, "default", spaces, 1)
    worker = PolicyWorker("p", "default", policy, hub.server("default"), None)
    actor = ActorWorker(
        "actor/0",
        builders.env_factory(config),
        2,
        config.policy_of_agent,
        hub.client("actor/0"),
        samples.producer(),
        segment_length=SEGMENT,
        groups=1,
        hooks=hooks,
    )
    queue = samples.queues["default"]
    while len(queue) < count:
        actor.poll()
        worker.poll()
    actor.close()
    return [queue.popleft() for _ in range(count)]


def bad_segments(good) -> list:
    def edited(**fields):
        chunk = good[:, :]
        for name, value in fields.items():
            setattr(chunk, name, value)
        return chunk

    k = good.reward.shape[1]
    nan_reward = good.reward.copy()
    nan_reward[3, 0, 0] = np.nan
    inf_obs = good.obs.copy()
    inf_obs[0, 0, 1] = np.inf
    return [
        edited(obs=np.zeros((0,), np.float32)),  # zero-length obs: crashed the trainer on main
        good[:0],  # zero steps
        good[:-1],  # one step short of segment_length + 1
        good[:, :0],  # zero segments
        edited(obs=np.zeros((SEGMENT + 1, k, 5), np.float32)),
        edited(action=good.action.astype(np.float64)),  # an integer action space
        edited(reward=nan_reward),
        edited(obs=inf_obs),
        edited(policy_output=None),
    ]


def test_trainer_drops_segments_that_do_not_fit_and_trains_on_the_rest(run):
    config, spaces = run
    good = real_segments(config, spaces, 2)
    policy = builders.make_policy(config, "default", spaces, 0)
    layout = declared.segment_layout(config, spaces, policy, "default")
    consumer = ZmqSampleConsumer(layout=layout)
    learner = builders.make_trainer(config, "default", policy)
    trainer = TrainerWorker(
        "trainer/default/0",
        "default",
        learner,
        segment_source(consumer, "default", learner, 4),
        InprocParameterService(ParameterStore()),
    )
    sender = transport.make_socket(zmq.DEALER, server=False, hwm=100)
    sender.connect(consumer.endpoint)
    try:
        bad = bad_segments(good[0])
        for chunk in [good[0], *bad, good[1]]:
            transport.send(sender, "samples", {"segment": chunk})
        deadline = time.monotonic() + 20
        while trainer.steps < 1 and time.monotonic() < deadline:
            trainer.poll()
        assert trainer.steps == 1
        assert consumer.bad_messages.count == len(bad)
    finally:
        sender.close(linger=0)
        trainer.close()


@pytest.fixture
def service(run, tmp_path):
    config, _ = run
    layout = declared.params_layout(config)
    server = ParameterServer(ParameterStore(tmp_path), shm_dir=None, layout=layout)
    yield server
    server.close()


def serve(server: ParameterServer, until, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not until() and time.monotonic() < deadline:
        server.poll(20)


INTRUDER = """
import sys, time, zmq
sock = zmq.Context().socket(zmq.XSUB)
sock.connect(sys.argv[1])
sock.send(b"\\x01" + b"d" * 1_000_000)
sock.send(b"\\x01\\xff not a policy")
time.sleep(1)
"""


def test_an_oversized_subscription_never_reaches_the_parameter_service(service):
    """On main one 50 MB subscription took the service down (ZeroMQ keeps every topic it is
    sent); here a 1 MB one shows the bound. The intruder runs in a process of its own: libzmq
    4.3.5's XSUB itself crashes on closing with so long a topic."""
    honest = transport.context().socket(zmq.SUB)
    try:
        subprocess.run([sys.executable, "-c", INTRUDER, service.push_endpoint], timeout=60)
        honest.connect(service.push_endpoint)
        honest.setsockopt(zmq.SUBSCRIBE, b"default")
        serve(service, lambda: service.subscriber_count() >= 1)
        serve(service, lambda: False, timeout_s=0.3)  # whatever else arrives, arrives now
        assert service.subscriber_count() == 1
        assert service.subscriber_count("default") == 1
    finally:
        honest.close(linger=0)


def test_the_parameter_service_stores_only_checkpoints_laid_out_as_declared(run, tmp_path):
    config, spaces = run
    checkpoint = builders.make_policy(config, "default", spaces, 0).get_checkpoint()
    model = checkpoint["model"]
    first = next(iter(model))
    wrong_shape = {**checkpoint, "model": {**model, first: np.zeros((3, 3), np.float32)}}
    missing = {**checkpoint, "model": {k: v for k, v in model.items() if k != first}}
    layout = declared.params_layout(config)
    service = Service(ParameterStore(tmp_path), subscribe=(), shm=False, layout=layout)
    try:
        for params in (wrong_shape, missing, {"version": 1}, [1, 2]):
            with pytest.raises(WireError, match="parameters of 'default'"):
                service.client.publish("default", 1, params, timeout_s=10)
        with pytest.raises(WireError, match="not trained in this run"):
            service.client.publish("other", 1, checkpoint, timeout_s=10)
        service.client.publish("default", 1, checkpoint, timeout_s=10)
        assert service.server.store.latest_version("default") == 1
        assert service.server.stats["bad_messages"] == 5
    finally:
        service.close()


@pytest.mark.usefixtures("shm_dir")
def test_a_version_refused_for_its_layout_is_said_through_shared_memory_too(run, tmp_path):
    """A version that does not fit the run's layout is refused for that, whichever way it
    came. Through a shared-memory file, the client took any refusal for the file's fault:
    sent without waiting, the version was dropped without a word, and the reason came out
    only once the client had given shared memory up and sent one over the socket."""
    config, spaces = run
    checkpoint = builders.make_policy(config, "default", spaces, 0).get_checkpoint()
    model = checkpoint["model"]
    first = next(iter(model))
    wrong = {**checkpoint, "model": {**model, first: np.zeros((3, 3), np.float32)}}
    layout = declared.params_layout(config)
    service = Service(ParameterStore(tmp_path), subscribe=(), layout=layout)
    client = service.client
    try:
        assert service.server.shm is not None
        client.publish("default", 1, checkpoint, timeout_s=10)
        assert client.shm_peer is not None and client.stats["shm_publishes"] == 1
        with pytest.raises(WireError, match="parameters of 'default'"):
            client.publish("default", 2, wrong, timeout_s=10)
        client.publish_nowait("default", 2, wrong, timeout_s=10)
        with pytest.raises(WireError, match="parameters of 'default'"):
            client.settle()
        assert client.stats["shm_failures"] == 0 and client.shm_peer is not None
        client.publish_nowait("default", 2, checkpoint, timeout_s=10)
        client.settle()
        assert service.server.store.latest_version("default") == 2
        assert client.stats["shm_publishes"] == 2
    finally:
        service.close()


def test_an_oversized_request_never_reaches_the_parameter_service(service):
    sender = transport.context().socket(zmq.DEALER)
    try:
        sender.connect(service.request_endpoint)
        sender.send_multipart([b"", b"x" * 50_000_000])
        sender.send_multipart([b"", b"\xc1 small junk"])
        serve(service, lambda: service.stats["bad_messages"] >= 1)
        serve(service, lambda: False, timeout_s=0.3)
        assert service.stats["bad_messages"] == 1  # the small junk; the 50 MB never arrived
    finally:
        sender.close(linger=0)
