"""A worker replaced by its scheduler takes over its name on the control channel at once.

A hung worker's connection can outlive it on the controller's side (a container killed by a
liveness probe, a host that vanished): its replacement connects with the same identity while the
old connection is still open. The controller's socket must hand the identity over to the new
connection; otherwise every message to the worker (configure, stop) goes to the dead one."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from api.config import make_experiment
from distributed.launch.local import ExternalLauncher
from system.errors import ControllerGoneError, PeerTimeoutError
from system.run import control_protocol as cp
from system.run.control_channel import ControlClient
from system.run.controller import Controller
from system.streams import transport


@pytest.fixture
def controller(tmp_path):
    config = make_experiment("cartpole-ppo")
    ctl = Controller(config, tmp_path, ExternalLauncher(), display=False)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            ctl._receive(timeout_ms=20)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield ctl
    stop.set()
    thread.join(timeout=5)
    ctl.server.close()
    ctl.metrics.close()


def _configured(client: ControlClient) -> bool:
    client.send(cp.Hello("actor", 1))
    received = transport.recv(client.socket, timeout_ms=10_000)
    return received is not None and isinstance(cp.parse(received[1]), cp.Configure)


def test_a_replacement_with_the_same_name_is_answered_while_the_old_one_hangs(controller):
    old = ControlClient(controller.address, "actor/1")
    clients = [old]
    try:
        assert _configured(old)
        # the old process hangs (still connected, reads nothing); its replacement says hello
        new = ControlClient(controller.address, "actor/1")
        clients.append(new)
        assert _configured(new), "the controller answered the hung connection, not the new one"
        assert controller.workers["actor/1"].restarts == 1  # counted as restarted elsewhere
    finally:
        for client in clients:
            client.close()


def test_a_replacement_that_says_hello_during_the_stop_is_told_to_stop(tmp_path):
    """The stop went to the hung process; the scheduler's replacement must get it too. It was
    configured instead, never stopped, and killed at the stop's timeout: the run's record ended
    'failed' for a worker that had done nothing wrong. One thread serves here, as in a run."""
    ctl = Controller(make_experiment("cartpole-ppo"), tmp_path, ExternalLauncher(), display=False)
    old = ControlClient(ctl.address, "actor/1")
    clients = [old]

    def answer(client: ControlClient) -> type | None:
        client.send(cp.Hello("actor", 1))
        ctl._receive(timeout_ms=5_000)
        received = transport.recv(client.socket, timeout_ms=5_000)
        return None if received is None else type(cp.parse(received[1]))

    try:
        assert answer(old) is cp.Configure
        # the shutdown asks it to stop; it hangs (reads nothing) and the wait runs out
        ctl.supervisor.stop_workers(["actor/1"], ctl.server.send, ctl._receive, timeout_s=0.2)
        new = ControlClient(ctl.address, "actor/1")  # connects with the same identity
        clients.append(new)
        assert answer(new) is cp.Stop  # its replacement, restarted by its probe
        new.send(cp.Bye())
        ctl._receive(timeout_ms=5_000)
        assert str(ctl.workers["actor/1"].state) == "stopped"
    finally:
        for client in clients:
            client.close()
        ctl.server.close()
        ctl.metrics.close()


def test_a_message_with_extra_routing_frames_is_counted_not_fatal(tmp_path):
    """A control message must carry exactly the sender's identity before its delimiter; any
    other routing (here a frame before the delimiter) is dropped and counted. On CI a message
    the controller's socket gave with no identity at all raised IndexError and ended the run."""
    ctl = Controller(make_experiment("cartpole-ppo"), tmp_path, ExternalLauncher(), display=False)
    client = ControlClient(ctl.address, "actor/0")
    try:
        transport.send(client.socket, "hello", {"pid": 1}, envelope=[b"hop"])
        ctl._receive(timeout_ms=5_000)
        assert ctl.server.bad_messages.count == 1
        assert str(ctl.workers["actor/0"].state) == "starting"  # not configured by it
        client.send(cp.Hello("actor", 1))  # a well-formed one still is
        ctl._receive(timeout_ms=5_000)
        received = transport.recv(client.socket, timeout_ms=5_000)
        assert received is not None and isinstance(cp.parse(received[1]), cp.Configure)
    finally:
        client.close()
        ctl.server.close()
        ctl.metrics.close()


