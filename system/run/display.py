"""The controller's terminal display: a live rich panel on a TTY, compact plain lines elsewhere.

The controller calls `update(snapshot)` as often as it likes; on a terminal the panel is redrawn at
most 4 times a second from the latest snapshot, elsewhere (CI, pipes, log files) one plain line is
printed at most every few seconds. Rendering tolerates any missing or malformed entry (shown as
"-"), because a display must never be the thing that stops a run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from system.roles import WorkerState

_REFRESH_PER_SECOND = 4
_TRAINER_STATS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")
_STATE_STYLES = {
    WorkerState.ALIVE: "green",
    WorkerState.FAILED: "bold red",
    WorkerState.RESTARTING: "yellow",
}
_MISSING = "-"


def _state(worker: Mapping[str, Any]) -> WorkerState | None:
    """A snapshot worker's state (the controller sends its value), None if missing or unknown."""
    try:
        return WorkerState(worker.get("state"))
    except (ValueError, TypeError):
        return None


def _alive(worker: Mapping[str, Any]) -> bool:
    return _state(worker) is WorkerState.ALIVE


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _fmt(value: Any, spec: str, unit: str = "") -> str:
    """`value` formatted with `spec` plus `unit`, or "-" when it is missing or not a number."""
    number = _num(value)
    return _MISSING if number is None else format(number, spec) + unit


