"""What local workers print, passed on through the controller's own streams.

A worker forked by the local launcher used to write to the terminal it inherited. The live
panel is redrawn in place by the controller, which knows nothing of those writes: one worker
warning (a gymnasium deprecation, a restart's reconnection, a user's ``print`` in an environment)
left a stale copy of the panel on the screen and drew the next one below it. Each worker now
writes its stdout and stderr into pipes; one thread of the controller reads them all and writes
each whole line to its own ``sys.stdout`` or ``sys.stderr``, which the panel prints above itself
(``rich.live.Live`` redirects both). Without a panel the lines reach the same streams as before.

A worker whose controller is gone finds its pipes closed: a ``print`` then raises
``BrokenPipeError``, but such a worker is an orphan that leaves by itself anyway
(:class:`~system.run.connection_watch.ConnectionWatch`).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import selectors
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import TextIO

STREAMS = ("stdout", "stderr")
READ_BYTES = 65536


class WorkerOutput:
    """The read ends of every worker's pipes, and the thread that passes their lines on.

    One selector (epoll on Linux) holds them all: a pipe added while the thread waits is
    watched at once (epoll takes file descriptors added from another thread). It is made with
    the first worker and closed by :meth:`drain`."""

    def __init__(self) -> None:
        self._selector: selectors.BaseSelector | None = None
        self._partial: dict[int, bytes] = {}
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()

    def pipes(self) -> tuple[Connection, Connection]:
        """A new worker's write ends (stdout, stderr), to hand to its process; the caller
        closes them once the process has started (:meth:`started`)."""
        if self._selector is None:
            self._selector = selectors.DefaultSelector()
        writers = []
        for name in STREAMS:
            reader, writer = mp.Pipe(duplex=False)
            self._selector.register(reader.fileno(), selectors.EVENT_READ, (reader, name))
            writers.append(writer)
        if self._thread is None or self._closed.is_set():  # the first, or one after a drain
            self._closed = threading.Event()
            self._thread = threading.Thread(
                target=self._pump,
                args=(self._selector, self._closed),
                name="worker-output",
                daemon=True,
            )
            self._thread.start()
        return writers[0], writers[1]

    @staticmethod
    def started(writers: tuple[Connection, Connection]) -> None:
        """The controller's copies of a started worker's write ends: closed, so that a pipe
        ends when the worker (and whatever inherited it) does."""
        for writer in writers:
            writer.close()

    def drain(self, timeout_s: float) -> None:
        """Pass on what the workers wrote until every pipe has ended, or ``timeout_s`` (a
        process the run left behind may hold one); then stop reading."""
        selector = self._selector
        if selector is None:
            return
        deadline = time.monotonic() + timeout_s
        while selector.get_map() and time.monotonic() < deadline:
            time.sleep(0.02)
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
        for key in list(selector.get_map().values()):
            self._forget(selector, key.fd, key.data)
        selector.close()
        self._selector = None

    def _pump(self, selector: selectors.BaseSelector, closed: threading.Event) -> None:
        while not closed.is_set():
            for key, _ in selector.select(timeout=0.05):  # the drain waits at most this
                self._read(selector, key.fd, key.data)

    def _read(self, selector: selectors.BaseSelector, fd: int, data: tuple) -> None:
        try:
            chunk = os.read(fd, READ_BYTES)
        except OSError:
            chunk = b""
        if not chunk:  # the worker, and all that shared its pipe, ended
            self._forget(selector, fd, data)
            return
        lines = (self._partial.pop(fd, b"") + chunk).split(b"\n")
        if lines[-1]:
            self._partial[fd] = lines[-1]
        _write(data[1], lines[:-1])

    def _forget(self, selector: selectors.BaseSelector, fd: int, data: tuple) -> None:
        """Stop watching ``fd``: pass on an unfinished last line, close the read end."""
        reader, name = data
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(fd)
        rest = self._partial.pop(fd, b"")
        if rest:
            _write(name, [rest])
        reader.close()


def _write(name: str, lines: list[bytes]) -> None:
    if not lines:
        return
    stream: TextIO = getattr(sys, name)  # looked up each time: the panel replaces it
    text = "\n".join(line.decode("utf-8", errors="replace") for line in lines) + "\n"
    with contextlib.suppress(ValueError, OSError):
        stream.write(text)
        stream.flush()


def write_to(writers: tuple[Connection, Connection] | None) -> None:
    """In a worker process, first thing: its stdout and stderr are these pipes (None: as
    inherited). The file descriptors themselves, so that C code (a simulator, torch) writes there
    too."""
    if writers is None:
        return
    for stream, fd, writer in zip((sys.stdout, sys.stderr), (1, 2), writers, strict=True):
        with contextlib.suppress(ValueError, OSError):
            stream.flush()
        os.dup2(writer.fileno(), fd)  # 1 and 2 themselves, whatever sys.stdout is now
        writer.close()
