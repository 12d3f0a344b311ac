"""The controller's name service, without a socket: what it answers, to whom, and when."""

from __future__ import annotations

from system.run.control_protocol import LookupResult, Moved
from system.run.name_service import NameService


def test_a_lookup_before_the_owner_registers_waits_for_it():
    names = NameService()
    assert names.lookup("params/request", "trainer/default/0") == []
    assert names.lookup("params/request", "policy/default/0") == []
    answers = names.register("params/request", "tcp://h:1")
    assert answers == [
        ("trainer/default/0", LookupResult("params/request", "tcp://h:1")),
        ("policy/default/0", LookupResult("params/request", "tcp://h:1")),
    ]
    assert names.lookup("params/request", "actor/0") == [
        ("actor/0", LookupResult("params/request", "tcp://h:1"))
    ]  # known now: answered at once


def test_a_new_registration_tells_everyone_who_looked_the_name_up():
    names = NameService()
    names.register("params/push", "tcp://h:1")
    names.lookup("params/push", "policy/default/0")
    names.lookup("params/push", "policy/default/1")
    names.lookup("inference/default/0", "actor/0")  # another name: not told
    moved = names.register("params/push", "tcp://h:2")
    assert moved == [
        ("policy/default/0", Moved("params/push", "tcp://h:2")),
        ("policy/default/1", Moved("params/push", "tcp://h:2")),
    ]
    assert names.endpoints["params/push"] == "tcp://h:2"


def test_a_forgotten_name_is_waited_for_until_its_owner_is_back():
    names = NameService()
    names.register("samples/default/0", "tcp://h:1")
    names.forget(["samples/default/0"])  # its trainer is restarting
    assert "samples/default/0" not in names.endpoints
    assert names.lookup("samples/default/0", "actor/3") == []  # not the dead address
    out = names.register("samples/default/0", "tcp://h:9")
    assert ("actor/3", LookupResult("samples/default/0", "tcp://h:9")) in out
    assert ("actor/3", Moved("samples/default/0", "tcp://h:9")) in out  # it watches the name
