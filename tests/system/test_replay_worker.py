"""The replay worker role: planned for off-policy trainers, its stream over real sockets, its
rate limiting, and DQN / SAC through the runtime's serial mode."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging

import numpy as np
import pytest

from api.config import ReplayConfig, StopConfig, make_experiment, validate
from api.errors import RunFolderError
from api.namedarray import NamedArray
from api.policy import SampleBatch
from api.replay import TransitionBatch
from system.replay.buffer import ReplayBuffer
from system.replay.buffer import ReplayConfig as BufferConfig
from system.replay.rate_limiter import RateLimiterConfig
from system.roles import replay_samples_endpoint
from system.run import builders, declared
from system.run.plan import ActorPlan, ReplayPlan, TrainerPlan, plan_workers
from system.streams import transport
from system.streams.replay import InprocReplayHub, ZmqReplayClient, ZmqReplayServer
from system.streams.samples import InprocSampleHub
from system.workers import replay_worker
from system.workers.replay_worker import IDLE_WAIT_MS, SAVE_SPACING, ReplayWorker


def _segments(steps: int, batch: int, start: float = 0.0) -> SampleBatch:
    shape = (steps, batch, 1)
    return SampleBatch(
        obs=np.arange(steps * batch * 3, dtype=np.float32).reshape(steps, batch, 3) + start,
        action=np.zeros((steps, batch), dtype=np.int64),
        policy_output=NamedArray(),
        reward=np.ones(shape, dtype=np.float32),
        done=np.zeros(shape, dtype=bool),
        truncated=np.zeros(shape, dtype=bool),
        on_reset=np.zeros(shape, dtype=bool),
        policy_version=np.zeros(shape, dtype=np.int64),
    )


# ------------------------------------------------------------------------------ plan, config
def test_an_off_policy_trainer_gets_a_replay_worker_and_actors_send_to_it():
    cfg = make_experiment("cartpole-dqn")
    plans = plan_workers(cfg)
    replays = [p for p in plans if isinstance(p, ReplayPlan)]
    assert [(p.worker_id, p.policy) for p in replays] == [("replay/default", "default")]
    trainers = [i for i, p in enumerate(plans) if isinstance(p, TrainerPlan)]
    assert plans.index(replays[0]) < min(trainers)
    actor = next(p for p in plans if isinstance(p, ActorPlan) and not p.evaluation)
    assert actor.sample_endpoints(cfg) == {"default": [replay_samples_endpoint("default")]}

    ppo = make_experiment("cartpole-ppo")
    assert not [p for p in plan_workers(ppo) if isinstance(p, ReplayPlan)]
    actor = next(p for p in plan_workers(ppo) if isinstance(p, ActorPlan))
    assert actor.sample_endpoints(ppo) == {"default": ["samples/default/0"]}


def test_a_tolerance_fits_the_chunks_of_every_agent_playing_the_policy():
    """Every agent playing a policy sends its own segments: a tolerance fitted to one agent's
    passed the check before launch, and a two-agent run stopped at its first chunk."""
    cfg = make_experiment("cartpole-dqn")
    cfg.policies["default"].replay = ReplayConfig(samples_per_insert=8.0, tolerance=4096.0)
    assert validate(cfg) == []  # 32 environments x 16 frames x 8 samples a frame
    two = dataclasses.replace(cfg, agent_policies=["default", "default"])
    (error,) = validate(two)
    assert "one actor's segments (of the 2 agents it plays)" in error and "at least 8192" in error


def test_replay_config_errors_name_the_field():
    cfg = make_experiment("cartpole-dqn")
    cfg.policies["default"].replay = ReplayConfig(
        capacity_frames=500, min_size=1000, batch_size=0, gamma=1.5, samples_per_insert=-1.0
    )
    errors = validate(cfg)
    for field in ("min_size", "batch_size", "gamma", "samples_per_insert"):
        assert any(e.startswith(f"policies.default.replay.{field}") for e in errors), errors
    cfg.policies["default"].replay = ReplayConfig(samples_per_insert=8.0, tolerance=100.0)
    (error,) = validate(cfg)
    # one actor's segments (32 environments x 16 frames) times samples_per_insert (8)
    assert error.startswith("policies.default.replay.tolerance") and "at least 4096" in error
    cfg.policies["default"].replay = ReplayConfig(save_every_s=0.0)
    assert validate(cfg) == [
        "policies.default.replay.save_every_s: must be more than 0, or None to save only at the end"
    ]
    cfg.policies["default"].replay = ReplayConfig(save_every_s=None)
    assert validate(cfg) == []
    # the buffer keeps whole 16-frame segments: 62 of them (992 frames) in 1000. A min_size of
    # 1000 was never reached, and the run stalled with no error (trainer and actors both waiting)
    cfg.policies["default"].replay = ReplayConfig(capacity_frames=1000, min_size=1000)
    (error,) = validate(cfg)
    assert error.startswith("policies.default.replay.min_size: 1000 frames can never be in")
    assert "actors.segment_length=16 frames: 992 at most" in error
    cfg.policies["default"].replay = ReplayConfig(capacity_frames=1000, min_size=992)
    assert validate(cfg) == []
    # a frame budget that ends the run before the first batch: it would exit 0 untrained
    budget = dataclasses.replace(cfg, stop=StopConfig(env_frames=900))
    (error,) = validate(budget)
    assert "waits for 992 frames in the buffer, and stop.env_frames=900 ends the run" in error
    assert validate(dataclasses.replace(cfg, stop=StopConfig(env_frames=992))) == []
    # the same settings mean nothing to an on-policy trainer: not checked there
    ppo = make_experiment("cartpole-ppo")
    ppo.policies["default"].replay = cfg.policies["default"].replay
    assert not [e for e in validate(ppo) if ".replay." in e]


# ------------------------------------------------------------------------------ the stream
def test_batches_and_priorities_travel_over_sockets_and_garbage_is_dropped():
    server = ZmqReplayServer("tcp://127.0.0.1:*")
    client = ZmqReplayClient(server.endpoint)
    garbage = transport.make_socket(__import__("zmq").DEALER, server=False)
    garbage.connect(server.endpoint)
    try:
        assert client.take(timeout_ms=0) is None  # sends the first request
        transport.send(garbage, "replay_sample", {"keys": np.array([1]), "priorities": None})
        requests = []
        for _ in range(100):
            requests += server.poll(timeout_ms=50)
            if len(requests) == 2 and server.bad_messages.count:
                break
        # two requests in flight (the next batch is always on its way), no priorities yet
        assert len(requests) == ZmqReplayClient.depth == 2
        assert all(r.keys is None for r in requests)
        assert server.bad_messages.count == 1
        batch = TransitionBatch(
            obs=np.ones((4, 3), np.float32),
            action=np.arange(4),
            reward=np.ones((4, 1), np.float32),
            discount=np.full((4, 1), 0.99, np.float32),
            next_obs=np.zeros((4, 3), np.float32),
            weight=np.ones((4, 1), np.float32),
            key=np.arange(4, dtype=np.int64) + 10,
            policy_version=np.zeros((4, 1), np.int64),
        )
        server.reply(requests[0].client, batch)
        got = None
        for _ in range(100):
            got = client.take(timeout_ms=50)
            if got is not None:
                break
        assert got is not None and got.key.tolist() == [10, 11, 12, 13]
        assert np.array_equal(got.obs, batch.obs)
        client.request(got.key, np.array([1.0, 2.0, 3.0, 4.0]))  # the next request carries them
        requests = []
        for _ in range(100):
            requests += server.poll(timeout_ms=50)
            if requests:
                break
        assert requests[0].keys.tolist() == [10, 11, 12, 13]
        assert requests[0].priorities.tolist() == [1.0, 2.0, 3.0, 4.0]
    finally:
        for s in (client, server):
            s.close()
        garbage.close(linger=0)


def test_the_replay_sockets_take_no_more_than_the_run_declares():
    """The server's MAXMSGSIZE is one message of batches' priorities: a request too large for it
    never arrives (ZeroMQ drops the connection at the size header), one handing back more
    priorities than a message of batches holds is counted, and the sender's next request is
    served. The client's is the largest message the replay worker can send, and survives a
    reconnect."""
    import zmq

    config = make_experiment("cartpole-dqn", ["policies.default.replay.batch_size=4"])
    spaces = builders.probe_spaces(config)
    policy = builders.make_policy(config, "default", spaces, 0)
    rows = 4 * config.policies["default"].replay.batches_per_message
    server = ZmqReplayServer(layout=declared.priority_layout(config, "default"))
    layout = declared.batch_layout(config, spaces, policy, "default")
    client = ZmqReplayClient(server.endpoint, layout=layout)
    sender = transport.make_socket(zmq.DEALER, server=False)
    sender.connect(server.endpoint)
    try:
        many = 200_000  # 3.2 MB of keys and priorities: over the 1 MiB bound
        transport.send(
            sender, "replay_sample", {"keys": np.arange(many), "priorities": np.ones(many)}
        )
        over = {"keys": np.arange(rows + 1), "priorities": np.ones(rows + 1)}
        transport.send(sender, "replay_sample", over)
        transport.send(sender, "replay_sample", {"keys": np.arange(2), "priorities": np.ones(2)})
        requests = []
        for _ in range(200):
            requests += server.poll(timeout_ms=50)
            if requests:
                break
        assert [r.keys.tolist() for r in requests] == [[0, 1]]
        assert server.bad_messages.count == 1  # the rows + 1 keys; the 3.2 MB never arrived

        assert client.socket.getsockopt(zmq.MAXMSGSIZE) == layout.max_message_bytes
        client.reconnect(server.endpoint)
        assert client.socket.getsockopt(zmq.MAXMSGSIZE) == layout.max_message_bytes
    finally:
        for s in (client, server):
            s.close()
        sender.close(linger=0)


# ------------------------------------------------------------------------------ the worker
def _worker(samples_per_insert=None, min_size=20, prioritized=False, n_step=1, **kwargs):
    samples, hub = InprocSampleHub(), InprocReplayHub()
    buffer = ReplayBuffer(
        BufferConfig(
            capacity_frames=1000,
            prioritized=prioritized,
            n_step=n_step,
            seed=0,
            rate_limit=RateLimiterConfig(
                min_size=min_size, samples_per_insert=samples_per_insert, tolerance=40.0
            ),
        )
    )
    worker = ReplayWorker(
        "replay/p", "p", buffer, samples.consumer("p"), hub.server("p"), batch_size=8, **kwargs
    )
    return worker, samples.producer(), hub.client("p", "trainer/p/0")


def test_requests_wait_for_min_size_then_get_batches():
    worker, producer, client = _worker(min_size=20)
    assert client.take(0) is None
    producer.post("p", _segments(5, 4))  # 16 frames: below min_size
    worker.poll()
    assert client.take(0) is None and worker.stats["waiting_requests"] == 1
    producer.post("p", _segments(5, 4, start=100.0))
    worker.poll()
    batch = client.take(0)
    assert isinstance(batch, TransitionBatch) and batch.reward.shape == (8, 1)
    assert worker.stats["batches_served"] == 1


def test_the_rate_limiter_holds_the_actors_back_and_priorities_come_back():
    worker, producer, client = _worker(samples_per_insert=1.0, min_size=8, prioritized=True)
    for i in range(10):
        producer.post("p", _segments(5, 4, start=100.0 * i))  # 160 frames offered
    worker.poll()
    # no sampling yet: inserts may run only ``tolerance`` ahead of the ratio
    inserted = worker.buffer.limiter.inserted
    assert 8 <= inserted < 160 and worker.held is not None
    served = 0
    for _ in range(200):
        batch = client.take(0)
        worker.poll()
        if batch is not None:
            served += 1
            client.request(batch.key, np.full(len(batch.key), 5.0))
    assert worker.buffer.limiter.inserted == 160  # sampling let every segment in
    assert served >= 10
    assert worker.buffer._max_priority >= 5.0  # priorities reached the buffer


def test_held_back_by_the_rate_limiter_it_waits_for_a_request_instead_of_spinning():
    """With a chunk it may not insert yet, only a trainer's request makes room: the worker
    waits for one (it used to return at once, spinning a core the trainer needed)."""
    worker, producer, _ = _worker(samples_per_insert=1.0, min_size=8)
    for i in range(10):
        producer.post("p", _segments(5, 4, start=100.0 * i))
    worker.poll()
    assert worker.held is not None and not worker.waiting
    waits: list[int] = []
    poll = worker.server.poll
    worker.server.poll = lambda timeout_ms: waits.append(timeout_ms) or poll(timeout_ms)
    assert worker.poll() == 0
    assert waits == [0, IDLE_WAIT_MS]  # a look, then a wait for the next request
    assert "stage/wait_requests" in worker.stages.take()  # where its time goes says so


# ------------------------------------------------------------------------------ serial mode
@pytest.mark.parametrize(
    ("env", "policy", "trainer"),
    [("CartPole-v1", "q-network", "dqn"), ("Pendulum-v1", "sac-policy", "sac")],
)
def test_pipeline_trains_off_policy_through_the_replay_worker(env, policy, trainer):
    from api import testing

    report = testing.test_pipeline(env, policy, trainer, trainer_steps=3)
    versions = report.versions["default"]
    assert len(versions) >= 3 and versions == sorted(versions)
    assert report.trainer_steps["default"] >= 3


def test_serial_run_of_cartpole_dqn_trains_on_replayed_batches():
    from system.roles import Role
    from system.run.serial import SerialRun

    cfg = make_experiment("cartpole-dqn")
    cfg.actors = dataclasses.replace(cfg.actors, workers=1)
    cfg.evaluation = dataclasses.replace(cfg.evaluation, workers=0)
    cfg.stop = StopConfig(env_frames=20_000)
    run = SerialRun(cfg)
    try:
        progress = run.run(trainer_steps=20, env_frames=20_000)
        assert progress.trainer_steps("default") >= 20
        stats = progress.trainer_stats["default"][-1]
        assert stats["samples"] > 0 and np.isfinite(stats["loss"])
        # samples_per_insert=8 with batch 64: about one step per 8 new frames, never far more
        (replay,) = run.workers_of(Role.REPLAY)
        inserted = replay.buffer.limiter.inserted
        sampled = replay.buffer.limiter.sampled
        tolerance = replay.buffer.limiter.config.tolerance
        assert sampled <= 8 * (inserted - 1000) + tolerance
    finally:
        run.close()


@contextlib.contextmanager
def _serial_cartpole_dqn(frames: int, *overrides: str):
    """cartpole-dqn without evaluation run serially for ``frames``: its progress, its replay
    worker's rate limiter and the config."""
    from system.roles import Role
    from system.run.serial import SerialRun

    cfg = make_experiment("cartpole-dqn", list(overrides))
    cfg.evaluation = dataclasses.replace(cfg.evaluation, workers=0)
    cfg.stop = StopConfig(env_frames=frames)
    run = SerialRun(cfg)
    try:
        progress = run.run(env_frames=frames)
        (replay,) = run.workers_of(Role.REPLAY)
        yield progress, replay, cfg
    finally:
        run.close()


