"""The console Troupe's commands and a run's controller print to: one that never ends a run.

rich's own console answers a broken pipe (the reader of ``troupe run ... | head`` gone, a
``tee`` killed, a log collector restarted) by exiting the process with code 1. In the controller
that ended the run at its next progress line as if it had failed: the workers were stopped, but
no summary was written, nothing said why, and ``troupe run`` exited 1. A console is only a view
of the run; the run folder, ``troupe status`` and ``troupe logs`` are its record. So this one
goes quiet instead, and the run, and the command's exit code, go on as they would have.
"""

from __future__ import annotations

import logging
import os

from rich.console import Console as RichConsole

logger = logging.getLogger(__name__)


class Console(RichConsole):
    """A rich console that stops printing when its reader is gone, instead of exiting."""

    reader_gone = False
    """Set when a write met a broken pipe: a loop that only prints (``troupe logs -f``) ends."""

    def on_broken_pipe(self) -> None:
        if self.reader_gone:
            return
        self.reader_gone = self.quiet = True
        try:  # the interpreter's flush at exit must not fail on the broken pipe either
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self.file.fileno())
            finally:
                os.close(devnull)
        except (OSError, ValueError, AttributeError):  # no descriptor: quiet is enough
            pass
        logger.warning(
            "the console's reader is gone (broken pipe): nothing more is printed there; the "
            "work goes on (a run's folder, `troupe status` and `troupe logs` show it)"
        )
