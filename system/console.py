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
    """A rich console that stops printing when its reader is gone, instead of exiting.

    ``gone_note``: logged as a warning when that happens, where work goes on without the
    console (a run's progress lines); a command that only prints (``troupe list | head``)
    stops quietly, as ``ls | head`` does."""

    reader_gone = False
    """Set when a write met a broken pipe: a loop that only prints (``troupe logs -f``) ends."""

    def __init__(self, *args, gone_note: str = "", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gone_note = gone_note

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
        if self.gone_note:
            logger.warning("the console's reader is gone (broken pipe): %s", self.gone_note)
