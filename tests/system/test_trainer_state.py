"""A trainer's own state (its optimiser) goes through the parameter service, not a file of its own.

Real CartPole segments, the registered actor-critic policy and PPO trainer, a real
:class:`ParameterServer` on sockets with the layout a run declares, and real trainer workers: the
first trains and persists a version, which carries its Adam state to the service; the service
writes it beside the checkpoint; a restarted service and new trainers (two, as the ranks of a
data-parallel group restore) get exactly that state back.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from served import ServedInThread
from test_bad_messages import SEGMENT, real_segments

from api.config import make_experiment
from api.errors import UserError
from system.errors import WireError
from system.parameters import trainer_state
from system.parameters.checkpoint_file import load_checkpoint_file
from system.parameters.client import ParameterClient
from system.parameters.inproc import InprocParameterService
from system.parameters.service import ParameterServer
from system.parameters.store import TRAINER_FILE, ParameterStore
from system.run import builders, declared
from system.streams import validation, wire
from system.streams.samples import InprocSampleHub
from system.streams.validation import HEADROOM_BYTES
from system.workers.trainer_group import GroupTrainerWorker
from system.workers.trainer_worker import LEGACY_TRAINER_FILE, TrainerWorker, segment_source

TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def run():
    config = make_experiment(
        "cartpole-ppo",
        [f"actors.segment_length={SEGMENT}", "actors.envs_per_worker=4"],
    )
    return config, builders.probe_spaces(config)


class Served(ServedInThread):
    """A run's parameter service (durable store on ``root``, declared layout), polled by a
    thread, and a client limited as a worker's is."""

    def __init__(self, config, root):
        self.layout = declared.params_layout(config)
        store = ParameterStore(root, durable=True)
        store.load_from_disk()  # a restarted service resumes from the run folder
        super().__init__(ParameterServer(store, shm_dir=None, layout=self.layout))

    def client(self, limit: bool = True) -> ParameterClient:
        bound = self.layout.max_message_bytes if limit else None
        return ParameterClient(self.server.request_endpoint, shm=False, max_message_bytes=bound)


def trainer_worker(config, spaces, params, root, cls=TrainerWorker, seed=0) -> TrainerWorker:
    policy = builders.make_policy(config, "default", spaces, seed)
    hub = InprocSampleHub()
    trainer = builders.make_trainer(config, "default", policy)
    worker = cls(
        "trainer/default/0",
        "default",
        trainer,
        segment_source(hub.consumer("default"), "default", trainer, 4),
        params,
        checkpoint_every=1,
        checkpoint_dir=root / "checkpoints",
    )
    worker.hub = hub
    return worker


def optimizer_state(worker: TrainerWorker) -> dict:
    return worker.trainer.get_checkpoint()["optimizer"]


def assert_same_optimizer(got: dict, want: dict) -> None:
    assert got["param_groups"] == want["param_groups"]
    assert sorted(got["state"]) == sorted(want["state"])
    for index, slots in want["state"].items():
        assert sorted(got["state"][index]) == sorted(slots)
        for name, tensor in slots.items():
            other = got["state"][index][name]
            assert isinstance(other, torch.Tensor), (index, name, type(other))
            assert other.dtype == tensor.dtype and torch.equal(other, tensor), (index, name)


def test_the_trainer_state_is_shipped_persisted_and_restored_by_the_service(run, tmp_path):
    config, spaces = run
    served = Served(config, tmp_path)
    first = trainer_worker(config, spaces, served.client(), tmp_path)
    try:
        for chunk in real_segments(config, spaces, 2):
            first.hub.producer().post("default", chunk)
        for _ in range(200):
            if first.poll():
                break
        assert first.steps == 1 and first.trainer.policy.version == 1
        shipped = optimizer_state(first)
        assert shipped["state"], "PPO's Adam has state after a step"
        exp_avg = shipped["state"][0]["exp_avg"]
        assert exp_avg.abs().sum() > 0  # a real moment, not zeros a broken restore could match
    finally:
        first.close()
        served.close()
    folder = tmp_path / "checkpoints" / "default"
    assert not (folder / LEGACY_TRAINER_FILE).exists()  # the trainer wrote nothing itself
    record = load_checkpoint_file(folder / TRAINER_FILE, field="trainer")
    assert record["policy"] == "default" and record["version"] == 1
    assert (folder / "v00000001.ckpt").is_file()  # beside the version it came with

    restarted = Served(config, tmp_path)  # the service restarts too: the state is on disk
    ranks = []
    try:
        for _rank in (0, 1):  # every rank of a group restores from the service, rank 1 too
            params = restarted.client()
            worker = trainer_worker(config, spaces, params, tmp_path, GroupTrainerWorker, seed=9)
            ranks.append(worker)
            assert not optimizer_state(worker)["state"]  # a fresh optimiser
            version, checkpoint = params.get("default")
            assert version == 1
            worker.restore(checkpoint)
            assert worker.trainer.policy.version == 1
            assert_same_optimizer(optimizer_state(worker), shipped)
            assert worker.trainer.get_checkpoint()["steps"] == 1
        assert restarted.server.stats["trainer_state_gets"] == 2
    finally:
        for worker in ranks:
            worker.close()
        restarted.close()


