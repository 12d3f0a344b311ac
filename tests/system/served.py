"""A parameter server polled by a background thread, for tests that talk to it over its real
sockets from the test's own thread."""

from __future__ import annotations

import threading

from system.parameters.service import ParameterServer

TIMEOUT_S = 10.0


class ServedInThread:
    """Polls ``server`` every 20 ms until :meth:`close` (which closes the server too)."""

    def __init__(self, server: ParameterServer):
        self.server = server
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self.server.poll(20)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(TIMEOUT_S)
        self.server.close()