def _fmt_stat(value: Any) -> str:
    """Losses span many magnitudes: 4 significant digits, scientific when tiny."""
    number = _num(value)
    if number is None:
        return _MISSING
    return f"{number:.2e}" if number != 0 and abs(number) < 1e-3 else f"{number:.4g}"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _workers(snapshot: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    workers = snapshot.get("workers")
    if not isinstance(workers, (list, tuple)):
        return []
    return [w for w in workers if isinstance(w, Mapping)]


def _policies(snapshot: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(k): _mapping(v) for k, v in _mapping(snapshot.get("policies")).items()}


def plain_line(snapshot: Mapping[str, Any]) -> str:
    """One compact line: "[  12.3s] frames 45,000 (3,650/s) return 187.2 eval 201.0/475 v12 ..."."""
    parts = [
        f"[{_fmt(snapshot.get('elapsed_s'), '6.1f', 's'):>7}]",
        f"frames {_fmt(snapshot.get('env_frames'), ',.0f')}",
        f"({_fmt(snapshot.get('fps'), ',.0f')}/s)",
        f"return {_fmt(snapshot.get('episode_return'), '.1f')}",
        f"eval {_fmt(snapshot.get('eval_return'), '.1f')}/{_fmt(snapshot.get('target'), 'g')}",
    ]
    if _num(snapshot.get("game_return")) is not None:  # the unclipped score (Atari)
        parts.insert(4, f"game {_fmt(snapshot.get('game_return'), '.1f')}")
    policies = _policies(snapshot)
    for name, policy in policies.items():
        label = "" if len(policies) == 1 else f"{name}:"
        version = f"{label}v{_fmt(policy.get('version'), '.0f')}"
        lag = _num(policy.get("lag"))
        parts.append(version if lag is None else f"{version} lag {lag:.1f}")
    workers = _workers(snapshot)
    if workers:
        alive = sum(1 for w in workers if _alive(w))
        restarts = sum(int(_num(w.get("restarts")) or 0) for w in workers)
        parts.append(f"workers {alive}/{len(workers)}")
        if restarts:
            parts.append(f"restarts {restarts}")
    custom = _custom(snapshot)
    if custom:
        parts.append(f"| {custom}")
    bottleneck = snapshot.get("bottleneck")
    if isinstance(bottleneck, str) and bottleneck:
        parts.append(f"| {bottleneck}")
    return " ".join(parts)


def _custom(snapshot: Mapping[str, Any]) -> str:
    """What the user's actor callbacks logged (``Episode.log``): ``name 1.23`` each."""
    custom = snapshot.get("custom")
    if not isinstance(custom, Mapping):
        return ""
    return " ".join(f"{name} {_fmt(value, '.3g')}" for name, value in sorted(custom.items()))


def _header(snapshot: Mapping[str, Any]) -> Table:
    grid = Table.grid(padding=(0, 3))
    for _ in range(5):
        grid.add_column()
    eval_text = f"{_fmt(snapshot.get('eval_return'), '.1f')} / {_fmt(snapshot.get('target'), 'g')}"
    grid.add_row(
        Text("elapsed", style="dim"),
        Text("env frames", style="dim"),
        Text("frames/s", style="dim"),
        Text("return (train)", style="dim"),
        Text("eval (greedy) / target", style="dim"),
    )
    grid.add_row(
        _fmt(snapshot.get("elapsed_s"), ".1f", "s"),
        _fmt(snapshot.get("env_frames"), ",.0f"),
        _fmt(snapshot.get("fps"), ",.0f"),
        _fmt(snapshot.get("episode_return"), ".2f"),
        eval_text,
    )
    return grid


def _policy_table(snapshot: Mapping[str, Any]) -> Table:
    policies = _policies(snapshot)
    stats = [
        s for s in _TRAINER_STATS if any(s in _mapping(p.get("trainer")) for p in policies.values())
    ]
    table = Table(title="policies", title_justify="left", expand=False, box=None, pad_edge=False)
    table.add_column("policy")
    table.add_column("version", justify="right")
    table.add_column("lag", justify="right")
    for stat in stats:
        table.add_column(stat, justify="right")
    for name, policy in policies.items():
        trainer = _mapping(policy.get("trainer"))
        table.add_row(
            name,
            _fmt(policy.get("version"), ".0f"),
            _fmt(policy.get("lag"), ".1f"),
            *(_fmt_stat(trainer.get(s)) for s in stats),
        )
    if not policies:
        table.add_row(_MISSING, _MISSING, _MISSING)
    return table


def _worker_table(snapshot: Mapping[str, Any], max_rows: int) -> Table:
    workers = _workers(snapshot)
    alive = sum(1 for w in workers if _alive(w))
    table = Table(
        title=f"workers {alive}/{len(workers)} alive" if workers else "workers -",
        title_justify="left",
        box=None,
        pad_edge=False,
    )
    for column in ("id", "role", "state"):
        table.add_column(column)
    table.add_column("restarts", justify="right")
    table.add_column("heartbeat", justify="right")
    # Trouble first: with dozens of actors the healthy ones are the ones worth hiding.
    ordered = sorted(workers, key=_alive)
    for worker in ordered[:max_rows]:
        state = _state(worker)
        table.add_row(
            str(worker.get("id", _MISSING)),
            str(worker.get("role", _MISSING)),
            Text(str(worker.get("state", _MISSING)), style=_STATE_STYLES.get(state, "")),
            _fmt(worker.get("restarts"), ".0f"),
            _fmt(worker.get("heartbeat_age_s"), ".1f", "s"),
        )
    if len(ordered) > max_rows:
        table.add_row(f"... {len(ordered) - max_rows} more", "", "", "", "")
    return table


def render_panel(experiment: str, snapshot: Mapping[str, Any], max_worker_rows: int = 12) -> Panel:
    """The rich renderable for one snapshot (what the live display shows)."""
    bottleneck = snapshot.get("bottleneck")
    line = bottleneck if isinstance(bottleneck, str) and bottleneck else _MISSING
    custom = _custom(snapshot)
    body = Group(
        _header(snapshot),
        Text.assemble(("bottleneck  ", "dim"), line),
        *([Text.assemble(("logged      ", "dim"), custom)] if custom else []),
        Text(""),
        _policy_table(snapshot),
        Text(""),
        _worker_table(snapshot, max_worker_rows),
    )
    return Panel(body, title=f"[bold]Troupe[/] · {experiment}", title_align="left", expand=False)


class LiveDisplay:
    """Progress display for a run: `start()`, `update(snapshot)` any number of times, `stop()`.

    `enabled=None` shows the live panel only when the console is a terminal; `enabled=False` (or
    no terminal) prints one plain line per `update`, at most every `plain_interval_s` seconds, and a
    final line on `stop()`. `console` and `clock` are injectable for tests.

    A snapshot looks like (every key optional)::

        {"elapsed_s": 12.3, "env_frames": 45000, "fps": 3650.0, "episode_return": 187.2,
         "eval_return": 201.0, "target": 475.0,
         "bottleneck": "trainer busy 97% (compute 81%); actor waits 58% (wait_actions)",
         "policies": {"default": {"version": 12, "lag": 1.5,
                                  "trainer": {"policy_loss": -0.01, "value_loss": 0.3}}},
         "workers": [{"id": "actor/0", "role": "actor", "state": "alive", "restarts": 0,
                      "heartbeat_age_s": 0.4}]}
    """

    def __init__(
        self,
        experiment: str,
        enabled: bool | None = None,
        *,
        console: Console | None = None,
        plain_interval_s: float = 5.0,
        max_worker_rows: int = 12,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.experiment = experiment
        self.console = console if console is not None else Console()
        self.live_enabled = self.console.is_terminal if enabled is None else enabled
        self.plain_interval_s = plain_interval_s
        self.max_worker_rows = max_worker_rows
        self._clock = clock
        self._snapshot: Mapping[str, Any] = {}
        self._last_print: float | None = None
        self._live: Live | None = None
        self._started = False

    def _renderable(self) -> Panel:
        try:
            return render_panel(self.experiment, self._snapshot, self.max_worker_rows)
        except Exception as e:  # the refresh thread must survive any odd snapshot
            return Panel(Text(f"display error: {e!r}", style="red"), title=self.experiment)

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self.live_enabled:
            self._live = Live(
                console=self.console,
                get_renderable=self._renderable,
                refresh_per_second=_REFRESH_PER_SECOND,
                transient=False,
            )
            self._live.start()

    def update(self, snapshot: Mapping[str, Any]) -> None:
        """Show `snapshot`; see the class docstring for its shape. Never raises on missing keys."""
        self._snapshot = snapshot if isinstance(snapshot, Mapping) else {}
        if not self._started:
            self.start()
        if self._live is not None:
            return  # the Live refresh thread redraws from the latest snapshot
        now = self._clock()
        if self._last_print is None or now - self._last_print >= self.plain_interval_s:
            self._last_print = now
            self._print_line(plain_line(self._snapshot))

    def stop(self) -> None:
        """Stop the live panel (left on screen) and print a final plain line."""
        if not self._started:
            return
        self._started = False
        if self._live is not None:
            self._live.stop()
            self._live = None
        self._print_line(f"{plain_line(self._snapshot)} (final)")

    def _print_line(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def __enter__(self) -> LiveDisplay:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
