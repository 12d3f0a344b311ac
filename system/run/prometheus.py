"""The controller's Prometheus endpoint: a run's figures where a platform scrapes them.

``GET /metrics`` answers the text exposition format (version 0.0.4) rendered from the record the
controller made last (once a second, whether ``metrics.thin`` writes it to ``metrics.jsonl`` or
not) and its table of workers; nothing is
computed twice and a scrape never waits on the run. Off unless a port is asked for
(``troupe run --metrics-port``, ``troupe controller --metrics-port``, or
``TROUPE_METRICS_PORT``); cluster deployments open it on :data:`DEFAULT_PORT` and say so to
the scheduler (Kubernetes annotations, a published Swarm port).

Series (every one labelled with ``run``):

- ``troupe_env_frames_total``, ``troupe_frames_per_second`` (over the last 10 s),
  ``troupe_frames_per_second_mean`` (since the launch), ``troupe_wall_seconds``,
  ``troupe_episode_return``, ``troupe_episode_length``, ``troupe_eval_return``,
  ``troupe_run_running`` (1 until the run ends);
- ``troupe_policy_version{policy}``, ``troupe_policy_episode_return{policy}``;
- ``troupe_trainer_<stat>{policy}`` for each trainer statistic (``policy_lag_mean``,
  ``version_lag``, ``loss``, ``step_s``, ...);
- ``troupe_stage_share{role,stage}`` (share of wall time in each stage) and
  ``troupe_role_busy{role}`` (:mod:`system.timing`); ``troupe_policy_batch_rows{stat}``;
- ``troupe_worker_up{worker,role}``, ``troupe_worker_restarts_total{worker,role}``,
  ``troupe_worker_peak_rss_bytes{worker,role}``;
- ``troupe_custom{name}`` for what users log (``custom/...``), ``troupe_custom{name,policy}``
  for what they log for one policy (``policy/<name>/custom/...``); any other number of the
  record as ``troupe_metric{key}``, so nothing in ``metrics.jsonl`` is out of reach.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import socket
import threading
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from api.errors import UserError
from system import run_folder

logger = logging.getLogger(__name__)

DEFAULT_PORT = 9400
ENV_PORT = "TROUPE_METRICS_PORT"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

RUN_SERIES: dict[str, tuple[str, str, str]] = {
    # record key: (series, type, help)
    "env_frames": ("troupe_env_frames_total", "counter", "Environment frames played."),
    "emulator_frames": (
        "troupe_emulator_frames_total",
        "counter",
        "Emulator frames played: environment frames times the frame skip (Atari).",
    ),
    "fps_recent": (
        "troupe_frames_per_second",
        "gauge",
        "Environment frames a second, the last 10 s.",
    ),
    "fps": ("troupe_frames_per_second_mean", "gauge", "Environment frames a second, whole run."),
    "wall_s": ("troupe_wall_seconds", "gauge", "Seconds since the run started."),
    "episode_return": ("troupe_episode_return", "gauge", "Mean return of recent episodes."),
    "episode_length": ("troupe_episode_length", "gauge", "Mean length of recent episodes."),
    "eval_return": ("troupe_eval_return", "gauge", "Mean greedy evaluation return."),
}
HELP = {
    "troupe_run_running": ("gauge", "1 while the run goes on, 0 once it has ended."),
    "troupe_policy_version": ("gauge", "The newest published version of each policy."),
    "troupe_policy_episode_return": ("gauge", "Mean return of recent episodes, by policy."),
    "troupe_stage_share": ("gauge", "Share of a role's wall time spent in each stage."),
    "troupe_role_busy": ("gauge", "Share of a role's wall time not spent waiting."),
    "troupe_policy_batch_rows": ("gauge", "Rows of the policy workers' inference batches."),
    "troupe_worker_up": ("gauge", "1 if the worker is alive, else 0."),
    "troupe_worker_restarts_total": ("counter", "Times the worker was restarted."),
    "troupe_worker_peak_rss_bytes": ("gauge", "Peak resident memory of the worker's process."),
    "troupe_custom": ("gauge", "Numbers user hooks logged (custom/...)."),
    "troupe_metric": ("gauge", "Any other number of the metrics record, by its key."),
}


def render(
    record: Mapping[str, Any], workers: Mapping[str, Mapping[str, Any]], run: str, running: bool
) -> str:
    """The exposition text of one record and the workers' table."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}

    def add(series: str, value: Any, **labels: str) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        samples.setdefault(series, []).append(({"run": run, **labels}, float(value)))

    add("troupe_run_running", 1 if running else 0)
    for key, value in record.items():
        _place(key, value, add)
    for worker, info in workers.items():
        role = str(info.get("role", ""))
        add("troupe_worker_up", 1 if info.get("state") == "alive" else 0, worker=worker, role=role)
        add("troupe_worker_restarts_total", info.get("restarts", 0), worker=worker, role=role)
        rss = info.get("peak_rss_mb")
        if isinstance(rss, (int, float)):
            add("troupe_worker_peak_rss_bytes", rss * 2**20, worker=worker, role=role)
    return "".join(_family(series, rows) for series, rows in sorted(samples.items()))


