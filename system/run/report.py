"""What a run leaves behind: the learning-curve PNG (and a multi-agent
run's win rates), `summary.json`.

Everything here reads or writes files in a run folder and nothing else, so the same functions serve
the controller at the end of a run, a resumed run, and someone inspecting an old run by hand.
`metrics.jsonl` is read through :mod:`system.run.metrics_file`.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from system import run_folder
from system.run.metrics_file import read_metrics

logger = logging.getLogger(__name__)

METRICS_FILE = run_folder.METRICS
LEARNING_CURVE_FILE = run_folder.LEARNING_CURVE
WIN_RATES_FILE = run_folder.WIN_RATES
SUMMARY_FILE = run_folder.SUMMARY

_TRAIN_COLOR = "tab:blue"
_EVAL_COLOR = "tab:orange"
_TARGET_COLOR = "tab:green"


def jsonable(value: Any) -> Any:
    """Return `value` as something `json.dumps(..., allow_nan=False)` accepts.

    numpy scalars become Python numbers, non-finite floats become None (JSON has no NaN), mappings,
    sequences and arrays are converted recursively, and anything else unknown becomes its `str`.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy / torch scalar
        return jsonable(value.item())
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # numpy / torch arrays
        return jsonable(value.tolist())
    return str(value)


_SUMMARISED = frozenset(
    {"env_frames", "emulator_frames", "wall_s", "eval_return", "episode_return", "trainer_steps"}
)


def summarised(key: str) -> bool:
    """The keys of a record that the summary and the plots read."""
    return (
        key in _SUMMARISED
        or key.startswith(("result/", "eval/result/"))
        or (key.startswith(("policy/", "trainer/")) and key.endswith(("/version", "/steps")))
    )


def write_summary(run_dir: str | Path, summary: Mapping[str, Any]) -> Path:
    """Write `summary` to `run_dir/summary.json` atomically, pretty-printed; return its path."""
    path = Path(run_dir) / SUMMARY_FILE
    text = json.dumps(jsonable(summary), indent=2, allow_nan=False) + "\n"
    run_folder.write_bytes(path, text.encode("utf-8"))
    return path


