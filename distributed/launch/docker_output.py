"""What a Docker run prints besides the controller's own lines: each worker container's output,
prefixed with its id and rate-limited, and how a worker container that ended early ended.

Inside its container the controller sees only that a worker went silent (it runs with the
``ExternalLauncher``), so a container killed for memory looked like any crash there; Docker's
``oom`` and ``die`` events, read here on the host, say which it was.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TextIO

from distributed.launch.signals import signal_name

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container

CONTROLLER_ID = "controller"
LABEL_RUN, LABEL_WORKER = "troupe.run", "troupe.worker"
RETRY_S = 1.0
"""How often a stream of the engine that broke (its restart) is opened again."""


def engine_gone(error: BaseException) -> bool:
    """Whether ``error`` says the Docker engine did not answer (its socket gone, the connection
    refused or cut: a restart), not that it answered with a refusal."""
    import requests
    import urllib3

    broken = (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError,
              urllib3.exceptions.ProtocolError)  # fmt: skip
    return isinstance(error, broken)


class LogPrinter:
    """Prints the containers' output: the controller's lines as they are, the workers' prefixed
    with their id and limited to ``per_window`` lines per ``window_s`` each, so a worker stuck in
    an error loop cannot flood the terminal."""

    def __init__(self, out: TextIO, per_window: int = 20, window_s: float = 10.0):
        self.out, self.per_window, self.window_s = out, per_window, window_s
        self._lock = threading.Lock()
        self._windows: dict[str, tuple[float, int]] = {}

    def line(self, worker_id: str, text: str) -> None:
        if worker_id == CONTROLLER_ID:
            self._write(text)
            return
        now = time.monotonic()
        start, count = self._windows.get(worker_id, (now, 0))
        if now - start > self.window_s:
            if count > self.per_window:
                self._write(f"[{worker_id}] ... {count - self.per_window} lines not shown")
            start, count = now, 0
        self._windows[worker_id] = (start, count + 1)
        if count < self.per_window:
            self._write(f"[{worker_id}] {text}")

    def always(self, worker_id: str, text: str) -> None:
        """A line of our own about a worker, never held back by its window."""
        self._write(f"[{worker_id}] {text}")

    def _write(self, text: str) -> None:
        with self._lock:
            self.out.write(text + "\n")
            self.out.flush()


def follow_logs(container: Container, worker_id: str, printer: LogPrinter, done: threading.Event):
    """Stream a container's output until ``done``; after a restart (Docker's, or one of a
    container stopped by hand, which the keeper starts again), follow the new process; after
    the engine's absence, go on from the last line seen."""
    since: float | None = None
    while not done.is_set():
        try:
            for chunk in container.logs(stream=True, follow=True, since=since):
                for text in chunk.decode(errors="replace").splitlines():
                    printer.line(worker_id, text)
                since = time.time()
            since = time.time()
            container.reload()
        except Exception as e:
            if not engine_gone(e):  # removed under the stream
                return
            done.wait(RETRY_S)
            continue
        done.wait(0.5 if container.status in ("running", "restarting", "created") else 2.0)


def report_exits(
    events: Iterable[dict],
    printer: LogPrinter,
    done: threading.Event,
    on_end: Callable[[str, str, str], None] | None = None,
    reopen: Callable[[str], Iterable[dict]] | None = None,
) -> None:
    """Say how each worker container that ended early ended, from Docker's ``oom`` and ``die``
    events: the controller inside sees only that a worker went silent, and a container killed
    for memory looked like any crash. A worker that leaves on the stop (exit 0) says nothing;
    nor does anything after ``done`` (the containers removed at the end). ``on_end(action,
    worker, container id)`` is called for every ``die`` and ``destroy`` of a worker's container
    (the controller's too: ``controller``).

    ``reopen(since)``: the events again from ``since`` (Docker's timestamp of the last one read,
    or this host's clock at the first), once the stream broke or ended before ``done``: an
    engine's restart. Without it, the keeper missed every worker's end from then on."""
    seen = _Seen()
    killed_for_memory: set[str] = set()
    while True:
        try:
            for event in events:
                if done.is_set():
                    return
                if not seen.again(event):  # read once handled: the keeper's call may break
                    _report(event, printer, killed_for_memory, on_end)
                    seen.read(event)
        except Exception as e:  # the stream closed under us at the end of the run, or broke
            if done.is_set() or reopen is None or not engine_gone(e):
                return
        if reopen is None or done.wait(RETRY_S):
            return
        try:
            events = reopen(seen.since())
        except Exception as e:
            if not engine_gone(e):
                return
            events = ()


