"""pip as the image builds call it: this interpreter's pip, its output logged, its failure
raised with the last lines, and the cache folder every set of wheels it makes is kept in.

Shared by the dependency wheels (``wheelhouse.py``) and the wheels of the user's own packages
(``user_requirements.py``), which cannot import each other.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections import deque
from pathlib import Path

from distributed.errors import WheelhouseError

logger = logging.getLogger(__name__)

COMPLETE = ".complete"
"""Written last into a cached wheel folder: a folder without it was cut short."""
ZIP_EPOCH = "315532800"
"""1980-01-01, the earliest time a zip entry can hold."""


def cache_root() -> Path:
    """``$TROUPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/troupe``, else ``~/.cache/troupe``."""
    if os.environ.get("TROUPE_CACHE_DIR"):
        return Path(os.environ["TROUPE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "troupe"


def pip(action: str) -> list[str]:
    """``pip ACTION`` of this interpreter (the project's venv), so its configuration applies."""
    return [sys.executable, "-m", "pip", action, "--disable-pip-version-check"]


def reproducible_env() -> dict[str, str]:
    """The environment with every zip entry a wheel build writes stamped with one fixed time
    (``SOURCE_DATE_EPOCH``, which wheel honours): the same source makes the same wheel byte for
    byte, so Docker's cache keeps the layer it is installed in."""
    return {**os.environ, "SOURCE_DATE_EPOCH": os.environ.get("SOURCE_DATE_EPOCH", ZIP_EPOCH)}


def run_logged(command: list[str], *, what: str, env: dict[str, str] | None = None) -> None:
    """Run ``command``, its output to the debug log; on failure raise with the last lines."""
    tail: deque[str] = deque(maxlen=25)
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            tail.append(line.rstrip())
            logger.debug("%s: %s", what, line.rstrip())
    if process.returncode != 0:
        raise WheelhouseError(
            f"{what} failed with exit code {process.returncode}; its last lines:\n"
            + "\n".join(tail)
        )
