"""The checkpoint file format: a version's parameters on disk, written atomically.

A file holds the wire codec's frames of ``{"version", "params", ...}``, length-prefixed behind
a magic number: no pickle, and no torch needed to read one. A file is written to a temporary
name and renamed over the real one, so a reader sees a whole version or the previous one.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
from pathlib import Path
from typing import Any

from api.errors import RunFolderError
from system.errors import WireError
from system.streams import wire


def write_atomically(path: Path, write, *, sync: bool = True) -> None:
    """Write ``path`` through ``write(f)`` on a temporary file renamed over it; ``sync``: fsync
    first (a version that must survive a power cut), else only a crash of this process."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise RunFolderError.from_os_error(path, e) from e
    finally:
        with contextlib.suppress(OSError):  # gone after the rename; or never made
            tmp.unlink(missing_ok=True)


CHECKPOINT_SUFFIX = ".ckpt"
_MAGIC = b"TROUPECK"


def write_checkpoint(f, record: dict[str, Any]) -> None:
    """The wire codec's frames, length-prefixed: no pickle, and no torch needed to read it."""
    frames = wire.encode("checkpoint", record)
    f.write(_MAGIC + struct.pack("<I", len(frames)))
    for frame in frames:
        view = memoryview(frame).cast("B")
        f.write(struct.pack("<Q", view.nbytes))
        f.write(view)


def load_checkpoint_file(path: str | os.PathLike, field: str = "params") -> dict[str, Any]:
    """Read a checkpoint written by the store (one holding ``field``: a version's ``params``,
    or a trainer's own state, ``trainer``); a damaged or foreign file raises ValueError."""
    data = memoryview(Path(path).read_bytes())
    if bytes(data[:8]) != _MAGIC:
        raise ValueError(f"{path} is not a Troupe checkpoint (bad magic)")
    (count,), offset, frames = struct.unpack_from("<I", data, 8), 12, []
    for _ in range(count):
        if offset + 8 > len(data):
            raise ValueError(f"{path} is truncated")
        (size,) = struct.unpack_from("<Q", data, offset)
        frames.append(data[offset + 8 : offset + 8 + size])
        offset += 8 + size
    try:
        record = wire.decode(frames, copy=True).body
    except WireError as e:
        raise ValueError(f"{path} is damaged: {e}") from e
    if not isinstance(record, dict) or field not in record:
        raise ValueError(f"{path} is not a parameter-store checkpoint (no '{field}')")
    return record
