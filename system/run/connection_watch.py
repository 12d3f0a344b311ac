"""A worker's watch on its controller's connection, on a thread of its own
(:class:`ConnectionWatch`): the control channel's strongest evidence that a controller is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from system.processes import process_exists

logger = logging.getLogger(__name__)

RECONNECT_GRACE_S = 3.0
"""After the controller's connection closed, how long a worker waits for a new one (a
controller restarted in place by its scheduler) before it takes the controller for gone."""


class ConnectionWatch:
    """Ends the process when the controller's connection stays closed, whatever it is doing.

    Heartbeat answers are read between two polls of the worker; a worker blocked for a while
    (a long trainer step, a publish waiting for a parameter service that died with the
    controller, a builder waiting for a peer) would linger that long. A process that ends
    closes its TCP connections, so the control socket's monitor, read on a thread of its own,
    sees the controller go at once; if no new connection comes within
    :data:`RECONNECT_GRACE_S` (a controller restarted by a scheduler), the worker exits with
    :data:`EXIT_ORPHANED`. A host that vanishes closes nothing: heartbeats catch that.
    ``controller_pid`` (a controller on this machine): its end is seen even before a connection
    was made.
    """

    EXIT_ORPHANED = 3

    def __init__(
        self,
        socket: zmq.Socket,
        worker_id: str,
        controller_pid: int | None = None,
        heard: Callable[[], bool] = lambda: True,
        address: str = "",
    ):
        self.worker_id = worker_id
        self.controller_pid = controller_pid
        self.heard, self.address = heard, address
        self._socket = socket
        self._monitor = socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="controller-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        connected, lost_at = False, None
        try:
            while not self._stopping.is_set():
                if self._monitor.poll(100):
                    event = recv_monitor_message(self._monitor)["event"]
                    if event == zmq.EVENT_CONNECTED:
                        connected, lost_at = True, None
                    elif event == zmq.EVENT_DISCONNECTED and connected:
                        lost_at = time.monotonic()
                if lost_at is not None and time.monotonic() - lost_at > RECONNECT_GRACE_S:
                    lost_s = time.monotonic() - lost_at
                    self._exit(f"closed its connection {lost_s:.1f}s ago", spoke=self.heard())
                if self.controller_pid is not None and not process_exists(self.controller_pid):
                    self._exit(f"process {self.controller_pid} ended")
        finally:
            self._monitor.close(linger=0)

    def _exit(self, why: str, spoke: bool = True) -> None:
        if not spoke:  # what closed the connection never answered as a controller
            logger.error(
                "%s: no controller answered at %s (what this worker connected to %s); this "
                "worker exits: check the address, that the run's controller runs there, and "
                "the keys (TROUPE_CURVE_KEYS_FILE)",
                *(self.worker_id, self.address or "its address", why),
            )
        else:
            logger.error(
                "%s: the controller %s; this worker exits (resume with `troupe run --resume "
                "RUN_DIR`)",
                *(self.worker_id, why),
            )
        os._exit(self.EXIT_ORPHANED)  # the main thread may be blocked: no cleanup

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=1.0)
        with contextlib.suppress(zmq.ZMQError):
            self._socket.disable_monitor()
