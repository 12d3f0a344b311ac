"""What a Docker run prints of its workers (distributed/launch/docker_output.py), from Docker's
events as the engine sends them; tests/docker runs the same against a real engine."""

from __future__ import annotations

import io
import threading

from distributed.launch.docker_output import LogPrinter, container_exit, report_exits


def event(action: str, worker: str, **attributes: str) -> dict:
    labels = {"troupe.run": "r", "troupe.worker": worker}
    actor = {"Attributes": {**labels, **attributes}}
    return {"Type": "container", "Action": action, "Actor": actor}


def printed(events: list[dict], done_after: int | None = None) -> list[str]:
    out, done = io.StringIO(), threading.Event()

    def stream():
        for i, e in enumerate(events):
            if i == done_after:
                done.set()
            yield e

    report_exits(stream(), LogPrinter(out), done)
    return out.getvalue().splitlines()


def test_a_crash_and_a_container_killed_for_memory_are_told_apart():
    lines = printed([
        event("die", "actor/0", exitCode="137"),
        event("oom", "trainer/default/0"),
        event("die", "trainer/default/0", exitCode="137"),
        event("die", "policy/default/0", exitCode="1"),
    ])  # fmt: skip
    assert lines == [
        "[actor/0] its container ended: exit code 137 (SIGKILL; not the out-of-memory "
        "killer, which Docker saw none of: a docker kill?)",
        "[trainer/default/0] its container ended: exit code 137 (SIGKILL; out of memory: Docker "
        "saw the kernel's OOM killer; give it more memory)",
        "[policy/default/0] its container ended: exit code 1",
    ]


def test_the_stop_and_the_end_of_the_run_say_nothing():
    lines = printed(
        [
            event("die", "actor/0", exitCode="0"),  # left on the stop
            event("die", "controller", exitCode="1"),  # its own lines say why
            event("die", "actor/1", exitCode="137"),  # removed once the run is over
        ],
        done_after=2,
    )
    assert lines == []


def test_a_stream_closed_under_the_reader_ends_it_quietly():
    def closed():
        yield event("die", "actor/0", exitCode="143")
        raise OSError("the stream was closed")

    out = io.StringIO()
    report_exits(closed(), LogPrinter(out), threading.Event())
    assert out.getvalue() == "[actor/0] its container ended: exit code 143 (SIGTERM)\n"


def test_every_end_reaches_the_keeper_after_its_line():
    """The keeper (docker_keeper.py) hears of each worker's end and removal, the controller's
    too (the run's end), after the line that says how it ended."""
    out, heard = io.StringIO(), []
    events = [
        event("oom", "trainer/default/0"),
        event("die", "actor/0", exitCode="137"),
        event("destroy", "actor/0"),
        event("die", "controller", exitCode="0"),
    ]
    events[1]["Actor"]["ID"] = "abc"

    def on_end(action, worker, container_id):
        heard.append((action, worker, container_id, len(out.getvalue().splitlines())))

    report_exits(iter(events), LogPrinter(out), threading.Event(), on_end)
    assert heard == [
        ("die", "actor/0", "abc", 1),
        ("destroy", "actor/0", "", 1),
        ("die", "controller", "", 1),
    ]


def test_exit_codes_in_words():
    assert container_exit(0) == "exit code 0"
    assert container_exit(3) == "exit code 3"
    assert container_exit(139) == "exit code 139 (SIGSEGV)"
    assert container_exit(1, oom=True).startswith("exit code 1 (out of memory: Docker saw")
    assert (
        container_exit(137) == "exit code 137 (SIGKILL; out of memory? see docker events, or dmesg)"
    )


def test_a_stream_broken_by_the_engine_is_opened_again_from_the_last_event_read():
    """An engine's restart breaks the stream: it is opened again from the last event's time,
    and what the new one replays of that moment is not handed on twice."""
    import requests

    first = event("die", "actor/0", exitCode="137")
    first.update(id="a", timeNano=1_700_000_000_123_456_789)
    second = event("die", "actor/1", exitCode="1")
    second.update(id="b", timeNano=first["timeNano"] + 5)
    done, heard, asked = threading.Event(), [], []

    def broken():
        yield first
        raise requests.exceptions.ConnectionError("Connection aborted.")

    def reopen(since):
        asked.append(since)
        yield from (first, second)  # Docker's since is inclusive
        done.set()  # the run is over

    out = io.StringIO()
    on_end = lambda action, worker, cid: heard.append(worker)  # noqa: E731
    report_exits(broken(), LogPrinter(out), done, on_end, reopen)
    assert asked == ["1700000000.123456789"]
    assert heard == ["actor/0", "actor/1"]
    assert out.getvalue().splitlines() == [
        "[actor/0] its container ended: exit code 137 (SIGKILL; not the out-of-memory killer, "
        "which Docker saw none of: a docker kill?)",
        "[actor/1] its container ended: exit code 1",
    ]
