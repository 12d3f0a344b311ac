"""Issue 28, item 1: trainer-side callbacks. ``on_train_result`` runs in a real trainer worker
after each step, with the batch it trained on and the trainer; what it logs joins the stats
that go to the controller; a hook that raises is named, and bad numbers are refused."""

from __future__ import annotations

import numpy as np
import pytest

from api import registry
from api.config import ComponentConfig, make_experiment
from api.errors import UserError
from api.train_result import TrainResult
from system.errors import CallbackError
from system.parameters.inproc import InprocParameterService
from system.parameters.store import ParameterStore
from system.run import builders
from system.streams.samples import InprocSampleHub
from system.workers.trainer_hooks import TrainerHooks
from system.workers.trainer_worker import TrainerWorker, segment_source


class WeightNorm:
    def __init__(self):
        self.results: list[TrainResult] = []

    def on_train_result(self, result):
        self.results.append(result)
        norm = sum(float(p.detach().norm()) for p in result.trainer.policy.parameters())
        result.log("weight_norm", norm)
        result.log("batch_reward", result.batch.reward.sum())


class Failing:
    def on_train_result(self, result):
        raise RuntimeError("boom")


@pytest.fixture
def registered():
    registry.register_callback("weight-norm-t28", WeightNorm, override=True)
    registry.register_callback("failing-t28", Failing, override=True)
    yield
    registry.callbacks.unregister("weight-norm-t28")
    registry.callbacks.unregister("failing-t28")


def trainer_worker(callback: str):
    config = make_experiment("cartpole-ppo", ["policies.default.batch_segments=2"])
    spaces = builders.probe_spaces(config)
    policy = builders.make_policy(config, "default", spaces, 0)
    hub = InprocSampleHub()
    trainer = builders.make_trainer(config, "default", policy)
    worker = TrainerWorker(
        "trainer/default/0",
        "default",
        trainer,
        segment_source(hub.consumer("default"), "default", trainer, 2),
        InprocParameterService(ParameterStore()),
        hooks=TrainerHooks([ComponentConfig(callback)]),
    )
    return worker, hub


def segments(count: int, steps: int = 9):
    """Segments as an actor of CartPole records them (random data, the real layout)."""
    from algorithm.actor_critic_policies.network import ActorCriticOutput
    from api.policy import SampleBatch

    rng = np.random.default_rng(0)
    lead = (steps, count)
    return SampleBatch(
        obs=rng.normal(size=(*lead, 4)).astype(np.float32),
        action=rng.integers(0, 2, lead),
        policy_output=ActorCriticOutput(
            log_prob=np.full((*lead, 1), -0.69, np.float32), value=np.zeros((*lead, 1), np.float32)
        ),
        reward=np.ones((*lead, 1), np.float32),
        done=np.zeros((*lead, 1), bool),
        truncated=np.zeros((*lead, 1), bool),
        on_reset=np.zeros((*lead, 1), bool),
        policy_version=np.zeros((*lead, 1), np.int64),
    )


def test_on_train_result_sees_the_step_and_logs_into_the_stats(registered):
    worker, hub = trainer_worker("weight-norm-t28")
    hub.queues["default"].append(segments(2))
    while worker.steps < 1:
        worker.poll()
    hook = worker.hooks.objects[0][1]
    (result,) = hook.results
    assert (result.policy, result.worker, result.steps, result.version) == (
        "default", "trainer/default/0", 1, 1,
    )  # fmt: skip
    assert "approx_kl" in result.stats and result.batch.reward.shape == (9, 2, 1)
    assert worker.stats["custom/batch_reward"] == 18.0
    assert worker.stats["custom/weight_norm"] > 0
    worker.close()


def test_a_hook_that_raises_is_named(registered):
    worker, hub = trainer_worker("failing-t28")
    hub.queues["default"].append(segments(2))
    with pytest.raises(CallbackError, match="trainer callback 'failing-t28' raised"):
        while worker.steps < 1:
            worker.poll()
    worker.close()


def test_log_takes_finite_numbers_under_plain_names():
    result = TrainResult("p", "trainer/p/0", 1, 1, {}, batch=None, trainer=None)
    for name, value in (("a/b", 1.0), ("", 1.0), ("x", float("inf"))):
        with pytest.raises(UserError):
            result.log(name, value)
