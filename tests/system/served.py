"""Threads that poll a component's sockets for a test, which talks to it from its own thread:
a parameter server, or a controller's message loop."""

from __future__ import annotations

import threading
from collections.abc import Callable

from system.parameters.service import ParameterServer

TIMEOUT_S = 10.0


class PollingThread:
    """Calls ``poll()`` on a daemon thread, again and again, until :meth:`stop`."""

    def __init__(self, poll: Callable[[], object]):
        self._poll = poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._poll()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(TIMEOUT_S)


class ServedInThread(PollingThread):
    """Polls ``server`` every 20 ms until :meth:`close` (which closes the server too)."""

    def __init__(self, server: ParameterServer):
        self.server = server
        super().__init__(lambda: server.poll(20))

    def close(self) -> None:
        self.stop()
        self.server.close()
