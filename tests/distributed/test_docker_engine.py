"""The launching process of a ``--launcher docker`` run across its engine's absence
(distributed/launch/docker_engine.py), with stand-ins for the engine's answers;
tests/docker/test_engine_away.py cuts a real engine's socket."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from distributed.errors import DockerRunError
from distributed.launch.docker_engine import Engine
from distributed.launch.docker_output import EventStreams
from distributed.launch.docker_run import _stop_in_order, _wait_until_it_takes_signals
from distributed.launch.signals import EXIT_INTERRUPTED

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


class Stopping(Controller):
    """A controller container that ends with 130 once it got SIGINT; its ``kill`` meets the
    engine's absence ``kill_breaks`` times first; its ``wait(timeout)`` blocks that long when
    it got no signal (docker-py's read timeout is a ConnectionError, as the absence's)."""

    def __init__(self, kill_breaks: int):
        super().__init__(breaks=0)
        self.kill_breaks, self.signals, self.status, self.reloads = kill_breaks, [], "running", 0

    def kill(self, signal: str) -> None:
        if self.kill_breaks:
            self.kill_breaks -= 1
            raise GONE
        self.signals.append(signal)

    def wait(self, timeout: float | None = None) -> dict:
        if not self.signals:
            time.sleep(timeout or 0)
            raise requests.exceptions.ConnectionError("Read timed out.")
        return {"StatusCode": self.code}

    def reload(self) -> None:
        self.reloads += 1
        if self.reloads == 1:
            raise GONE


class Keeper:
    def __init__(self):
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


def test_a_ctrl_c_in_the_engines_restart_stops_the_run_in_order_once_it_answers():
    controller, keeper = Stopping(kill_breaks=2), Keeper()
    engine = Engine(Client(back=True), "/runs/r", wait_s=5.0)  # type: ignore[arg-type]
    assert _stop_in_order(controller, keeper, engine) == 130  # type: ignore[arg-type]
    assert controller.signals == ["SIGINT"] and keeper.stopped


def test_a_ctrl_c_with_the_engine_gone_for_good_ends_as_interrupted_and_says_why(caplog):
    engine = Engine(Client(back=False), "/runs/r", wait_s=0.3)  # type: ignore[arg-type]
    controller = Stopping(kill_breaks=1)
    assert _stop_in_order(controller, Keeper(), engine) == EXIT_INTERRUPTED  # type: ignore[arg-type]
    assert "was not back in 0s" in caplog.text and engine.given_up


def test_a_controller_that_does_not_stop_in_time_is_a_timeout_not_the_engines_absence(caplog):
    client = Client(back=True)
    engine = Engine(client, "/runs/r", wait_s=5.0)  # type: ignore[arg-type]
    with pytest.raises(TimeoutError, match="did not end in 0s"):
        engine.exit_code(Stopping(kill_breaks=0), timeout_s=0.2)  # type: ignore[arg-type]
    assert client.pings == 0 and "does not answer" not in caplog.text


def test_the_wait_for_the_controllers_loop_goes_on_across_the_engines_absence(tmp_path):
    controller = Stopping(kill_breaks=0)
    controller.status = "exited"  # read once the engine answers: the wait ends
    engine = Engine(Client(back=True), str(tmp_path), wait_s=5.0)  # type: ignore[arg-type]
    _wait_until_it_takes_signals(controller, tmp_path, time.time(), engine)  # type: ignore[arg-type]
    assert controller.reloads == 2


def test_an_event_stream_opened_as_the_run_ends_is_closed_at_once():
    class Stream:
        closed = False

        def close(self) -> None:
            self.closed = True

    class Events:
        def events(self, **_) -> Stream:
            return Stream()

    streams = EventStreams(Events(), {}, threading.Event())  # type: ignore[arg-type]
    first = streams.since(None)
    streams.close()
    late = streams.since("1.0")  # the reader's reopen, racing the end
    assert first.closed and late.closed  # type: ignore[attr-defined]


def test_a_ctrl_c_in_the_wait_for_the_engine_is_the_runs_stop_but_gives_up_the_clean_up():
    """Raised on, the first Ctrl+C stops the run in order (:func:`_stop_in_order` waits for the
    engine in turn); only in the clean-up does it end the wait, saying what is left."""

    class Interrupted(Client):
        def ping(self) -> bool:
            raise KeyboardInterrupt

    engine = Engine(Interrupted(back=False), "/runs/r", wait_s=5.0)  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        engine.exit_code(Controller(breaks=1))  # type: ignore[arg-type]
    assert not engine.given_up
    assert not engine.back("to remove the run's containers", ctrl_c_gives_up=True)
    assert engine.given_up


def unready() -> Exception:
    import docker

    response = requests.Response()
    response.status_code = 503
    explanation = "This node is not a swarm manager."
    return docker.errors.APIError("503 Server Error", response=response, explanation=explanation)


def test_an_engine_that_answers_but_is_not_ready_yet_is_asked_again(caplog):
    """A swarm manager just after its engine's restart answers pings, and 503 to the rest:
    `deploy swarm --wait` ended there in a traceback."""
    answers = [unready(), unready(), 7]

    def call() -> int:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    engine = Engine(Client(back=True), "r", wait_s=10.0)  # type: ignore[arg-type]
    assert engine.across(call, "for the run's controller") == 7
    assert caplog.text.count("answers but is not ready (This node is not a swarm manager.)") == 1


def test_an_engine_not_ready_in_time_fails_with_its_reason():
    def call() -> None:
        raise unready()

    engine = Engine(Client(back=True), "r", wait_s=0.5)  # type: ignore[arg-type]
    with pytest.raises(DockerRunError, match=r"not ready for 0s \(This node is not a swarm"):
        engine.across(call, "for the run's controller")
