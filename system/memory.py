"""How much memory this process may still take: what a worker checks before it commits to a
large allocation (a replay buffer), so that a size that cannot fit fails at once, naming its
key, instead of being killed by the kernel's OOM killer hours into the run.

``available_bytes`` is the smaller of the machine's ``MemAvailable`` (``/proc/meminfo``) and
what the process's cgroup leaves (``memory.max - memory.current`` in cgroup v2,
``memory.limit_in_bytes - memory.usage_in_bytes`` in v1): a container started with
``--memory`` sees its limit, not the host's memory. None where neither can be read (not
Linux): the caller then does not check.
"""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")
CGROUP = Path("/sys/fs/cgroup")


def available_bytes(proc: Path = PROC, cgroup: Path = CGROUP) -> int | None:
    """Bytes this process can still allocate before memory runs out, or None if unknown."""
    known = [b for b in (_mem_available(proc), _cgroup_left(proc, cgroup)) if b is not None]
    return min(known) if known else None


def _mem_available(proc: Path) -> int | None:
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_left(proc: Path, cgroup: Path) -> int | None:
    """What the innermost cgroup with a memory limit leaves this process, if one has a limit."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2: one hierarchy
            left = _left(cgroup, path, "memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            left = _left(cgroup / "memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        if left is not None:
            return left
    return None


def _left(root: Path, path: str, limit_file: str, usage_file: str) -> int | None:
    """``limit - usage`` in the cgroup ``path`` under ``root``, or the nearest one above it
    that sets a limit."""
    folder = root / path.lstrip("/")
    for level in (folder, *folder.parents):
        if not level.is_relative_to(root):
            break
        try:
            limit = (level / limit_file).read_text().strip()
            usage = int((level / usage_file).read_text())
        except (OSError, ValueError):
            continue
        if limit != "max" and int(limit) < 1 << 60:  # v1 writes "no limit" as a huge number
            return max(0, int(limit) - usage)
    return None


def format_bytes(count: float) -> str:
    """``1.5 GB``, ``300 MB``: a size a person reads at a glance (powers of 1000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{int(count)} B"
