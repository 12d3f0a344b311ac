"""Imported first by the local launcher's forkserver: it ends the moment its controller does.

The forkserver is a child of the controller that forks every worker. Python's forkserver leaves
when it notices its controller's pipe closed, then tears down an interpreter that imported torch,
which takes seconds on a loaded machine. Asking Linux to send it SIGKILL when its parent dies
(``PR_SET_PDEATHSIG``) ends it at once. Workers are not affected: the setting is not inherited by
forked children, and each worker watches its controller itself.

Importing this module is what it is for (the forkserver can only import its preload modules), so
its one effect happens at import time, in the forkserver only; elsewhere it is never imported.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent() -> bool:
    """SIGKILL this process when its parent ends (Linux); whether that could be arranged."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    return os.getppid() != 1  # the parent may have died before the call: then it is too late


die_with_parent()