def _place(key: str, value: Any, add) -> None:
    """Which series a record key feeds."""
    parts = key.split("/")
    if key in RUN_SERIES:
        add(RUN_SERIES[key][0], value)
    elif parts[0] == "policy" and len(parts) >= 4 and parts[2] == "custom":
        add("troupe_custom", value, name="/".join(parts[3:]), policy=parts[1])
    elif parts[0] == "policy" and len(parts) >= 3 and parts[-1] in ("version", "episode_return"):
        add(f"troupe_policy_{parts[-1]}", value, policy="/".join(parts[1:-1]))
    elif parts[0] == "trainer" and len(parts) >= 3:
        add(f"troupe_trainer_{_name(parts[-1])}", value, policy="/".join(parts[1:-1]))
    elif parts[0] == "timing" and len(parts) == 3:
        role, stage = parts[1], parts[2]
        if stage == "busy":
            add("troupe_role_busy", value, role=role)
        elif stage.startswith("batch_rows_"):
            add("troupe_policy_batch_rows", value, stat=stage.removeprefix("batch_rows_"))
        else:
            add("troupe_stage_share", value, role=role, stage=stage)
    elif parts[0] == "custom":
        add("troupe_custom", value, name="/".join(parts[1:]))
    else:
        add("troupe_metric", value, key=key)


def _name(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", text)


def _family(series: str, rows: list[tuple[dict[str, str], float]]) -> str:
    kind, text = HELP.get(series) or _run_help(series)
    lines = [f"# HELP {series} {text}", f"# TYPE {series} {kind}"]
    for labels, value in rows:
        inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        lines.append(f"{series}{{{inner}}} {_number(value)}")
    return "\n".join(lines) + "\n"


def _run_help(series: str) -> tuple[str, str]:
    for name, kind, text in RUN_SERIES.values():
        if name == series:
            return kind, text
    stat = series.removeprefix("troupe_trainer_")
    return "gauge", f"Trainer statistic {stat}, by policy."


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


def series_names(text: str) -> set[str]:
    """The series an exposition text holds (what a dashboard may plot)."""
    return {line.split("{", 1)[0].split(" ", 1)[0] for line in _samples(text)}


def _samples(text: str) -> Iterable[str]:
    return (line for line in text.splitlines() if line and not line.startswith("#"))


class MetricsEndpoint:
    """``GET /metrics`` on ``host:port`` from a thread of the controller; :meth:`update` swaps
    in the text of a new record (a scrape reads whichever text is current: no lock held while
    rendering, no partial text)."""

    def __init__(self, port: int, host: str = "0.0.0.0", advertise: str = "127.0.0.1") -> None:
        self.text = "# no record yet\n"
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                    self.send_error(404, "only /metrics is served here")
                    return
                body = endpoint.text.encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """Scrapes every 15 s are not worth a log line each."""

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://{advertise}:{self.port}/metrics"
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="metrics-endpoint", daemon=True
        )
        self.thread.start()
        logger.info("Prometheus metrics at %s", self.url)

    def update(self, record, workers, run: str, running: bool = True) -> None:
        self.text = render(record, workers, run, running)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def open_endpoint(asked: int | None, host: str, advertise: str) -> MetricsEndpoint | None:
    """The endpoint on the port asked for (or ``TROUPE_METRICS_PORT``'s), or None."""
    port = port_from_environment(asked)
    if port is None:
        return None
    try:
        return MetricsEndpoint(port, host=host, advertise=advertise)
    except OSError as e:
        raise _cannot_serve(port, e) from e


def refuse_taken(asked: int | None) -> None:
    """Refuse a port another process of this machine listens on, before the run folder is
    made: a run whose controller found it taken left a folder neither usable again ("not
    empty") nor resumable (no config.json). A port taken after this check still fails the
    run, as before."""
    port = port_from_environment(asked)
    if not port:  # none, or 0: any free one
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as e:
            raise _cannot_serve(port, e) from e


def _cannot_serve(port: int, error: OSError) -> UserError:
    return UserError(
        f"cannot serve metrics on port {port}: {error.strerror or error}; pick another "
        f"--metrics-port (0: any free port) or unset {ENV_PORT}"
    )


def run_name_of(run_dir: Path) -> str:
    """The ``run`` label: the launch record's name (a container mounts the run folder at a
    path of its own), else ``TROUPE_RUN_NAME``, else the folder's name."""
    try:
        name = json.loads((Path(run_dir) / run_folder.LAUNCH).read_text()).get("run")
    except (OSError, ValueError, AttributeError):
        name = None
    return str(name or os.environ.get("TROUPE_RUN_NAME") or Path(run_dir).resolve().name)


def port_from_environment(asked: int | None) -> int | None:
    """``asked`` if given, else ``TROUPE_METRICS_PORT`` (None: no endpoint)."""
    if asked is not None:
        return port_number(asked, "--metrics-port")
    raw = os.environ.get(ENV_PORT, "").strip()
    return port_number(raw, ENV_PORT) if raw else None


def metrics_port(text: str) -> int:
    """``--metrics-port``'s argparse type: a bad port is refused before anything starts."""
    try:
        return port_number(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--metrics-port ")) from None


def port_number(value: object, what: str = "--metrics-port", *, text: bool = True) -> int:
    """``value`` as a TCP port (0: any free one), else a UserError naming ``what``: a port out
    of range reached the controller's ``bind`` as a traceback, after the run folder was made.
    ``value``: a whole number, or (where ``text``: a command line's, an environment variable's)
    its digits."""
    number = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif text and isinstance(value, str) and value.strip().isdigit():
        number = int(value)
    if number is None or not 0 <= number <= 65535:
        raise UserError(f"{what} {value!r}: a port number from 0 to 65535 (0: any free port)")
    return number