class EventStreams:
    """The streams of Docker's events that a run's exits are read from: the first, and one
    opened again after each engine restart (:func:`report_exits`'s ``reopen``), all closed at
    the run's end. A stream opened as the run ended, which the closing did not see, is closed
    as it opens: it blocked the thread that read it for good, with no event left to come."""

    def __init__(self, client: docker.DockerClient, filters: dict, done: threading.Event):
        self.client, self.filters, self.done = client, filters, done
        self._open: list = []
        self._lock = threading.Lock()

    def since(self, since: str | None) -> Iterable[dict]:
        """The events from ``since`` (None: from now)."""
        stream = self.client.events(decode=True, filters=self.filters, since=since)
        with self._lock:
            self._open.append(stream)
            if self.done.is_set():
                stream.close()
        return stream

    def close(self) -> None:
        """Close every stream (``done`` set first, so that none opens after)."""
        self.done.set()
        with self._lock:
            for stream in self._open:
                with contextlib.suppress(Exception):  # one that broke is closed already
                    stream.close()


class _Seen:
    """Where a stream of Docker's events was read to, so that one opened again from there
    (events at or after a time) hands nothing on twice."""

    def __init__(self) -> None:
        self.started_ns = time.time_ns()  # this host's clock: the engine's may differ
        self.last_ns: int | None = None  # the engine's time of the last event read
        self.at_last: set[tuple] = set()

    def again(self, event: dict) -> bool:
        """Whether ``event`` was read already (one opened again replays from :meth:`since`)."""
        at = int(event.get("timeNano") or 0)
        if not at or self.last_ns is None:  # no time to compare, or nothing read yet
            return False
        return at < self.last_ns or (at == self.last_ns and _key(event) in self.at_last)

    def read(self, event: dict) -> None:
        at = int(event.get("timeNano") or 0)
        if at and at != self.last_ns:
            self.last_ns, self.at_last = at, set()
        if at:
            self.at_last.add(_key(event))

    def since(self) -> str:
        """Docker's ``since``: the last event's time, or, none read yet, the stream's start."""
        ns = self.last_ns or self.started_ns
        return f"{ns // 10**9}.{ns % 10**9:09d}"


def _key(event: dict) -> tuple:
    return (event.get("id"), event.get("Action"))


def _report(event: dict, printer: LogPrinter, oom_seen: set[str], on_end) -> None:
    actor = event.get("Actor") or {}
    worker = (actor.get("Attributes") or {}).get(LABEL_WORKER)
    if worker is None:
        return
    if worker != CONTROLLER_ID:
        _say_how_it_ended(event, worker, printer, oom_seen)
    if on_end is not None and event.get("Action") in ("die", "destroy"):
        on_end(event["Action"], worker, actor.get("ID") or "")


def _say_how_it_ended(event: dict, worker: str, printer: LogPrinter, oom_seen: set[str]) -> None:
    """One event of a worker's container: remember an ``oom``; say how a ``die`` ended it."""
    attributes = (event.get("Actor") or {}).get("Attributes") or {}
    if event.get("Action") == "oom":
        oom_seen.add(worker)
    elif event.get("Action") == "die":
        oom = worker in oom_seen
        oom_seen.discard(worker)
        code = int(attributes.get("exitCode", -1))
        if code != 0 or oom:
            printer.always(worker, f"its container ended: {container_exit(code, oom)}")


def container_exit(code: int, oom: bool | None = None) -> str:
    """``exit code 137 (SIGKILL; out of memory: Docker saw the kernel's OOM killer)``; ``oom``
    None where Docker's events were not watched (a Swarm task's record)."""
    parts = []
    if 128 < code < 128 + signal.NSIG:
        parts.append(signal_name(code - 128))
    if oom:
        parts.append("out of memory: Docker saw the kernel's OOM killer; give it more memory")
    elif code == 128 + signal.SIGKILL and oom is None:
        parts.append("out of memory? see docker events, or dmesg")
    elif code == 128 + signal.SIGKILL:  # an operator's docker kill was sent to look for a leak
        parts.append("not the out-of-memory killer, which Docker saw none of: a docker kill?")
    return f"exit code {code}" + (f" ({'; '.join(parts)})" if parts else "")