def _train_one_step(worker: TrainerWorker, config, spaces) -> None:
    for chunk in real_segments(config, spaces, 2):
        worker.hub.producer().post("default", chunk)
    for _ in range(200):
        if worker.poll():
            return
    raise AssertionError("no trainer step")


def test_a_restored_trainer_counts_its_steps_on_from_its_state(run, tmp_path):
    """A resumed run's (or a restarted trainer's) steps go on from the trainer's restored
    count: ``stop.trainer_steps``, PBT's intervals and the callbacks read the run's steps, not
    this process's (which started from 0 again)."""
    config, spaces = run
    served = Served(config, tmp_path)
    try:
        first = trainer_worker(config, spaces, served.client(), tmp_path)
        for _ in range(2):
            _train_one_step(first, config, spaces)
        assert first.steps == first.stats["steps"] == 2  # each version persists its state here
        first.close()
    finally:
        served.close()
    resumed = Served(config, tmp_path)  # a resumed run's service: the state is on disk
    try:
        again = trainer_worker(config, spaces, resumed.client(), tmp_path)
        again.restore(resumed.client().get("default")[1])
        again.mark_published()  # as the builder does: version 2 is the service's already
        _train_one_step(again, config, spaces)
        assert again.steps == again.stats["steps"] == 3
        again.close()
    finally:
        resumed.close()


def _stateless(worker: TrainerWorker) -> TrainerWorker:
    """The worker's trainer as one that keeps nothing of its own (the default get_checkpoint):
    its own count starts from 0 in every process."""
    worker.trainer.get_checkpoint = dict
    worker.trainer.load_checkpoint = lambda checkpoint: None
    return worker


def test_a_trainer_that_keeps_no_state_still_counts_its_steps_on(run, tmp_path, caplog):
    """The worker saves its step count beside the trainer's state: a trainer whose
    get_checkpoint() returns {} restarted trainer_steps from 0 on every resume, and the log said
    its (empty) state was restored."""
    config, spaces = run
    served = Served(config, tmp_path)
    try:
        first = _stateless(trainer_worker(config, spaces, served.client(), tmp_path))
        for _ in range(2):
            _train_one_step(first, config, spaces)
        assert first.steps == 2
        first.close()
    finally:
        served.close()
    resumed = Served(config, tmp_path)
    try:
        again = _stateless(trainer_worker(config, spaces, resumed.client(), tmp_path))
        with caplog.at_level("INFO", logger="system.workers.trainer_worker"):
            again.restore(resumed.client().get("default")[1])
        assert "version 2 restored at step 2; its trainer keeps no state" in caplog.text
        assert "trainer state of version" not in caplog.text
        again.mark_published()
        _train_one_step(again, config, spaces)
        assert again.steps == again.stats["steps"] == 3
        again.close()
    finally:
        resumed.close()


def test_a_bare_trainer_state_of_an_older_run_is_still_read():
    """Run folders written before the envelope hold the tagged state alone."""
    state = {"optimizer": {"state": {0: {"exp_avg": torch.ones(2)}}}, "steps": 7}
    bare = wire.decode(wire.encode("s", trainer_state.to_wire(state))).body
    got, steps = trainer_state.unwrap(bare)
    assert steps is None and got["steps"] == 7
    assert torch.equal(got["optimizer"]["state"][0]["exp_avg"], torch.ones(2))
    wrapped = wire.decode(wire.encode("s", trainer_state.wrap(state, 12))).body
    got, steps = trainer_state.unwrap(wrapped)
    assert steps == 12 and got["steps"] == 7
    with pytest.raises(UserError, match="reserved"):
        trainer_state.to_wire({trainer_state.STEPS: 1})


def test_an_older_runs_trainer_pt_is_still_read_when_the_service_has_none(run, tmp_path):
    config, spaces = run
    served = Served(config, tmp_path)
    try:
        params = served.client()
        old = trainer_worker(config, spaces, params, tmp_path)
        old.trainer.step(_batch(config, spaces))
        legacy = {"version": 1, "trainer": old.trainer.get_checkpoint()}
        folder = tmp_path / "checkpoints" / "default"
        folder.mkdir(parents=True)
        torch.save(legacy, folder / LEGACY_TRAINER_FILE)  # as trainers of older runs wrote it
        old.close()
        params = served.client()
        worker = trainer_worker(config, spaces, params, tmp_path, seed=9)
        assert params.trainer_state("default") is None
        worker.restore(None)
        assert_same_optimizer(optimizer_state(worker), legacy["trainer"]["optimizer"])
        worker.close()
    finally:
        served.close()


def _batch(config, spaces):
    from system.workers.trajectory import take_columns

    batch, _ = take_columns(real_segments(config, spaces, 2), 4)
    return batch


