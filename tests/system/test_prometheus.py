"""The controller's Prometheus endpoint: what it serves parses with Prometheus's own parser,
holds the per-role series, and covers every series the Grafana dashboard plots."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from e2e_support import ROOT, TROUPE, finish, frames, read_json, start, wait_for
from prometheus_client.parser import text_string_to_metric_families

from api.errors import UserError
from system.run import prometheus

DASHBOARD = ROOT / "docker" / "monitoring" / "grafana-dashboard.json"

RECORD = {
    "wall_s": 12.5,
    "env_frames": 40000,
    "fps": 3200.5,
    "fps_recent": 3400.0,
    "episode_return": 120.0,
    "eval_return": float("nan"),
    "policy/default/version": 17.0,
    "policy/default/episode_return": 120.0,
    "trainer/default/policy_lag_mean": 2.5,
    "trainer/default/approx_kl": 0.01,
    "timing/actor/env_step": 0.6,
    "timing/actor/wait_actions": 0.4,
    "timing/actor/busy": 0.6,
    "timing/trainer.loader/receive": 0.3,
    "timing/policy/batch_rows_p90": 48,
    "custom/shaping/mean": 0.5,
    "policy/main/custom/bonus": 0.25,
    "worker_health/restarts": 1,
    "game_return": None,
}
WORKERS = {
    "actor/0": {"role": "actor", "state": "alive", "restarts": 1, "peak_rss_mb": 100.0},
    'odd"name\\': {"role": "trainer", "state": "failed", "restarts": 0, "peak_rss_mb": None},
}


def families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_a_record_renders_as_text_prometheus_parses():
    text = prometheus.render(RECORD, WORKERS, run="r1", running=True)
    parsed = families(text)
    assert parsed["troupe_env_frames"][0].value == 40000  # a counter: the parser drops _total
    assert parsed["troupe_env_frames"][0].labels == {"run": "r1"}
    assert parsed["troupe_run_running"][0].value == 1
    lag = parsed["troupe_trainer_policy_lag_mean"][0]
    assert lag.labels == {"run": "r1", "policy": "default"} and lag.value == 2.5
    shares = {(s.labels["role"], s.labels["stage"]): s.value for s in parsed["troupe_stage_share"]}
    assert shares == {("actor", "env_step"): 0.6, ("actor", "wait_actions"): 0.4,
                      ("trainer.loader", "receive"): 0.3}  # fmt: skip
    assert parsed["troupe_role_busy"][0].labels["role"] == "actor"
    assert parsed["troupe_policy_batch_rows"][0].labels["stat"] == "p90"
    custom = {tuple(sorted(c.labels.items())): c.value for c in parsed["troupe_custom"]}
    assert custom == {
        (("name", "shaping/mean"), ("run", "r1")): 0.5,
        (("name", "bonus"), ("policy", "main"), ("run", "r1")): 0.25,
    }
    assert parsed["troupe_metric"][0].labels["key"] == "worker_health/restarts"
    assert str(parsed["troupe_eval_return"][0].value) == "nan"
    up = {s.labels["worker"]: s.value for s in parsed["troupe_worker_up"]}
    assert up == {"actor/0": 1, 'odd"name\\': 0}  # label values escaped and read back whole
    memory = parsed["troupe_worker_peak_rss_bytes"]
    assert [s.value for s in memory] == [100 * 2**20]  # no figure, no sample
    assert "game_return" not in text  # not a number: left out


def test_the_endpoint_serves_the_latest_record_over_http():
    endpoint = prometheus.MetricsEndpoint(0, host="127.0.0.1")
    try:
        endpoint.update(RECORD, WORKERS, "r1")
        with urllib.request.urlopen(endpoint.url, timeout=10) as answer:
            assert answer.headers["Content-Type"] == prometheus.CONTENT_TYPE
            body = answer.read().decode()
        assert "troupe_frames_per_second" in families(body)
        endpoint.update({**RECORD, "fps": 8.0, "fps_recent": 10.0}, WORKERS, "r1", running=False)
        with urllib.request.urlopen(endpoint.url, timeout=10) as answer:
            parsed = families(answer.read().decode())
        assert parsed["troupe_frames_per_second"][0].value == 10.0  # the recent rate
        assert parsed["troupe_frames_per_second_mean"][0].value == 8.0
        assert parsed["troupe_run_running"][0].value == 0
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(endpoint.url.replace("/metrics", "/admin"), timeout=10)
        assert e.value.code == 404
    finally:
        endpoint.close()


def test_a_port_in_use_is_one_line_naming_it(monkeypatch):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        with pytest.raises(UserError, match=f"cannot serve metrics on port {port}"):
            prometheus.open_endpoint(port, "127.0.0.1", "127.0.0.1")
    finally:
        taken.close()
    monkeypatch.setenv(prometheus.ENV_PORT, "lots")
    with pytest.raises(UserError, match="TROUPE_METRICS_PORT 'lots': a port number"):
        prometheus.open_endpoint(None, "127.0.0.1", "127.0.0.1")
    monkeypatch.delenv(prometheus.ENV_PORT)
    assert prometheus.open_endpoint(None, "127.0.0.1", "127.0.0.1") is None  # off by default


def dashboard_series() -> set[str]:
    """Every series name a panel's query of the Grafana dashboard reads."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs.append(dashboard["templating"]["list"][1]["query"]["query"])
    return {name for e in exprs for name in re.findall(r"\btroupe_[a-z_]+", e)}


def test_a_real_run_serves_every_series_the_dashboard_plots(tmp_path):
    run_dir = tmp_path / "metrics-run"
    proc = start(["run", "cartpole-ppo", "stop.eval_return=None", "stop.env_frames=100000000",
                  "--run-dir", str(run_dir), "--no-display", "--metrics-port", "0"])  # fmt: skip
    try:
        wait_for(lambda: frames(run_dir) > 3000, proc, what="3000 frames")
        url = read_json(run_dir / "endpoints.json")["metrics"]

        def scrape() -> str:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return answer.read().decode()

        # every role reports its stages within a few heartbeats, the first greedy evaluation
        # (troupe_eval_return) ends within seconds
        roles = {"actor", "policy", "trainer", "parameter_service"}
        deadline = time.monotonic() + 120
        while True:
            text = scrape()
            served = prometheus.series_names(text)
            complete = roles <= _stage_roles(text) and dashboard_series() <= served
            if complete or time.monotonic() > deadline or proc.poll() is not None:
                break
            time.sleep(0.5)
    finally:
        subprocess.run([*TROUPE, "stop", str(run_dir)], cwd=ROOT, capture_output=True,
                       timeout=120)  # fmt: skip
        finish(proc, timeout=90)
    assert roles <= _stage_roles(text), text
    missing = dashboard_series() - served
    assert not missing, f"the dashboard plots series /metrics does not serve: {sorted(missing)}"
    parsed = families(text)
    assert parsed["troupe_run_running"][0].labels["run"] == "metrics-run"
    restarts = {s.labels["worker"] for s in parsed["troupe_worker_restarts"]}
    assert {"actor/0", "actor/1", "trainer/default/0", "policy/default/0", "params"} <= restarts


def _stage_roles(text: str) -> set[str]:
    return {m for m in re.findall(r'troupe_stage_share\{run="[^"]*",role="([^"]+)"', text)}


def test_the_dashboard_is_valid_grafana_json():
    dashboard = json.loads(Path(DASHBOARD).read_text())
    assert dashboard["panels"] and all(p["targets"] for p in dashboard["panels"])
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
