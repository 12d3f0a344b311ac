"""How busy the GPUs were over a bench window, as ``nvidia-smi`` samples it.

A run's stage timings say how long each role waited for its GPU work, not how much of the GPU
that work used: on the H200, a trainer busy 100% of the time left the GPU busy 31% of a call
(BENCHMARKS.md, issue 23), which is what pointed at kernel launches rather than arithmetic.
:class:`GpuSampler` asks ``nvidia-smi`` for every GPU's utilisation and memory once a second
while a window lasts; without ``nvidia-smi`` (no NVIDIA GPU) it records nothing.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

QUERY = ["--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits", "-lms"]


class GpuSampler:
    """``nvidia-smi`` sampling in the background from :meth:`start` to :meth:`stop`."""

    def __init__(self, period_ms: int = 1000):
        self.period_ms = period_ms
        self._process: subprocess.Popen | None = None

    def start(self) -> GpuSampler:
        exe = shutil.which("nvidia-smi")
        if exe is not None:
            self._process = subprocess.Popen(
                [exe, *QUERY, str(self.period_ms)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        return self

    def stop(self) -> dict[str, Any] | None:
        """The window's figures (:func:`summarize`), or None without a GPU to sample."""
        if self._process is None:
            return None
        self._process.terminate()
        try:
            out, _ = self._process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            out, _ = self._process.communicate()
        self._process = None
        return summarize(out)


def summarize(text: str) -> dict[str, Any] | None:
    """Mean utilisation (%) and peak memory used (MiB) over ``nvidia-smi``'s CSV lines
    (``utilisation, memory`` per GPU per sample); None when no line could be read."""
    util, memory = [], []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2:
            continue
        try:
            util.append(float(parts[0]))
            memory.append(float(parts[1]))
        except ValueError:  # "[N/A]" on GPUs that do not report it
            continue
    if not util:
        return None
    return {
        "utilisation_mean": sum(util) / len(util),
        "utilisation_max": max(util),
        "memory_peak_mib": max(memory),
        "samples": len(util),
    }
