"""The control channel's messages (system.run.control_protocol): every kind survives the wire,
a body that does not fit is refused naming the kind and the field, and no module spells a kind
but the protocol."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from system.errors import WireError
from system.run import control_protocol as cp
from system.streams import wire

ROOT = Path(__file__).resolve().parents[2]

EXAMPLES = [
    cp.Hello("actor", 12),
    cp.Register("inference/default/0", "tcp://10.0.0.2:5000"),
    cp.Lookup("params/request"),
    cp.Ready(),
    cp.Heartbeat({"env_frames": 64, "episodes": [{"episode_return": 1.5}]}, 3),
    cp.Heartbeat({}),
    cp.Error("ValueError: no", "Traceback...", "ValueError", True),
    cp.Signalled("SIGTERM"),
    cp.Bye(),
    cp.StateWrite(7, "curriculum/stage", {"index": 1}, 2),
    cp.Configure({"name": "x"}, "/runs/x", {"worker_id": "actor/0"}, {"revision": 0}),
    cp.LookupResult("params/request", "tcp://10.0.0.1:6000"),
    cp.Ack(),
    cp.Ack({"revision": 2, "entries": {"k": [1, 1]}}),
    cp.Moved("params/push", "tcp://10.0.0.3:6001"),
    cp.Stop(),
    cp.Stop(alone=True),
    cp.StateResult(7, True, "curriculum/stage", 3),
    cp.StateResult(None, False, error="refused"),
    cp.Refused("'x' is not a worker of this run"),
]


def test_every_kind_has_an_example_here():
    assert {type(m) for m in EXAMPLES} == set(cp.KINDS.values())


@pytest.mark.parametrize("message", EXAMPLES, ids=[f"{m.kind}-{i}" for i, m in enumerate(EXAMPLES)])
def test_every_message_comes_back_as_it_was_sent(message):
    frames = wire.encode(message.kind, message.body())
    assert cp.parse(wire.decode(frames)) == message


@pytest.mark.parametrize(
    "kind, body, error",
    [
        ("hello", {"role": "actor"}, "'hello' message has no 'pid'"),
        ("hello", {"role": "actor", "pid": "12"}, "'pid' must be an int, got '12'"),
        ("hello", {"role": "actor", "pid": True}, "'pid' must be an int"),
        ("heartbeat", {"stats": []}, "'stats' must be a dict"),
        ("heartbeat", {"stats": {}, "state_revision": 1.5}, "must be an int or None"),
        ("error", {"message": "m", "fatal": "yes"}, "'fatal' must be a bool"),
        ("register", {"name": "a", "address": "b", "extra": 1}, r"unknown fields \['extra'\]"),
        ("stop", [1], "the body must be a mapping"),
        ("state_write", {"id": 1, "key": "", "value": 1}, "must be a non-empty str"),
        ("state_write", {"id": 1, "key": "k", "value": object}, "not plain msgpack data"),
        ("state_write", {"id": 1, "key": "k", "value": 1, "expected_version": -1}, ">= 0"),
        ("ack", {"state": "all of it"}, "'state' must be a dict or None"),
        ("shutdown", {}, "unknown control message kind 'shutdown'"),
    ],
)
def test_a_body_that_does_not_fit_is_refused_naming_the_field(kind, body, error):
    with pytest.raises(WireError, match=error):
        cp.parse(wire.Message(kind, body))


def test_defaults_fill_what_an_older_sender_leaves_out():
    assert cp.parse(wire.Message("error", {"message": "m"})) == cp.Error("m", "", "", False)
    assert cp.parse(wire.Message("heartbeat", {"stats": {}})).state_revision is None


def test_messages_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        cp.Stop().kind = "bye"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cp.Hello("actor", 1).pid = 2  # type: ignore[misc]


def _kind_literals(path: Path, root: Path = ROOT) -> list[str]:
    """Where ``path`` sends or compares a control kind as a string: a ``send``/``wait_for``
    call with one as an argument, or ``<x>.kind == "<kind>"``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            args = [a for a in node.args if isinstance(a, ast.Constant)]
            if name in ("send", "wait_for") and any(a.value in cp.KINDS for a in args):
                found.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node)}")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            kinds = [s for s in sides if isinstance(s, ast.Constant) and s.value in cp.KINDS]
            if kinds and any(getattr(s, "attr", "") == "kind" for s in sides):
                found.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_module_of_the_control_channel_spells_a_kind():
    """The roles and the run speak through the dataclasses only (the parameter service and the
    streams have protocols of their own, with kinds of the same names)."""
    files = sorted((ROOT / "system" / "run").glob("*.py")) + sorted(
        (ROOT / "system" / "workers").glob("*.py")
    )
    spelled = [hit for f in files if f.name != "control_protocol.py" for hit in _kind_literals(f)]
    assert spelled == []


def test_the_check_finds_a_spelled_kind(tmp_path):
    (tmp_path / "bad.py").write_text('ctl.send("bye", {})\nif m.kind == "stop":\n    pass\n')
    assert len(_kind_literals(tmp_path / "bad.py", tmp_path)) == 2