def test_a_worker_that_never_reaches_a_controller_says_so_itself():
    """Nobody answered at the address (a wrong --controller, other keys): the timeout was sent
    as an error report to that nobody, and the worker exited 1 with nothing in its log."""
    client = ControlClient("tcp://127.0.0.1:1", "actor/0", timeout_s=1.0)
    try:
        with pytest.raises(ControllerGoneError, match=r"no controller answered at tcp://127"):
            client.hello("actor")
    finally:
        client.close()


def test_a_worker_told_to_wait_for_its_controller_is_configured_by_one_that_comes_late(
    tmp_path, caplog
):
    """A cluster's controller may come minutes after its workers (an image pulled, a run
    folder's lock waited for): a worker gave up after its first minute, for good on Slurm and
    against its Job's restarts on Kubernetes. Told to wait (``--controller-wait``), it waits on,
    says so, and its hello, queued meanwhile, reaches the controller that comes."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    client = ControlClient(address, "actor/0", timeout_s=1.0, first_contact_s=20.0)
    late: list[Controller] = []
    stop = threading.Event()

    def come_late() -> None:
        time.sleep(2.5)  # two of the worker's 1 s rounds
        config = make_experiment("cartpole-ppo")
        late.append(Controller(config, tmp_path, ExternalLauncher(), bind=address, display=False))
        while not stop.is_set():
            late[0]._receive(timeout_ms=20)

    thread = threading.Thread(target=come_late, daemon=True)
    thread.start()
    try:
        with caplog.at_level(logging.WARNING):
            configuration = client.hello("actor")
        assert isinstance(configuration, cp.Configure)
        assert f"no controller has answered at {address} in 1s; waiting up to 20s" in caplog.text
    finally:
        stop.set()
        thread.join(timeout=10)
        client.close()
        for ctl in late:
            ctl.server.close()
            ctl.metrics.close()


def test_a_worker_told_to_wait_gives_up_once_that_wait_is_spent():
    client = ControlClient("tcp://127.0.0.1:1", "actor/0", timeout_s=1.0, first_contact_s=3.0)
    try:
        with pytest.raises(
            ControllerGoneError, match=r"no controller answered at tcp://127\S+ in 3s"
        ):
            client.hello("actor")
    finally:
        client.close()


def test_a_lookup_of_a_peer_that_never_comes_up_blames_the_peer_not_the_controller(controller):
    """The controller answers; the trainer it waits for never registered. The message asked
    whether the controller was running."""
    client = ControlClient(controller.address, "actor/0", timeout_s=1.0)
    try:
        client.hello("actor")
        with pytest.raises(PeerTimeoutError) as e:
            client.lookup("samples/default/0")
        assert not isinstance(e.value, ControllerGoneError)
        assert "for 'samples/default/0' to register its address" in str(e.value)
    finally:
        client.close()


def _stop_with_one_never_up(
    tmp_path, never_up: str, ran_s: float, earlier_s: float = 0.0
) -> tuple[str, str | None]:
    """A wall-clock stop after ``ran_s`` of a run (resumed after ``earlier_s``) where every
    worker but ``never_up`` became ready: the stop reason and the failure the controller
    judged, if any."""
    config = make_experiment("cartpole-ppo", ["stop.wall_seconds=1"])
    ctl = Controller(config, tmp_path, ExternalLauncher(), display=False)
    try:
        for wid, record in ctl.workers.items():
            if wid != never_up:
                ctl.supervisor.on_ready(record)
        ctl.started -= ran_s + earlier_s
        ctl.session_started -= ran_s
        ctl._check_stop()
        failure = ctl.supervisor.failure
        return ctl.stop_reason, None if failure is None else str(failure)
    finally:
        ctl.server.close()
        ctl.metrics.close()


def test_a_stop_rule_met_while_a_role_never_came_up_fails_the_run(tmp_path):
    """A trainer whose container was killed before its hello (Docker does not restart it):
    the run went on to its wall-clock limit with nothing trained, and exited 0."""
    reason, failure = _stop_with_one_never_up(tmp_path, "trainer/default/0", ran_s=100.0)
    assert reason == "wall_seconds"
    assert failure.startswith(
        "worker trainer/default/0 failed: never came up in the 100s of the run"
    )
    # a resume: counted from its own start, and said so
    reason, failure = _stop_with_one_never_up(tmp_path, "trainer/default/0", 70.0, earlier_s=50)
    assert failure.startswith("worker trainer/default/0 failed: never came up in the 70s since the")


def test_a_role_with_one_worker_up_is_not_a_failure(tmp_path):
    """Two actors, one never up: a smaller run, not a run without its role."""
    reason, failure = _stop_with_one_never_up(tmp_path, "actor/1", ran_s=100.0)
    assert reason == "wall_seconds" and failure is None


def test_a_short_run_may_end_before_a_role_comes_up(tmp_path):
    """A resume of an off-policy run with a few frames left ends before its trainer is built:
    not a failure (only a run of NEVER_UP_AFTER_S or more is judged so)."""
    reason, failure = _stop_with_one_never_up(tmp_path, "trainer/default/0", ran_s=5.0)
    assert reason == "wall_seconds" and failure is None


def test_a_short_resume_of_a_long_run_may_end_before_a_role_comes_up(tmp_path):
    """A 7 s resume of a 55 s run failed: its trainer "never came up in the run's 62s"."""
    reason, failure = _stop_with_one_never_up(tmp_path, "trainer/default/0", 7.0, earlier_s=55)
    assert reason == "wall_seconds" and failure is None


def test_a_worker_of_the_runs_earlier_controller_is_told_to_leave_and_not_counted(controller):
    """A controller started again by its scheduler (Swarm, Kubernetes) may come back at the
    same address, and the workers of its earlier process reconnect and go on heartbeating. It
    counted their frames on top of the run's, and, never greeted, took them for workers that
    never came up. They are told to leave, to be started again and say hello."""
    earlier = ControlClient(controller.address, "actor/0")
    earlier.heard = True  # it spoke with the controller before this one
    try:
        earlier.heartbeat({"env_frames": 5000.0})
        with pytest.raises(ControllerGoneError, match="controller was started again"):
            earlier.wait_for(cp.Ack)
        # every read after it raises too: a wait that took the first for a peer's timeout
        # (ControllerGoneError is a PeerTimeoutError) goes no further
        with pytest.raises(ControllerGoneError, match="controller was started again"):
            earlier.stop_requested()
        assert controller.tally.env_frames == 0
        assert controller.refused == {"actor/0"}
        # the same worker started again says hello, and is configured
        again = ControlClient(controller.address, "actor/0")
        try:
            assert _configured(again)
            assert controller.workers["actor/0"].greeted
        finally:
            again.close()
    finally:
        earlier.close()


def test_a_hello_waits_past_its_timeout_while_the_controller_resolves_the_shape(
    tmp_path, monkeypatch, caplog
):
    """An environment that took two minutes to make held the controller's loop in its first
    configure, and every worker exited after its hello went unanswered for a minute. Now the
    controller answers at once and configures once the shape is resolved; the worker, answered,
    waits on past its timeout."""
    import logging

    from system.run.shape import RunShape

    made, real = threading.Event(), RunShape.resolve
    monkeypatch.setattr(RunShape, "resolve", classmethod(lambda cls, c: made.wait(60) and real(c)))
    ctl = Controller(make_experiment("cartpole-ppo"), tmp_path, ExternalLauncher(), display=False)
    ctl.shape.start()
    stop = threading.Event()

    def serve():  # the controller's loop, as far as configures go
        while not stop.is_set():
            ctl._receive(timeout_ms=20)
            ctl._configure_awaiting()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = ControlClient(ctl.address, "actor/0", timeout_s=0.5)
    got: list[cp.Configure] = []
    hello = threading.Thread(target=lambda: got.append(client.hello("actor")), daemon=True)
    try:
        with caplog.at_level(logging.INFO, logger="system.run.control_channel"):
            hello.start()
            waited = lambda: "waiting on for its configuration" in caplog.text  # noqa: E731
            _wait_until(lambda: waited() or not hello.is_alive())
            assert hello.is_alive() and not got, "configured before the shape was resolved"
            assert "actor/0" in ctl.awaiting_shape
            made.set()
            hello.join(timeout=30)
        assert got and got[0].shape is not None and not ctl.awaiting_shape
    finally:
        made.set()
        stop.set()
        thread.join(timeout=5)
        client.close()
        ctl.shape.settle()
        ctl.server.close()
        ctl.metrics.close()


def _wait_until(condition, timeout_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
