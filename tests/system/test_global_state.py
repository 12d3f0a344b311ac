"""The run's global key/value state: versions, compare-and-set, what a worker is sent, the run
folder's copy, and malformed or unauthorised writes, over a real controller socket."""

from __future__ import annotations

import time

import msgpack
import pytest
from served import PollingThread

from api import global_state as api_state
from api.config import make_experiment
from api.global_state import GlobalStateError
from system.errors import WireError
from system.run.control_channel import ControlClient
from system.run.control_protocol import StateResult, StateWrite
from system.run.controller import Controller
from system.run.coordination.state import STATE_FILE, StateReplica, StateStore
from system.streams import transport


def test_versions_count_writes_per_key_and_cas_needs_the_current_one():
    store = StateStore()
    assert store.get("a") == (None, 0)
    assert store.set("a", {"x": 1}) == 1
    assert store.compare_and_set("a", 2, expected_version=0) == (False, 1)
    assert store.get("a") == ({"x": 1}, 1)  # the failed write changed nothing
    assert store.compare_and_set("a", 2, expected_version=1) == (True, 2)
    assert store.compare_and_set("b", (1, 2), expected_version=0) == (True, 1)
    assert store.items() == {"a": (2, 2), "b": ([1, 2], 1)}
    assert store.revision == 3


def test_a_worker_gets_only_what_changed_since_its_revision():
    store = StateStore()
    store.set("a", 1)
    snapshot = store.snapshot()
    store.set("b", 2)
    assert store.changes_since(snapshot["revision"]) == {"revision": 2, "entries": {"b": [2, 1]}}
    assert store.changes_since(2) is None
    assert store.changes_since(99)["entries"] == {"a": [1, 1], "b": [2, 1]}  # foreign: all
    replica = StateReplica()
    replica.apply(snapshot)
    replica.apply(store.changes_since(replica.revision))
    assert replica.items() == store.items()


@pytest.mark.parametrize(
    "value, message",
    [
        ({1: "a"}, "value: dict key 1 is not a str"),
        ({"a": [object()]}, "value['a'][0]: a object is not plain msgpack data"),
        (b"x" * (70 << 10), "more than the 65536 a global state value may hold"),
        (2**70, "does not fit in 64 bits"),
    ],
)
def test_values_must_be_small_plain_msgpack_data(value, message):
    with pytest.raises(GlobalStateError, match=message.replace("[", r"\[").replace("]", r"\]")):
        StateStore().set("k", value)


def test_the_state_survives_in_the_run_folder(tmp_path):
    store = StateStore()
    store.set("stage", {"index": 2})
    store.set("blob", b"\x00\x01")
    store.save(tmp_path)
    again = StateStore.load(tmp_path)
    assert again.items() == store.items() and again.revision == store.revision
    (tmp_path / STATE_FILE).write_bytes(b"\xc1 not msgpack")
    with pytest.raises(GlobalStateError, match=r"is damaged .* delete it to resume"):
        StateStore.load(tmp_path)


@pytest.mark.parametrize(
    "body, message",
    [
        ([1, 2], "the body must be a mapping"),
        ({"id": "1", "key": "k", "value": 1}, "'id' must be an int"),
        ({"id": 1, "key": "", "value": 1}, "key '': must be a non-empty str"),
        ({"id": 1, "key": "k", "value": 1, "expected_version": -1}, "'expected_version' must be"),
        ({"id": 1, "key": "k"}, "has no 'value'"),
        ({"id": 1, "key": "k", "value": 1, "extra": 0}, r"unknown fields \['extra'\]"),
    ],
)
def test_malformed_writes_are_refused_naming_the_field(body, message):
    with pytest.raises(WireError, match=message):
        StateWrite.from_body(body)


def test_replica_refuses_a_malformed_update():
    replica = StateReplica()
    with pytest.raises(WireError, match="is not \\[value, version\\]"):
        replica.apply({"revision": 1, "entries": {"k": "v"}})
    assert replica.items() == {}


class Pump(PollingThread):
    """Runs the controller's message loop on a thread (its socket is used only there)."""

    def __init__(self, controller: Controller):
        self.controller = controller
        super().__init__(lambda: controller._receive(timeout_ms=20))


def test_workers_read_trainers_write_and_bad_writes_never_stop_the_controller(tmp_path):
    config = make_experiment("cartpole-curriculum")
    controller = Controller(config, tmp_path, launcher=None, display=False)
    pump = Pump(controller)
    clients: list[ControlClient] = []
    try:
        trainer = ControlClient(controller.address, "trainer/default/0", timeout_s=20)
        actor = ControlClient(controller.address, "actor/0", timeout_s=20)
        clients += [trainer, actor]
        trainer.hello("trainer")
        actor.hello("actor")
        # the curriculum driver's first stage came with the configuration
        assert actor.state.get("curriculum/stage") == ({"index": 0, "stage": 0}, 1)

        assert trainer.state.set("league/x", {"a": 1}) == 1
        assert trainer.state.compare_and_set("league/x", 2, expected_version=0) == (False, 1)
        assert trainer.state.compare_and_set("league/x", 2, expected_version=1) == (True, 2)

        transport.send(trainer.socket, "state_write", {"id": 99, "key": "", "value": 1})
        reply = trainer.wait_for(StateResult)
        assert reply.ok is False and "must be a non-empty str" in str(reply.error)
        transport.send(trainer.socket, "state_write", ["not", "a", "mapping"])  # refused, counted
        with pytest.raises(GlobalStateError, match="only trainers and the controller"):
            actor.state.set("league/x", 3)

        deadline = time.monotonic() + 20
        while actor.state.get("league/x")[1] != 2:  # the actor's copy follows its heartbeats
            assert time.monotonic() < deadline, actor.state.items()
            actor.heartbeat({})
            actor.stop_requested()
            time.sleep(0.05)
        assert actor.state.get("league/x") == (2, 2)
        assert controller.coordination.bad_writes.count == 2
        assert controller.server.bad_messages.count == 1  # the body that was not a mapping

        assert api_state.global_state() is controller.coordination.store  # for callbacks
        controller.coordination.on_record({})  # a metrics record saves the state
        saved = msgpack.unpackb((tmp_path / STATE_FILE).read_bytes())
        assert saved["entries"]["league/x"][:2] == [2, 2]
    finally:
        for client in clients:  # before the controller: they leave when it is gone
            client.close()
        pump.stop()
        controller.coordination.close()
        controller.server.close()
