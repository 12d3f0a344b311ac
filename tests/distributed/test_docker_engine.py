"""The launching process of a ``--launcher docker`` run across its engine's absence
(distributed/launch/docker_engine.py), with stand-ins for the engine's answers;
tests/docker/test_engine_away.py cuts a real engine's socket."""

from __future__ import annotations

import pytest
import requests

from distributed.errors import DockerRunError
from distributed.launch.docker_engine import Engine

GONE = requests.exceptions.ConnectionError("('Connection aborted.', FileNotFoundError(2))")


class Client:
    """Answers pings once ``back`` is set; counts them."""

    def __init__(self, back: bool):
        self.back, self.pings = back, 0

    def ping(self) -> bool:
        self.pings += 1
        if not self.back:
            raise GONE
        return True


class Controller:
    """A container whose wait breaks ``breaks`` times (the engine gone), then gives ``code``."""

    def __init__(self, breaks: int, code: int = 130):
        self.breaks, self.code = breaks, code

    def wait(self) -> dict:
        if self.breaks:
            self.breaks -= 1
            raise GONE
        return {"StatusCode": self.code}


def test_a_controller_that_lived_through_the_engines_restart_is_waited_for_again():
    engine = Engine(Client(back=True), "/runs/r", wait_s=5.0)  # type: ignore[arg-type]
    assert engine.exit_code(Controller(breaks=2)) == 130  # type: ignore[arg-type]
    assert not engine.given_up


def test_an_engine_not_back_in_time_fails_the_wait_with_what_to_look_at_and_is_not_waited_again():
    client = Client(back=False)
    engine = Engine(client, "/runs/r", wait_s=0.3)  # type: ignore[arg-type]
    with pytest.raises(DockerRunError, match=r"not back in 0s.*`troupe status /runs/r`"):
        engine.exit_code(Controller(breaks=1))  # type: ignore[arg-type]
    pings = client.pings
    assert engine.given_up and not engine.back("to remove the run's containers")
    assert client.pings == pings  # the clean-up does not wait a second time


def test_an_error_of_another_kind_is_not_taken_for_the_engines_absence():
    class Refusing(Controller):
        def wait(self) -> dict:
            raise RuntimeError("not the engine's absence")

    engine = Engine(Client(back=True), "/runs/r", wait_s=5.0)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        engine.exit_code(Refusing(0))  # type: ignore[arg-type]