def test_a_serial_trainer_takes_every_step_the_rate_limiter_allows():
    """One actor of 32 environments steps 32 frames a round; samples_per_insert=8 with batches
    of 64 then allows 4 steps a round, and serial mode makes them all. (Polled once a round, the
    trainer made 1, and the limiter held three quarters of the actors' frames in the stream.)"""
    with _serial_cartpole_dqn(8_000, "policies.default.replay.batches_per_message=1") as (
        progress, replay, cfg,
    ):  # fmt: skip
        assert (cfg.actors.workers, cfg.actors.envs_per_worker) == (1, 32)
        limiter = replay.buffer.limiter
        spi, batch = limiter.config.samples_per_insert, 64
        # the actors' frames reach the buffer (none wait in the stream for the trainer) ...
        chunk = cfg.actors.segment_length * cfg.actors.envs_per_worker
        assert limiter.inserted >= progress.env_frames - 2 * chunk
        # ... and the trainer samples as much as they allow
        allowed = spi * (limiter.inserted - limiter.config.min_size) - limiter.config.tolerance
        assert limiter.sampled >= allowed - batch
        # one record a step, the steps counted by the trainer itself
        records = progress.trainer_stats["default"]
        assert len(records) == records[-1]["steps"] == limiter.sampled // batch


