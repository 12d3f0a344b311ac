"""The lag bench's forced lag: the policy worker's parameter client hands out the version ``lag``
behind the newest, and a short serial run of it measures that lag in the trainer's statistics."""

import numpy as np
import pytest

from distributed.bench.lag import LaggedParameters, lagged_run, summarise
from system.parameters.store import ParameterStore


def _publish(store, versions):
    for v in versions:
        store.publish("default", v, {"w": np.full(2, v, dtype=np.float32)})


def test_lagged_client_hands_out_the_version_lag_behind_the_newest():
    store = ParameterStore(keep=5)
    _publish(store, [0])
    client = LaggedParameters(store, lag=2)
    number, params = client.get("default")
    assert number == 0 and params["w"].tolist() == [0.0, 0.0]  # fewer than lag: the first
    assert client.poll_latest("default") is None  # nothing new to hand out
    _publish(store, [1, 2])
    assert client.poll_latest("default") is None  # newest 2, lagged 0: already handed out
    _publish(store, [3])
    number, params = client.poll_latest("default")
    assert number == 1 and params["w"].tolist() == [1.0, 1.0]
    _publish(store, [4, 5])
    assert client.poll_latest("default")[0] == 3
    assert client.get("default", 4)[0] == 4  # an explicit version is served as asked


@pytest.mark.parametrize("lag", [0, 3])
def test_a_short_lagged_run_reports_the_forced_lag(lag):
    run = lagged_run("impala", lag, seed=0, budget_frames=3000)
    assert run.frames >= 3000 and not run.solved
    # serial mode alone lags by under a version on average; the forced lag adds to it
    assert lag <= run.policy_lag_mean + 1.0 < lag + 2.0, run
    (line,) = summarise([run])
    summary = (line["variant"], line["forced_lag"], line["solved"], line["of"])
    assert summary == ("impala", lag, 0, 1)