def _number(value: Any) -> float | None:
    """`value` as a finite float, or None when it is missing, non-numeric or non-finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _last(records: list[dict[str, Any]], key: str) -> float | None:
    for record in reversed(records):
        value = _number(record.get(key))
        if value is not None:
            return value
    return None


def _values(records: Iterable[dict[str, Any]], key: str) -> list[float]:
    return [v for v in (_number(r.get(key)) for r in records) if v is not None]


def _as_int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _last_per_policy(records: list[dict[str, Any]], prefix: str, suffix: str) -> dict[str, float]:
    """Last value of every `<prefix><name><suffix>` key, by name, e.g. policy/<name>/version."""
    found: dict[str, float] = {}
    for record in records:
        for key, value in record.items():
            if key.startswith(prefix) and key.endswith(suffix) and len(key) > len(prefix + suffix):
                number = _number(value)
                if number is not None:
                    found[key[len(prefix) : -len(suffix)]] = number
    return found


def _first_reaching(records: list[dict[str, Any]], target: float | None) -> dict[str, Any] | None:
    if target is None:
        return None
    for record in records:
        value = _number(record.get("eval_return"))
        if value is not None and value >= target:
            return record
    return None


def _moment(record: dict[str, Any] | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {"env_frames": _as_int(_number(record.get("env_frames"))),
            "wall_s": _number(record.get("wall_s"))}  # fmt: skip


def build_summary(
    records: list[dict[str, Any]],
    *,
    solved: bool,
    wall_s: float,
    target: float | None,
    stop_reason: str,
    solved_at: tuple[int, float] | None = None,
) -> dict[str, Any]:
    """Derive the end-of-run summary from the metrics records.

    `trainer_steps` is the last "trainer_steps" value when the controller logs one, otherwise the
    sum over policies of the last "trainer/<name>/steps" values (None when neither is logged).
    `frames_to_target` / `wall_s_to_target`: `solved_at`, the env frames and wall seconds at
    which the stopping rule found the target met (None for a run not solved). The first record
    whose evaluation mean reached `target` (of any versions, not yet confirmed) is
    `first_eval_at_target`: a lucky window comes sooner than a solved run, so it is never the
    time to solve.
    """
    env_frames = _as_int(_last(records, "env_frames"))
    eval_returns = _values(records, "eval_return")
    episode_returns = _values(records, "episode_return")
    versions = _last_per_policy(records, "policy/", "/version")
    trainer_steps = _last(records, "trainer_steps")
    if trainer_steps is None:
        per_policy = _last_per_policy(records, "trainer/", "/steps")
        trainer_steps = sum(per_policy.values()) if per_policy else None
    reached = _first_reaching(records, target)
    emulator = _as_int(_last(records, "emulator_frames"))  # Atari: env_frames x its frame skip
    return {
        "solved": bool(solved),
        "stop_reason": stop_reason,
        "wall_s": round(float(wall_s), 3),
        "env_frames": env_frames,
        "fps": round(env_frames / wall_s, 1) if env_frames is not None and wall_s > 0 else None,
        **({} if emulator is None else {"emulator_frames": emulator}),
        "target": target,
        "best_eval_return": max(eval_returns) if eval_returns else None,
        "final_eval_return": eval_returns[-1] if eval_returns else None,
        "best_episode_return": max(episode_returns) if episode_returns else None,
        "final_episode_return": episode_returns[-1] if episode_returns else None,
        "frames_to_target": None if solved_at is None else int(solved_at[0]),
        "wall_s_to_target": None if solved_at is None else round(float(solved_at[1]), 3),
        "first_eval_at_target": _moment(reached),
        "policy_versions": {name: int(v) for name, v in versions.items()},
        "trainer_steps": _as_int(trainer_steps),
        "num_records": len(records),
    }


def _series(records: list[dict[str, Any]], x_key: str, y_key: str) -> tuple[list, list]:
    xs, ys = [], []
    for record in records:
        x, y = _number(record.get(x_key)), _number(record.get(y_key))
        if x is not None and y is not None:
            xs.append(x)
            ys.append(y)
    return xs, ys


def _time_axis(records: list[dict[str, Any]]) -> tuple[str, float]:
    """Label and divisor for the wall-clock axis, so long runs read in minutes or hours."""
    longest = max(_values(records, "wall_s"), default=0.0)
    if longest >= 3 * 3600:
        return "wall-clock time (hours)", 3600.0
    if longest >= 10 * 60:
        return "wall-clock time (minutes)", 60.0
    return "wall-clock time (seconds)", 1.0


def _plot_panel(
    ax: Any,
    records: list[dict[str, Any]],
    x_key: str,
    x_label: str,
    x_divisor: float,
    target: float | None,
) -> None:
    from matplotlib.ticker import EngFormatter

    train_x, train_y = _series(records, x_key, "episode_return")
    eval_x, eval_y = _series(records, x_key, "eval_return")
    train_x = [x / x_divisor for x in train_x]
    eval_x = [x / x_divisor for x in eval_x]
    if train_x:
        ax.plot(train_x, train_y, color=_TRAIN_COLOR, lw=1.2, label="episode return (training)")
    if eval_x:
        ax.plot(
            eval_x,
            eval_y,
            color=_EVAL_COLOR,
            lw=1.5,
            marker="o",
            ms=3.5,
            label="eval return (greedy)",
        )
    if target is not None and (train_x or eval_x):
        ax.axhline(target, color=_TARGET_COLOR, ls="--", lw=1, label=f"target {target:g}")
    if train_x or eval_x:
        ax.legend(loc="best", fontsize=8)
    else:
        ax.text(
            0.5,
            0.5,
            f"no returns with {x_key} yet",
            ha="center",
            va="center",
            transform=ax.transAxes,
            color="gray",
        )
        ax.set_xticks([])
        ax.set_yticks([])
    ax.set_xlabel(x_label)
    ax.set_ylabel("return")
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.grid(True, alpha=0.3)


def write_learning_curve(
    run_dir: str | Path,
    title: str = "",
    *,
    target: float | None = None,
    records: list[dict[str, Any]] | None = None,
) -> Path:
    """Plot returns from `run_dir/metrics.jsonl` into `run_dir/learning_curve.png`; return its path.

    Left: training-actor episode return and greedy eval return against environment frames; right:
    the same against wall-clock seconds. Missing keys leave a series out; with no data at all the
    picture says "no data yet". Uses the Agg canvas directly: no pyplot, no display, no global
    backend switch in the caller's process. `records`: the run's, already read.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    run_dir = Path(run_dir)
    records = read_metrics(run_dir, summarised) if records is None else records
    fig = Figure(figsize=(12, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    has_returns = any(
        _number(r.get("episode_return")) is not None or _number(r.get("eval_return")) is not None
        for r in records
    )
    if not has_returns:
        ax = fig.add_subplot(1, 1, 1)
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no data yet", ha="center", va="center", fontsize=20, color="gray")
    else:
        by_frames, by_time = fig.subplots(1, 2)
        _plot_panel(by_frames, records, "env_frames", _frames_label(records), 1.0, target)
        _plot_panel(by_time, records, "wall_s", *_time_axis(records), target)
    fig.suptitle(title or run_dir.name)
    return _save_png(fig, run_dir / LEARNING_CURVE_FILE)


def _frames_label(records: list[dict[str, Any]]) -> str:
    """What the frames axis counts: environment steps, which on Atari are agent steps of
    several emulator frames (a Pong curve to 3.6M read as 3.6M frames where it was 14.5M)."""
    for record in reversed(records):
        steps, emulator = _number(record.get("env_frames")), _number(record.get("emulator_frames"))
        if steps and emulator:
            return f"agent steps (env_frames; {emulator / steps:g} emulator frames each)"
    return "environment frames"


def _save_png(fig: Any, path: Path) -> Path:
    fig.tight_layout()  # a full disk leaves no half picture behind
    run_folder.write_atomically(path, lambda f: fig.savefig(f, format="png"), sync=False)
    return path


def matchup_keys(records: list[dict[str, Any]], first: Iterable[str] = ()) -> list[str]:
    """The ``result/<a>_vs_<b>`` keys (and their ``eval/`` ones) of a run's metrics, one side
    of each pair (``b_vs_a`` is one minus ``a_vs_b``): ``a`` among ``first`` where one is."""
    first = set(first)
    keys = sorted({k for r in records for k in r if k.startswith(("result/", "eval/result/"))})
    chosen = []
    for key in keys:
        prefix, pair = key.rsplit("result/", 1)
        a, _, b = pair.partition("_vs_")
        mirror = f"{prefix}result/{b}_vs_{a}"
        if (
            mirror not in keys
            or (a in first) > (b in first)
            or ((a in first) == (b in first) and a < b)
        ):
            chosen.append(key)
    return chosen


def write_win_rates(
    run_dir: str | Path,
    title: str = "",
    *,
    first: Iterable[str] = (),
    records: list[dict[str, Any]] | None = None,
) -> Path | None:
    """Plot every matchup's score (1 a win, 0.5 a draw; training over the last 100 games,
    evaluation over the last ``evaluation.episodes``, as metrics.jsonl has them) against frames
    into ``run_dir/win_rates.png``, training games solid and evaluation games dashed; None when
    the run has no matchups (a single-agent run). ``first``: the policies whose side of a pair
    is drawn (the trained ones); ``records``: the run's, already read."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter

    run_dir = Path(run_dir)
    records = read_metrics(run_dir, summarised) if records is None else records
    keys = matchup_keys(records, first)
    if not keys:
        return None
    fig = Figure(figsize=(9, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for key in keys:
        xs, ys = _series(records, "env_frames", key)
        evaluation = key.startswith("eval/")
        label = key.removeprefix("eval/").removeprefix("result/").replace("_vs_", " vs ")
        ax.plot(xs, ys, ls="--" if evaluation else "-", lw=1.3,
                label=f"{label} ({'greedy evaluation' if evaluation else 'training'})")  # fmt: skip
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("environment frames")
    ax.set_ylabel("score (1 win, 0.5 draw), recent games")
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.suptitle(title or run_dir.name)
    return _save_png(fig, run_dir / WIN_RATES_FILE)