def test_a_serial_trainer_steps_through_messages_of_several_batches():
    """batches_per_message=4: the replay worker samples 4 batches of 64 at once, the trainer
    makes a step of each (within the round: none is left over when it ends); sampling keeps the
    rate limiter's pace."""
    with _serial_cartpole_dqn(8_000, "policies.default.replay.batches_per_message=4") as (
        progress, replay, _,
    ):  # fmt: skip
        limiter = replay.buffer.limiter
        assert limiter.sampled % (4 * 64) == 0 and replay.batches_served == limiter.sampled // 64
        records = progress.trainer_stats["default"]
        assert len(records) == records[-1]["steps"] == limiter.sampled // 64
        allowed = 8 * (limiter.inserted - limiter.config.min_size) - limiter.config.tolerance
        assert limiter.sampled >= allowed - 4 * 64


def test_the_buffer_is_saved_when_the_run_stops_and_loaded_when_it_resumes(tmp_path):
    path = tmp_path / "checkpoints" / "p" / "replay.ckpt"
    worker, producer, _ = _worker(min_size=8)
    worker.checkpoint_path = path
    for i in range(3):
        producer.post("p", _segments(5, 4, start=100.0 * i))
    worker.poll()
    worker.on_stop()
    assert path.exists() and not list(path.parent.glob("*.tmp*"))

    resumed, _, client = _worker(min_size=8)
    resumed.restore(path)
    assert resumed.buffer.size == worker.buffer.size == 48
    assert resumed.buffer.limiter.inserted == 48
    client.take(0)
    resumed.poll()
    batch = client.take(0)
    assert batch is not None and batch.obs.min() >= 0.0  # sampled from the restored segments


