"""Immutable image references for deployments: every node runs the same code.

A tag such as ``troupe-worker:latest`` moves with every build; with ``IfNotPresent`` a node that
pulled it yesterday keeps yesterday's code while a new node pulls today's. So the deploy
commands write what an image reference cannot move away from:

- ``REPO@sha256:...`` when the image was pushed (its registry digest), the strongest name;
- else ``REPO:id-<12 hex of the image id>``, a tag :func:`content_tag` gives each build (a
  reproducible build gives the same image, so the same tag: ``images/build.py``);
- the reference as given, with a warning, when no Docker engine here knows the image (a registry
  this machine cannot reach, a cluster that builds its own).
"""

from __future__ import annotations

import argparse
import logging
import re
from typing import Any

logger = logging.getLogger(__name__)

ID_TAG_PREFIX = "id-"

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
REFERENCE = re.compile(
    rf"(?:{_HOST}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
"""Docker's grammar of an image reference: ``[host[:port]/]name[/name...][:tag][@digest]``,
names in lower case."""


def image_reference(text: str) -> str:
    """``text`` if Docker takes it as an image reference; for ``--image`` and ``--tag``: a
    wrong one (``Troupe-Worker:Latest``, ``bad tag!``) ended in the engine's "invalid reference
    format" traceback, after a run folder was made."""
    if not REFERENCE.fullmatch(text):
        hint = " (names are lower case)" if REFERENCE.fullmatch(_lower_name(text)) else ""
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an image reference [HOST[:PORT]/]NAME[:TAG][@DIGEST]{hint}"
        )
    return text


def _lower_name(text: str) -> str:
    """``text`` with the name part (before a tag or digest) in lower case."""
    name, at, digest = text.partition("@")
    head, colon, tag = name.rpartition(":")
    if not colon or "/" in tag:
        return name.lower() + at + digest
    return head.lower() + colon + tag + at + digest


def content_tag(image_id: str) -> str:
    """``id-61852fdf2d1d`` for ``sha256:61852fdf2d1d...``."""
    return ID_TAG_PREFIX + image_id.removeprefix("sha256:")[:12]


def repository(reference: str) -> str:
    """``registry:5000/troupe-worker`` for ``registry:5000/troupe-worker:latest``."""
    name, _, tag = reference.rpartition(":")
    return name if name and "/" not in tag else reference


def pin(reference: str, client: Any | None) -> str:
    """The immutable reference of ``reference`` (see the module's docstring); ``client``: a
    Docker client, None where no engine answers."""
    if "@sha256:" in reference:
        return reference
    try:
        if client is None:
            raise LookupError("no Docker engine answers here")
        image = client.images.get(reference)
    except Exception as e:  # no engine here, or it does not know the image
        logger.warning(
            "%s is deployed by its tag, which a rebuild moves (%s): nodes may run different "
            "code; pass an immutable reference (REPO@sha256:... or REPO:id-...)",
            reference,
            getattr(e, "explanation", None) or e,
        )
        return reference
    repo = repository(reference)
    for digest in image.attrs.get("RepoDigests") or []:
        if digest.partition("@")[0] == repo:
            return digest
    tag = content_tag(image.id)
    if f"{repo}:{tag}" not in image.tags:
        image.tag(repo, tag)
    return f"{repo}:{tag}"
