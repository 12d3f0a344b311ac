"""The controller's terminal display: a live rich panel on a TTY, compact plain lines elsewhere.

The controller calls `update(snapshot)` as often as it likes with a :class:`Snapshot` (the
tally makes it); on a terminal the panel is redrawn at most 4 times a second from the latest
one, elsewhere (CI, pipes, log files) one plain line is printed at most every few seconds. A
figure not known yet, or not finite, is shown as "-".
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from system.console import Console
from system.roles import WorkerState

_REFRESH_PER_SECOND = 4
_TRAINER_STATS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")
_STATE_STYLES = {
    WorkerState.ALIVE: "green",
    WorkerState.FAILED: "bold red",
    WorkerState.KILLED: "red",
    WorkerState.RESTARTING: "yellow",
}
_MISSING = "-"
GONE_NOTE = "progress lines stop; the run goes on (its folder, `troupe status` and `troupe logs`)"


@dataclass(frozen=True)
class PolicyLine:
    """A trained policy's row: the version its trainer published, the policy lag, its stats."""

    version: int | None = None
    lag: float | None = None
    trainer: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerLine:
    """A worker's row."""

    id: str
    role: str
    state: WorkerState
    restarts: int = 0
    heartbeat_age_s: float | None = None


@dataclass(frozen=True)
class Snapshot:
    """What the panel shows at one moment; None where a figure is not known yet."""

    elapsed_s: float | None = None
    env_frames: int | None = None
    fps: float | None = None
    """Frames a second lately (the metrics' ``fps_recent``), not the mean since the launch."""
    frames_per_step: int = 1
    """Emulator frames an environment step (Atari: 4); shown beside frames where more than 1."""
    episode_return: float | None = None
    eval_return: float | None = None
    game_return: float | None = None
    """Whole games' unclipped score (Atari), where the environment reports one."""
    target: float | None = None
    custom: dict[str, float] = field(default_factory=dict)
    """What the user's callbacks logged, by the label the panel gives it."""
    policies: dict[str, PolicyLine] = field(default_factory=dict)
    workers: tuple[WorkerLine, ...] = ()
    bottleneck: str = ""
    """The saturated role and the one that waits (``system.timing.bottleneck``)."""


def _alive(worker: WorkerLine) -> bool:
    return worker.state is WorkerState.ALIVE


_COMING = (WorkerState.STARTING, WorkerState.CONFIGURING, WorkerState.RESTARTING)


def _worker_count(workers: tuple[WorkerLine, ...], alive_word: str = "") -> str:
    """``5/6`` (``5/6 alive`` in the panel) while the run goes on; once none is alive or on
    its way, how they ended: ``9 stopped``, ``8 stopped, 1 failed``. The final line said
    ``workers 0/9`` after every run, as if none had ever come up."""
    alive = sum(1 for w in workers if _alive(w))
    if alive or any(w.state in _COMING for w in workers):
        return f"{alive}/{len(workers)}{alive_word}"
    ended = Counter(str(w.state) for w in workers)
    return ", ".join(f"{n} {state}" for state, n in sorted(ended.items()))