class _Clock:
    """Seconds that pass only when a test says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _episodes(steps: int, batch: int, start: float) -> SampleBatch:
    """Segments with episode ends and varied rewards, so n-step sums differ per transition."""
    segments = _segments(steps, batch, start)
    rng = np.random.default_rng(int(start))
    segments.reward = rng.normal(size=segments.reward.shape).astype(np.float32)
    segments.done = rng.random(segments.done.shape) < 0.2
    return segments


def test_the_buffer_is_saved_periodically_and_a_new_worker_starts_from_it(tmp_path):
    path = tmp_path / "checkpoints" / "p" / "replay.ckpt"
    clock = _Clock()
    config = dict(min_size=8, prioritized=True, n_step=3, checkpoint_path=path, clock=clock)
    worker, producer, client = _worker(save_every_s=10.0, **config)
    for i in range(3):
        producer.post("p", _episodes(6, 4, start=100.0 * i))
    worker.poll()
    client.request()
    worker.poll()
    batch = client.take(0)
    assert batch is not None
    client.request(batch.key, np.arange(1.0, 9.0))  # priorities come back with the next request
    worker.poll()
    assert worker.buffer.size == 60 and not path.exists()  # not due yet

    clock.now = 10.0
    worker.poll()
    assert path.exists() and worker.stats["saved_frames"] == 60
    assert not list(path.parent.glob("*tmp*"))
    saved_at = path.stat().st_mtime_ns
    clock.now = 30.0
    worker.poll()  # due, but nothing new came in: not written again
    assert path.stat().st_mtime_ns == saved_at

    restarted, _, _ = _worker(save_every_s=10.0, **config)  # a restart: same path, new process
    state, restored = worker.buffer.state_dict(), restarted.buffer.state_dict()
    assert sorted(restored) == sorted(state)
    for name in state:
        np.testing.assert_array_equal(restored[name], state[name], err_msg=name)
    assert restarted.buffer.size == 60 and restarted.buffer.limiter.sampled == 16
    # the same draws give the same n-step returns, discounts and priority weights
    worker.buffer._rng, restarted.buffer._rng = np.random.default_rng(1), np.random.default_rng(1)
    before, after = worker.buffer.sample(32), restarted.buffer.sample(32)
    for name in ("reward", "discount", "weight", "key", "obs", "next_obs"):
        np.testing.assert_array_equal(getattr(after, name), getattr(before, name), err_msg=name)
    assert (before.discount == 0).any() and (before.discount > 0.99**2).any()


def test_saves_are_spaced_by_their_own_duration(tmp_path):
    clock = _Clock()
    path = tmp_path / "replay.ckpt"
    worker, producer, _ = _worker(checkpoint_path=path, save_every_s=10.0, clock=clock)
    save = worker.save

    def slow_save():  # as a buffer of gigabytes takes
        save()
        clock.now += 2.0

    worker.save = slow_save
    clock.now = 10.0
    producer.post("p", _segments(5, 4))
    worker.poll()
    assert path.exists() and worker._next_save == 10.0 + SAVE_SPACING * 2.0


def test_a_full_disk_is_a_run_folder_error_and_leaves_the_last_save(tmp_path, monkeypatch):
    path = tmp_path / "replay.ckpt"
    worker, producer, _ = _worker(checkpoint_path=path, save_every_s=10.0, clock=_Clock())
    producer.post("p", _segments(5, 4))
    worker.poll()
    worker.save()
    first = path.read_bytes()
    producer.post("p", _segments(5, 4, start=50.0))
    worker.poll()

    def full(file, record):
        file.write(b"part of a buffer")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(replay_worker, "write_checkpoint", full)
    with pytest.raises(RunFolderError) as e:
        worker.save()
    assert str(e.value) == (
        f"cannot write {path}: No space left on device; free space on that disk (or move the "
        "run folder to one with room), then continue the run with `troupe run --resume RUN_DIR`"
    )
    assert path.read_bytes() == first and [p.name for p in tmp_path.iterdir()] == ["replay.ckpt"]


def test_a_damaged_save_is_reported_and_the_buffer_starts_empty(tmp_path, caplog):
    path = tmp_path / "replay.ckpt"
    path.write_bytes(b"not a checkpoint")
    (tmp_path / ".replay.ckpt.tmp-123-456").write_bytes(b"a save a kill interrupted")
    with caplog.at_level(logging.WARNING):
        worker, producer, _ = _worker(checkpoint_path=path)
    assert worker.buffer.size == 0
    assert [p.name for p in tmp_path.iterdir()] == ["replay.ckpt"]
    assert (
        f"cannot load the saved replay buffer {path} (DamagedCheckpointError: {path} is not a "
        "Troupe checkpoint (damaged or foreign))" in caplog.text
    )
    producer.post("p", _segments(5, 4))
    worker.poll()
    assert worker.buffer.size == 16  # and it fills as a new buffer does


def test_a_buffer_saved_by_an_older_run_as_npz_is_still_loaded(tmp_path):
    worker, producer, _ = _worker(min_size=8)
    producer.post("p", _segments(5, 4))
    worker.poll()
    np.savez(tmp_path / "replay.npz", **worker.buffer.state_dict())  # as runs before wrote it
    resumed, _, _ = _worker(min_size=8, checkpoint_path=tmp_path / "replay.ckpt")
    assert resumed.buffer.size == worker.buffer.size > 0
