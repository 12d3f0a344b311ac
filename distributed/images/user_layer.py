"""User code in a worker image: ``troupe image build --add PATH`` (files or folders).

A run started from a user's script ships its registrations to every worker (``api.code``); a
worker imports each from the file it was defined in. In a container that file is not at the same
path, so the image keeps user code in :data:`~api.user_code.DEFAULT_USER_CODE_DIR`, where workers
look for it by file name (and which is on ``PYTHONPATH``, so modules import by name too). The
layer goes on top of a built image: changing a user file rebuilds only this layer.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from api.errors import UserError
from api.user_code import DEFAULT_USER_CODE_DIR, USER_CODE_ENV

logger = logging.getLogger(__name__)


def dockerfile(base: str) -> str:
    return (
        f"FROM {base}\n"
        f"COPY user/ {DEFAULT_USER_CODE_DIR}/\n"
        f"ENV {USER_CODE_ENV}={DEFAULT_USER_CODE_DIR} PYTHONPATH={DEFAULT_USER_CODE_DIR}\n"
    )


def add_user_code(client, base: str, tag: str, paths: Sequence[str | Path]) -> str:
    """Build ``tag`` = ``base`` plus the files and folders ``paths``; returns the image id."""
    sources = [Path(p) for p in paths]
    missing = [str(p) for p in sources if not p.exists()]
    if missing:
        raise UserError(f"--add: no such file or folder: {', '.join(missing)}")
    with tempfile.TemporaryDirectory(prefix="troupe-user-") as tmp:
        context = Path(tmp)
        user = context / "user"
        user.mkdir()
        for source in sources:
            target = user / source.name
            if target.exists():
                raise UserError(f"--add: two paths named '{source.name}'; rename one")
            if source.is_dir():
                shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(source, target)
        (context / "Dockerfile").write_text(dockerfile(base))
        logger.info("adding %s to %s as %s", [s.name for s in sources], base, tag)
        image, _ = client.images.build(path=str(context), tag=tag, rm=True, network_mode="none")
    return image.id


def mounts(files: Sequence[str]) -> dict[str, dict[str, str]]:
    """Docker volumes that show each user file's folder at the same path, read-only: a local
    ``--launcher docker`` run then needs no image rebuild for the user's own code."""
    folders = sorted({str(Path(f).resolve().parent) for f in files if f and Path(f).is_file()})
    return {folder: {"bind": folder, "mode": "ro"} for folder in folders}