def _num(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    """`value` formatted with `spec` plus `unit`, or "-" when it is missing or not finite."""
    number = _num(value)
    return _MISSING if number is None else format(number, spec) + unit


def _fmt_return(value: float | None, spec: str) -> str:
    """A return: with ``spec``, or 4 significant digits from ten million up (an environment
    that pays 1e30 a step filled the panel's line with a 33-digit number)."""
    number = _num(value)
    if number is not None and abs(number) >= LARGE_RETURN:
        return f"{number:.4g}"
    return _fmt(value, spec)


LARGE_RETURN = 1e7


def _fmt_stat(value: float | None) -> str:
    """Losses span many magnitudes: 4 significant digits, scientific when tiny."""
    number = _num(value)
    if number is None:
        return _MISSING
    return f"{number:.2e}" if number != 0 and abs(number) < 1e-3 else f"{number:.4g}"


def plain_line(snapshot: Snapshot) -> str:
    """One compact line: "[  12.3s] frames 45,000 (3,650/s) return 187.2 eval 201.0/475 v12 ..."."""
    s = snapshot
    parts = [
        f"[{_fmt(s.elapsed_s, '6.1f', 's'):>7}]",
        f"frames {_fmt(s.env_frames, ',.0f')}",
        f"({_fmt(s.fps, ',.0f')}/s{_emulator(s)})",
        f"return {_fmt_return(s.episode_return, '.1f')}",
        f"eval {_fmt_return(s.eval_return, '.1f')}/{_fmt(s.target, 'g')}",
    ]
    if _num(s.game_return) is not None:  # the unclipped score (Atari)
        parts.insert(4, f"game {_fmt_return(s.game_return, '.1f')}")
    for name, policy in s.policies.items():
        label = "" if len(s.policies) == 1 else f"{name}:"
        version = f"{label}v{_fmt(policy.version, '.0f')}"
        lag = _num(policy.lag)
        parts.append(version if lag is None else f"{version} lag {lag:.1f}")
    if s.workers:
        restarts = sum(w.restarts for w in s.workers)
        parts.append(f"workers {_worker_count(s.workers)}")
        building = sum(1 for w in s.workers if w.state is WorkerState.CONFIGURING)
        if building:  # an environment slow to make: minutes of "workers 0/6" said nothing
            parts.append(f"({building} building)")
        if restarts:
            parts.append(f"restarts {restarts}")
    custom = _custom(s)
    if custom:
        parts.append(f"| {custom}")
    if s.bottleneck:
        parts.append(f"| {s.bottleneck}")
    return " ".join(parts)


def _emulator(snapshot: Snapshot, plain: bool = True) -> str:
    """``; x4 = 34,500 emulator frames/s`` (the panel: `` (x4: 34,500 emulator)``) where a step
    covers several emulator frames: the frames the panel counts are agent steps, and the
    emulator's rate is what Atari figures elsewhere (Sample Factory's, the raw ceiling's) count."""
    k, fps = snapshot.frames_per_step, _num(snapshot.fps)
    if k == 1 or fps is None:
        return ""
    rate = f"{fps * k:,.0f}"
    return f"; x{k} = {rate} emulator frames/s" if plain else f" (x{k}: {rate} emulator)"


def _custom(snapshot: Snapshot) -> str:
    """What the user's actor callbacks logged (``Episode.log``): ``name 1.23`` each."""
    return " ".join(f"{k} {_fmt(v, '.3g')}" for k, v in sorted(snapshot.custom.items()))


def _header(snapshot: Snapshot) -> Table:
    grid = Table.grid(padding=(0, 3))
    for _ in range(5):
        grid.add_column()
    eval_text = f"{_fmt_return(snapshot.eval_return, '.1f')} / {_fmt(snapshot.target, 'g')}"
    grid.add_row(
        Text("elapsed", style="dim"),
        Text("env frames", style="dim"),
        Text("frames/s", style="dim"),
        Text("return (train)", style="dim"),
        Text("eval (greedy) / target", style="dim"),
    )
    grid.add_row(
        _fmt(snapshot.elapsed_s, ".1f", "s"),
        _fmt(snapshot.env_frames, ",.0f"),
        _fmt(snapshot.fps, ",.0f") + _emulator(snapshot, plain=False),
        _fmt_return(snapshot.episode_return, ".2f"),
        eval_text,
    )
    return grid


def _policy_table(snapshot: Snapshot) -> Table:
    policies = snapshot.policies
    stats = [s for s in _TRAINER_STATS if any(s in p.trainer for p in policies.values())]
    table = Table(title="policies", title_justify="left", expand=False, box=None, pad_edge=False)
    table.add_column("policy")
    table.add_column("version", justify="right")
    table.add_column("lag", justify="right")
    for stat in stats:
        table.add_column(stat, justify="right")
    for name, policy in policies.items():
        table.add_row(
            name,
            _fmt(policy.version, ".0f"),
            _fmt(policy.lag, ".1f"),
            *(_fmt_stat(policy.trainer.get(s)) for s in stats),
        )
    if not policies:
        table.add_row(_MISSING, _MISSING, _MISSING)
    return table


def _worker_table(snapshot: Snapshot, max_rows: int) -> Table:
    workers = snapshot.workers
    table = Table(
        title=f"workers {_worker_count(workers, ' alive')}" if workers else "workers -",
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
        table.add_row(
            worker.id,
            worker.role,
            Text(worker.state.value, style=_STATE_STYLES.get(worker.state, "")),
            str(worker.restarts),
            _fmt(worker.heartbeat_age_s, ".1f", "s"),
        )
    if len(ordered) > max_rows:
        table.add_row(f"... {len(ordered) - max_rows} more", "", "", "", "")
    return table


def render_panel(experiment: str, snapshot: Snapshot, max_worker_rows: int = 12) -> Panel:
    """The rich renderable for one snapshot (what the live display shows)."""
    line = snapshot.bottleneck or _MISSING
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
        self.console = console if console is not None else Console(gone_note=GONE_NOTE)
        self.live_enabled = self.console.is_terminal if enabled is None else enabled
        self.plain_interval_s = plain_interval_s
        self.max_worker_rows = max_worker_rows
        self._clock = clock
        self._snapshot = Snapshot()
        self._last_print: float | None = None
        self._live: Live | None = None
        self._started = False
        self._stopped = False  # by stop(final=False): final() says the last figures

    def _renderable(self) -> Panel:
        try:
            return render_panel(self.experiment, self._snapshot, self.max_worker_rows)
        except Exception as e:  # the refresh thread must survive a rendering bug
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

    def update(self, snapshot: Snapshot) -> None:
        """Show `snapshot` (on a terminal at the next refresh; elsewhere now, rate limited)."""
        self._snapshot = snapshot
        if not self._started:
            self.start()
        if self._live is not None:
            return  # the Live refresh thread redraws from the latest snapshot
        now = self._clock()
        if self._last_print is None or now - self._last_print >= self.plain_interval_s:
            self._last_print = now
            self._print_line(plain_line(self._snapshot))

    def stop(self, final: bool = True) -> None:
        """Stop the live panel (left on screen) and print a final plain line (``final``; else
        :meth:`final` prints it, from figures that come later)."""
        if not self._started:
            return
        self._started = False
        self._stopped = not final  # final() prints the line then, once
        if self._live is not None:
            self._live.stop()
            self._live = None
        if final:
            self._print_line(f"{plain_line(self._snapshot)} (final)")

    def final(self, snapshot: Snapshot) -> None:
        """The final plain line of a display stopped without it, from ``snapshot``: the run's
        last record, which its summary counts (the last shown one was up to a second older,
        and older still after a stop in order: 175,550 frames said, 188,609 in the summary)."""
        if self._stopped:
            self._stopped = False
            self._print_line(f"{plain_line(snapshot)} (final)")

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