def test_a_trainer_state_over_the_limit_is_refused_with_the_reason(run, tmp_path):
    config, _ = run
    served = Served(config, tmp_path)
    try:
        layout = served.layout
        policy = builders.make_policy(config, "default", builders.probe_spaces(config), 0)
        version = policy.get_checkpoint()
        limit = layout.max_message_bytes
        huge = {"moments": np.zeros(limit // 8 + 1, np.float64)}
        with served.client() as client, pytest.raises(UserError, match="over the parameter"):
            client.publish("default", 1, version, persist=True, trainer_state=huge)
        # A client without the bound: the service refuses a state over the policy's own bound
        # (that still fits under its socket's, which allows for the float32 parameters too).
        elements = validation.elements(layout.policies["default"])
        over = layout.max_trainer_state_bytes("default") + HEADROOM_BYTES + 2 * elements
        big = {"moments": np.zeros(over // 8, np.float64)}
        with served.client(limit=False) as client:
            with pytest.raises(WireError, match="more than its limit"):
                client.publish("default", 1, version, persist=True, trainer_state=big)
            with pytest.raises(WireError, match="does not persist"):
                client.publish("default", 1, version, persist=False, trainer_state={"a": 1})
            assert client.trainer_state("default") is None
        assert not (tmp_path / "checkpoints" / "default" / TRAINER_FILE).exists()
    finally:
        served.close()


def test_the_wire_form_keeps_int_keys_tensors_and_arrays_apart():
    state = {
        "state": {0: {"step": torch.tensor(3.0), "m": torch.ones(2, 3)}},
        "groups": [{"betas": (0.9, 0.99), "params": [0, 1]}],
        "stats": np.arange(3),
    }
    sent = wire.encode("publish", {"trainer_state": trainer_state.to_wire(state)})
    back = trainer_state.from_wire(wire.decode(sent).body["trainer_state"])
    assert list(back["state"]) == [0] and isinstance(back["state"][0]["m"], torch.Tensor)
    assert torch.equal(back["state"][0]["m"], state["state"][0]["m"])
    assert back["groups"] == state["groups"] and isinstance(back["groups"][0]["betas"], tuple)
    assert isinstance(back["stats"], np.ndarray) and back["stats"].flags.writeable
    with pytest.raises(UserError, match="reserved"):
        trainer_state.to_wire({"~tensor": 1})


def test_versions_are_published_every_publish_every_steps_and_checkpoints_always(run, tmp_path):
    """``publish_every=3`` with checkpoints every 4 versions: the service sees versions 3, 4
    (persisted), 6, 8 (persisted), 9, and at stop the last one, 10."""
    config, spaces = run
    store = ParameterStore(tmp_path, durable=True)
    worker = trainer_worker(config, spaces, InprocParameterService(store), tmp_path)
    worker.checkpoint_every, worker.publish_every = 4, 3
    seen = []
    try:
        for chunk in real_segments(config, spaces, 20):
            worker.hub.producer().post("default", chunk)
        while worker.steps < 10:
            if worker.poll():
                seen.append(store.latest_version("default"))
        worker.on_stop()
        seen.append(store.latest_version("default"))
    finally:
        worker.close()
    published = sorted({v for v in seen if v})
    assert published == [3, 4, 6, 8, 9, 10], seen
    folder = tmp_path / "checkpoints" / "default"
    assert sorted(int(p.stem[1:]) for p in folder.glob("v*.ckpt")) == [4, 8, 10]


def test_a_version_is_checkpointed_once_every_seconds_have_passed_whatever_the_count(
    run, tmp_path, monkeypatch
):
    """Checkpoints came only every ``checkpoint.every`` versions: a trainer with slow steps
    (big batches, a CPU) went minutes between them, all of which a run killed at once (a
    preempted Slurm job, ``kubectl delete``) lost. ``checkpoint.every_seconds`` bounds that
    time. Here the worker's clock moves 100 s a step (version 1 at its start), and versions
    are persisted every 1,000 by count and every 250 s by time: 4 (300 s in), 7 and 10."""
    from system.workers import trainer_worker as tw

    config, spaces = run
    clock = [1000.0]
    monkeypatch.setattr(tw.time, "monotonic", lambda: clock[0])
    store = ParameterStore(tmp_path, durable=True)
    worker = trainer_worker(config, spaces, InprocParameterService(store), tmp_path)
    worker.checkpoint_every, worker.checkpoint_every_s = 1000, 250.0
    try:
        for chunk in real_segments(config, spaces, 20):
            worker.hub.producer().post("default", chunk)
        while worker.steps < 10:
            clock[0] += 100.0 if worker.poll() else 0.0
        worker.on_stop()
    finally:
        worker.close()
    folder = tmp_path / "checkpoints" / "default"
    assert sorted(int(p.stem[1:]) for p in folder.glob("v*.ckpt")) == [4, 7, 10]
