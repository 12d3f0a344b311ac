"""The machine's ceilings: an emulator loop in one process per core, every one at once.

What issue 23 measures a Pong run against is the raw loop (:func:`pixels.raw_rate`) in 16
processes at once on a 16-core machine. That is less than 16 times the one-process rate wherever
cores share a physical core, caches or memory bandwidth, and by how much only running them all
at once says. The same for ``Atari-v0`` with an actor's ring of environments a process
(:func:`pixels.preprocessed_rate`) says what the preprocessing and an actor's working set cost
under that load, before the runtime adds anything: the run's frames over it are the runtime's
share, over the raw ceiling the whole cost.

Each process builds its environments, says "ready" on stdout and waits; once every one is ready,
all are given the same start time, so they step over one window.

Run it alone with ``python -m distributed.bench.pixel_ceiling --processes 16 --envs 8``.
"""

from __future__ import annotations

import argparse
import json
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from distributed.bench.pixels import DEFAULT_GAME, EmulatorRate, preprocessed_rate, raw_rate


@dataclass
class ParallelRate:
    """One loop run in several processes at once, over the same window."""

    name: str
    """``raw`` or ``preprocessed``."""
    envs_per_process: int
    rates: list[EmulatorRate]
    """Each process's own rate."""

    @property
    def processes(self) -> int:
        return len(self.rates)

    @property
    def frames_per_s(self) -> float:
        """The machine's rate: the sum of every process's."""
        return sum(r.frames_per_s for r in self.rates)

    @property
    def cpu_us_per_frame(self) -> float:
        """CPU microseconds an emulator frame, over all processes."""
        frames = sum(r.frames for r in self.rates)
        return 1e6 * sum(r.cpu_s for r in self.rates) / max(frames, 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "processes": self.processes,
            "envs_per_process": self.envs_per_process,
            "frames_per_s": self.frames_per_s,
            "cpu_us_per_frame": self.cpu_us_per_frame,
            "per_process_frames_per_s": [round(r.frames_per_s) for r in self.rates],
        }


START_TIMEOUT_S = 120.0
"""The longest a process may take to import ALE and build its environments."""


def parallel_rate(
    name: str,
    processes: int,
    seconds: float = 5.0,
    envs: int = 1,
    game: str = DEFAULT_GAME,
    env_args: dict[str, Any] | None = None,
) -> ParallelRate:
    """``raw`` or ``preprocessed`` (``envs`` environments a process, ``env_args`` as the run's
    environment has them) in ``processes`` processes, every one stepping over the same window:
    each process says when it has built everything, and all start stepping at once."""
    if name not in ("raw", "preprocessed"):
        raise ValueError(f"name must be 'raw' or 'preprocessed', got {name!r}")
    command = [sys.executable, "-m", "distributed.bench.pixel_ceiling", "--one", name,
               "--game", game, "--seconds", str(seconds), "--envs", str(envs),
               "--env-args", json.dumps(env_args or {})]  # fmt: skip
    children = [
        subprocess.Popen(
            [*command, "--seed", str(i)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,  # ALE's banner; the tail of a traceback if one fails
            text=True,
        )
        for i in range(processes)
    ]
    try:
        return ParallelRate(name, envs, _in_step(children, name, seconds))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


def _in_step(children: list[subprocess.Popen], name: str, seconds: float) -> list[EmulatorRate]:
    """Wait until every child is ready, start them together, collect their rates."""
    deadline = time.monotonic() + START_TIMEOUT_S
    for child in children:  # each prints "ready" once built (or exits: an empty line)
        left = max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([child.stdout], [], [], left)
        if not ready or child.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a {name} loop's process did not start: {_failure(child)}")
    start_at = time.time() + 0.2
    for child in children:
        child.stdin.write(f"{start_at}\n")
        child.stdin.flush()
    rates = []
    for child in children:
        out, err = child.communicate(timeout=seconds + 60)
        if child.returncode != 0:
            raise RuntimeError(f"a {name} loop's process failed: {_failure(child, err)}")
        rates.append(_rate_from(out.strip().splitlines()[-1]))
    return rates


def _rate_from(line: str) -> EmulatorRate:
    """What a :func:`parallel_rate` process printed (:meth:`EmulatorRate.to_dict`)."""
    fields = json.loads(line)
    return EmulatorRate(**{k: fields[k] for k in EmulatorRate.__dataclass_fields__})


def _failure(child: subprocess.Popen, err: str | None = None) -> str:
    """A failed child's exit status and the last line it wrote to stderr."""
    if err is None:
        child.kill()
        _, err = child.communicate()
    lines = (err or "").strip().splitlines()
    return f"exit {child.returncode}" + (f", {lines[-1]}" if lines else "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--game", default=DEFAULT_GAME, help="ALE game (default: Pong)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per rate")
    parser.add_argument("--processes", type=int, default=2, help="processes at once")
    parser.add_argument("--envs", type=int, default=1, help="Atari-v0 environments a process")
    # what parallel_rate's children are started with
    parser.add_argument("--one", choices=("raw", "preprocessed"), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--env-args", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(_one(args).to_dict()), flush=True)
    else:
        rates = [
            parallel_rate("raw", args.processes, args.seconds, 1, args.game),
            parallel_rate("preprocessed", args.processes, args.seconds, args.envs, args.game),
        ]
        print(json.dumps([r.to_dict() for r in rates], indent=2))


def _one(args: argparse.Namespace) -> EmulatorRate:
    """One process of :func:`parallel_rate`: built, it says "ready" and waits for the start
    time its parent writes."""

    def ready() -> None:
        print("ready", flush=True)
        start_at = float(sys.stdin.readline())
        time.sleep(max(0.0, start_at - time.time()))

    if args.one == "raw":
        return raw_rate(args.game, args.seconds, args.seed, ready)
    env_args = {k: v for k, v in json.loads(args.env_args).items() if k != "game"}
    return preprocessed_rate(args.game, args.seconds, args.seed, args.envs, ready, **env_args)


if __name__ == "__main__":
    main()
