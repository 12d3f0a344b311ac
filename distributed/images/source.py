"""Which Troupe code a worker image holds, so that a run can tell an image older than its own
code.

``troupe run --launcher docker`` runs the launcher from this checkout (or install) and every
role from the image. After a change to Troupe, or an upgrade of it, without ``troupe image
build``, the containers ran the old code: the fix under test was not in the run, or the
launcher's new config keys failed an old controller, and nothing said why. The build now labels
the image with a digest of the Troupe code that built it (:data:`LABEL`), and the run compares
it with a digest of its own (:func:`stale_image`).

Both digests are made by the same function over the code of the process making them, so an
image built from an identical checkout or install agrees, wherever it was built.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from distributed.images import project

LABEL = "org.troupe.source"
PACKAGES = ("api", "algorithm", "legacy", "system", "distributed")
"""Troupe's top-level packages (``pyproject.toml``); ``troupe`` is inside ``distributed``."""
HOME = project.CHECKOUT_DIR
"""Where they are: the checkout, or site-packages. Not found by importing them: in a test
session ``tests/api`` and the like can stand for the real ones as namespace packages."""


def source_digest(roots: Iterable[Path] | None = None) -> str:
    """sha256 of every ``.py`` file under ``roots`` (Troupe's packages by default): their paths
    relative to their root, and their contents, in a fixed order."""
    if roots is None:  # beside this package, installed or checked out
        roots = [HOME / p for p in PACKAGES]
    digest = hashlib.sha256()
    for root in roots:
        root = Path(root)
        files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
        for path in files:
            name = f"{root.name}/{path.relative_to(root).as_posix()}"
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def stale_image(image_labels: dict[str, Any] | None, image: str) -> str | None:
    """Why ``image`` (its labels) holds other Troupe code than this process runs; None when it
    holds the same, or says nothing of it (an image built before the label, or by hand)."""
    built_from = (image_labels or {}).get(LABEL)
    if not built_from or built_from == source_digest():
        return None
    return (
        f"image {image} holds other Troupe code than this command runs (it changed since the "
        "image was built): its containers run the code in the image. Rebuild it with "
        f"`troupe image build --tag {image}` to run this code"
    )
