"""The ``pixels`` suite of ``troupe bench``: Pong end to end while training, against the emulator.

In one command run, so the ratios hold on a shared machine: the raw emulator rate in this
process (ALE Pong, ``frameskip=4``, no preprocessing; measured before and after the run); the
raw loop in one process per core at once, the machine's ceiling (what issue 23 measures a run
against: less than the cores times the one-process rate wherever cores share a physical core,
caches or memory bandwidth); ``Atari-v0`` as the run's actors step it (their environments a
process, their environment arguments), one process per core at once, which says what the
preprocessing and an actor's ring of environments cost before the runtime adds anything; then
``troupe run pong-ppo`` for a fixed window after its first frames. Reported: the run's emulator
frames/s (agent steps x 4) and its ratio to the ceiling;
CPU microseconds a frame by role (``/proc/<pid>/stat`` over the window); each role's busy share
of wall time and its largest wait (the run's own stage timings, :mod:`system.timing`); peak
resident memory by role (each worker's own ``ru_maxrss``, from ``workers.json``); and the bytes
each frame costs in copies on the observation path, with shared memory (this run) and over
sockets (what it was before, and still is across hosts), from the wire codec's own message sizes.

``troupe bench pixels --experiment pong-ppo-gpu`` runs another Atari recipe as it ships (the
ceilings then step its game, with its environment arguments);
``troupe bench pixels --actors N|auto --envs M --device cuda`` sets the run's layout,
``--precision bfloat16`` its trainer's precision and ``--trainer-graphs`` its minibatch steps as
CUDA graphs; on a GPU the policy acts through CUDA graphs unless ``--eager``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from api.config.load import make_experiment
from api.errors import UserError
from distributed.bench import pixel_ceiling, pixels
from distributed.bench.cpu_profile import _cpu, _frames
from distributed.bench.gpu_use import GpuSampler
from distributed.bench.rows import Row
from distributed.bench.runs import role_utilisation, troupe_command, window_timing
from system import run_folder
from system.run.report import read_metrics

FIRST_FRAMES_S = 240.0
"""How long Pong may take to start on a loaded machine (torch imports, ROM loads)."""


def pixel_suite(size, workdir: Path, context: dict) -> tuple[dict, list[Row]]:
    cores = len(os.sched_getaffinity(0))
    window = max(size.run_s, 10.0)
    overrides = list(context.get("pixels_overrides") or [])
    experiment = context.get("pixels_experiment") or "pong-ppo"
    envs, env_args = actor_layout(overrides, experiment)
    game = env_args.get("game", pixels.DEFAULT_GAME)
    seconds = max(size.raw_s, 1.0)
    raw_before = pixels.raw_rate(game, seconds=seconds)
    all_raw = pixel_ceiling.parallel_rate("raw", cores, seconds, game=game)
    all_env = pixel_ceiling.parallel_rate(
        "preprocessed", cores, seconds, envs, game=game, env_args=env_args
    )
    run = pong_run(workdir / "pixels-pong", size.warmup_s, window, overrides, experiment)
    raw_after = pixels.raw_rate(game, seconds=seconds)
    raw_fps = (raw_before.frames_per_s + raw_after.frames_per_s) / 2
    ceiling = all_raw.frames_per_s
    raw_cpu = (raw_before.frames_per_cpu_s + raw_after.frames_per_cpu_s) / 2
    copies = copied_bytes_per_frame()
    figures = {
        "raw_before": raw_before.to_dict(),
        "raw_after": raw_after.to_dict(),
        "raw_fps": raw_fps,
        "cores": cores,
        "ceiling_fps": ceiling,
        "one_process_x_cores_fps": cores * raw_fps,
        "all_cores_raw": all_raw.to_dict(),
        "all_cores_env": all_env.to_dict(),
        "env_ceiling_ratio": all_env.frames_per_s / ceiling,
        **run,
        "ratio_to_ceiling": run["fps"] / ceiling,
        # Per CPU second: what a frame costs whoever else runs (the wall-clock ratio above
        # depends on the share of the cores the run and the raw loop each got).
        "fps_per_cpu_s": run["fps"] / max(run["cpu_percent"] / 100.0, 1e-9),
        "raw_fps_per_cpu_s": raw_cpu,
        "ratio_per_cpu_s": run["fps"] / max(run["cpu_percent"] / 100.0, 1e-9) / raw_cpu,
        "bytes_copied_per_frame": copies,
        "load_average": list(os.getloadavg()),
        "experiment": experiment,
        "game": game,
        "overrides": overrides,
    }
    by_role = ", ".join(f"{w} {us:,.0f}" for w, us in run["us_per_frame"].items())
    memory = ", ".join(f"{w} {mb:,.0f}" for w, mb in run["peak_rss_mb"].items())
    rows = [
        Row("pixels", f"ALE {game} raw emulator frames/s, 1 core (before / after the run)",
            f"{raw_before.frames_per_s:,.0f} / {raw_after.frames_per_s:,.0f}"),
        Row("pixels", f"ALE {game} raw, {cores} processes at once: the ceiling (CPU us a frame)",
            f"{ceiling:,.0f} ({all_raw.cpu_us_per_frame:,.1f}); {cores} x 1 core: "
            f"{cores * raw_fps:,.0f}"),
        Row("pixels", f"Atari-v0 as the actors step it, {envs} a process, {cores} processes at "
            "once (CPU us a frame)", f"{all_env.frames_per_s:,.0f} "
            f"({all_env.cpu_us_per_frame:,.1f}): {100 * figures['env_ceiling_ratio']:.1f}% of "
            "the ceiling"),
        Row("pixels", f"{experiment} emulator frames/s end to end, training ({window:.0f} s window"
            f"{'; ' + ' '.join(overrides) if overrides else ''})", f"{run['fps']:,.0f}"),
        Row("pixels", f"{experiment} / the raw ceiling ({cores} processes at once)",
            f"{100 * figures['ratio_to_ceiling']:.1f}%", ">= 60%",
            figures["ratio_to_ceiling"] >= 0.6),
        Row("pixels", f"emulator frames per CPU second: {experiment} (all workers) / raw loop",
            f"{figures['fps_per_cpu_s']:,.0f} / {raw_cpu:,.0f} "
            f"({100 * figures['ratio_per_cpu_s']:.1f}%)"),
        Row("pixels", f"CPU us an emulator frame, by worker ({run['cpu_percent']:.0f}% CPU)",
            by_role),
        Row("pixels", "busy share of wall time by role (largest wait)",
            role_utilisation(run["timing"])),
        Row("pixels", "trainer step (s, mean over the window); minibatch sizes replayed as CUDA "
            "graphs", trainer_row(run["trainer"])),
        Row("pixels", "GPU busy over the window (nvidia-smi: mean, max; peak memory)",
            gpu_row(run["gpu"])),
        Row("pixels", "peak RSS by worker (MiB)", memory),
        Row("pixels", "observation bytes copied an emulator frame: shared memory / sockets",
            f"{copies['shm']:,.0f} / {copies['socket']:,.0f}"),
    ]  # fmt: skip
    return figures, rows


def actor_layout(
    overrides: Sequence[str], experiment: str = "pong-ppo"
) -> tuple[int, dict[str, Any]]:
    """The environments a process and the environment arguments of the run's actors
    (``experiment`` with ``overrides``); UserError for an experiment that does not step
    ``Atari-v0``."""
    config = make_experiment(experiment, list(overrides))
    if config.environment.type != "Atari-v0":
        raise UserError(
            f"the pixels suite measures Atari experiments; '{experiment}' steps "
            f"'{config.environment.type}'"
        )
    return config.actors.envs_per_worker, dict(config.environment.args)


def pong_run(
    run_dir: Path,
    warmup_s: float,
    window_s: float,
    overrides: Sequence[str] = (),
    experiment: str = "pong-ppo",
) -> dict[str, Any]:
    """``troupe run EXPERIMENT`` (no evaluation workers; ``overrides`` after the bench's own):
    frames/s, CPU a frame by worker and each role's stage timings over ``window_s`` after
    ``warmup_s`` past the first frames; peak memory by worker at the end."""
    command = [
        *troupe_command(), "run", experiment, "stop.eval_return=None", "evaluation.workers=0",
        "stop.env_frames=1000000000", "--run-dir", str(run_dir), "--no-display",
        f"stop.wall_seconds={FIRST_FRAMES_S + warmup_s + window_s}", *overrides,
    ]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    started = time.monotonic()
    gpu = GpuSampler()
    try:
        while _frames(run_dir) == 0:
            if process.poll() is not None or time.monotonic() - started > FIRST_FRAMES_S:
                raise RuntimeError(f"{experiment} gave no frames in {FIRST_FRAMES_S:.0f}s")
            time.sleep(0.2)
        first_frames_s = time.monotonic() - started
        time.sleep(warmup_s)
        pids = {w: v["pid"] for w, v in _workers(run_dir).items()}
        cpu0, frames0, t0 = _cpu(pids), _frames(run_dir), time.monotonic()
        records0 = len(read_metrics(run_dir))
        gpu.start()
        time.sleep(window_s)
        gpu_use = gpu.stop()
        cpu1, frames1, t1 = _cpu(pids), _frames(run_dir), time.monotonic()
        in_window = read_metrics(run_dir)[records0:]
    finally:
        gpu.stop()  # (nothing left to stop once the window ended)
        process.send_signal(2)  # SIGINT: the controller stops every worker in order
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    emulator = (frames1 - frames0) * pixels.FRAME_SKIP
    used = {w: cpu1[w] - cpu0[w] for w in pids if w in cpu0 and w in cpu1}
    workers = _workers(run_dir)
    return {
        "first_frames_s": first_frames_s,
        "window_s": t1 - t0,
        "agent_steps": frames1 - frames0,
        "fps": emulator / (t1 - t0),
        "cpu_percent": 100.0 * sum(used.values()) / (t1 - t0),
        "us_per_frame": {w: 1e6 * s / max(emulator, 1) for w, s in used.items()},
        "peak_rss_mb": {w: float(v.get("peak_rss_mb") or 0.0) for w, v in workers.items()},
        "restarts": sum(int(v.get("restarts") or 0) for v in workers.values()),
        "timing": window_timing(in_window),
        "gpu": gpu_use,
        "trainer": trainer_figures(in_window),
    }


def copied_bytes_per_frame(batch: int = 4, segment_length: int = 128) -> dict[str, float]:
    """Bytes copied on the observation path for one emulator frame, as pong-ppo sends them
    (``batch`` environments a request, ``segment_length``-step segments).

    Counted copies, from the code path: the actor stacks a request's observations (1x) and
    records the step into its segment buffer (1x) and the completed segment out of it (1x a
    trained step, plus the bootstrap step). Over a socket, every byte of a message is copied
    into the kernel and out of it again (2x the message), and the trainer copies a chunk out
    of its frame (1x). Through shared memory, the actor writes the request and the chunk into
    slots once each, the policy worker reads the request in place, the trainer copies the chunk
    out (1x). The message sizes are the wire codec's (:func:`pixels.wire_bytes`).
    """
    wire = pixels.wire_bytes(batch=batch, segment_length=segment_length)
    obs, boot = wire.obs_bytes, (segment_length + 1) / segment_length
    actor = obs + obs + obs * boot  # stack, record, cut the segment out
    socket = actor + 2 * wire.inference_per_obs + 3 * wire.samples_per_step
    shared = actor + obs + 2 * obs * boot  # slot writes, and the trainer's copy out
    return {
        "socket": socket / pixels.FRAME_SKIP,
        "shm": shared / pixels.FRAME_SKIP,
        "obs_bytes": obs,
        "per": "emulator frame (agent step / frame skip)",
    }


def trainer_figures(records: list[dict[str, Any]]) -> dict[str, float]:
    """Over a window's metrics records: each trainer's mean ``step_s`` and its last
    ``minibatch_graphs`` (PPO with ``cuda_graphs``), by policy."""
    out: dict[str, float] = {}
    steps: dict[str, list[float]] = {}
    for record in records:
        for key, value in record.items():
            parts = key.split("/")
            if len(parts) != 3 or parts[0] != "trainer" or not isinstance(value, (int, float)):
                continue
            if parts[2] == "step_s":
                steps.setdefault(parts[1], []).append(float(value))
            elif parts[2] == "minibatch_graphs":
                out[f"{parts[1]}/minibatch_graphs"] = float(value)
    for policy, values in steps.items():
        out[f"{policy}/step_s"] = sum(values) / len(values)
    return out


def trainer_row(figures: dict[str, float]) -> str:
    """``default 0.222 s, 1 graph`` for each policy's trainer; ``-`` when none reported."""
    parts = []
    for key in sorted(k for k in figures if k.endswith("/step_s")):
        policy = key.split("/")[0]
        part = f"{policy} {figures[key]:.3f} s"
        graphs = figures.get(f"{policy}/minibatch_graphs")
        if graphs is not None:
            part += f", {graphs:.0f} graph{'s' if graphs != 1 else ''}"
        parts.append(part)
    return "; ".join(parts) or "-"


def gpu_row(gpu: dict[str, Any] | None) -> str:
    if not gpu:
        return "no GPU (nvidia-smi not found or silent)"
    return (f"{gpu['utilisation_mean']:.0f}%, {gpu['utilisation_max']:.0f}%; "
            f"{gpu['memory_peak_mib']:,.0f} MiB")  # fmt: skip


def _workers(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / run_folder.WORKERS).read_text())
    except (OSError, ValueError):
        return {}
