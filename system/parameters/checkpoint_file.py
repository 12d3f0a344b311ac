"""The checkpoint file format: what a run resumes from (a version's parameters, a trainer's
state, a replay buffer) on disk, written atomically and proving its own integrity.

A file holds the wire codec's frames of a record (``{"version", "params", ...}``),
length-prefixed behind a magic number, and ends with a CRC-32 of everything before it:
no pickle, no torch needed to read one, and a flipped bit anywhere (a bad disk sector, a copy
cut short, 4 KB zeroed by a crashed filesystem) is refused on load instead of resuming from
silently wrong weights. CRC-32, not a cryptographic hash: it finds every error of up to 32
bits in a row and misses random damage once in 4 billion, at 4.5 times the speed of BLAKE2b
(1.6 ms against 7.2 ms for Pong's 6.7 MB of parameters, measured here), and the parameter
service checksums every version before announcing it. Files of older runs (magic
``TROUPECK``, no checksum) are still read.
A file is written to a temporary name and renamed over the real one, so a reader sees a whole
version or the previous one.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Any

from system.errors import WireError
from system.streams import wire

CHECKPOINT_SUFFIX = ".ckpt"
_MAGIC = b"TROUPEC2"
_MAGIC_UNCHECKED = b"TROUPECK"
"""Files written before checkpoints carried a checksum: read, but nothing proves them whole."""
_DIGEST_BYTES = 4


class DamagedCheckpointError(ValueError):
    """A checkpoint file whose contents are not what was written (or not a checkpoint)."""


def write_checkpoint(f, record: dict[str, Any]) -> None:
    """The wire codec's frames, length-prefixed, then the CRC-32 of all that was written
    (computed while writing: the arrays are never copied to be checked)."""
    frames = wire.encode("checkpoint", record)
    crc = 0

    def put(data) -> None:
        nonlocal crc
        crc = zlib.crc32(data, crc)
        f.write(data)

    put(_MAGIC + struct.pack("<I", len(frames)))
    for frame in frames:
        view = memoryview(frame).cast("B")
        put(struct.pack("<Q", view.nbytes))
        put(view)
    f.write(struct.pack("<I", crc))


def _checked_body(path: str | os.PathLike, data: memoryview) -> memoryview:
    """The file without its checksum, once the checksum proves it whole."""
    magic = bytes(data[:8])
    if magic == _MAGIC_UNCHECKED:
        return data
    if magic != _MAGIC:
        raise DamagedCheckpointError(f"{path} is not a Troupe checkpoint (damaged or foreign)")
    if len(data) < 12 + _DIGEST_BYTES:
        raise DamagedCheckpointError(f"{path} is damaged: truncated to {len(data)} bytes")
    body, stored = data[:-_DIGEST_BYTES], bytes(data[-_DIGEST_BYTES:])
    if struct.pack("<I", zlib.crc32(body)) != stored:
        raise DamagedCheckpointError(f"{path} is damaged: its checksum does not match its contents")
    return body


def load_checkpoint_file(path: str | os.PathLike, field: str = "params") -> dict[str, Any]:
    """Read a checkpoint written by the store (one holding ``field``: a version's ``params``,
    a trainer's own state, ``trainer``, or a replay buffer, ``replay``); a damaged or foreign
    file raises :class:`DamagedCheckpointError` (a ValueError) naming it."""
    data = _checked_body(path, memoryview(Path(path).read_bytes()))
    if len(data) < 12:
        raise DamagedCheckpointError(f"{path} is damaged: truncated to {len(data)} bytes")
    (count,), offset, frames = struct.unpack_from("<I", data, 8), 12, []
    for _ in range(count):
        if offset + 8 > len(data):
            raise DamagedCheckpointError(f"{path} is damaged: truncated")
        (size,) = struct.unpack_from("<Q", data, offset)
        frames.append(data[offset + 8 : offset + 8 + size])
        offset += 8 + size
    if offset != len(data):
        raise DamagedCheckpointError(f"{path} is damaged: its frames do not fill it")
    try:
        record = wire.decode(frames, copy=True).body
    except WireError as e:
        raise DamagedCheckpointError(f"{path} is damaged: {e}") from e
    if not isinstance(record, dict) or field not in record:
        raise DamagedCheckpointError(f"{path} is not a checkpoint of this kind (no '{field}')")
    return record
