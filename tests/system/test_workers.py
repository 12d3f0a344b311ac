"""Each worker against stub peers: in-process streams where the test plays the other side."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

from api.config import make_experiment
from api.environment import Environment, StepResult
from api.errors import ConfigError, PipelineCheckError, UserError
from api.namedarray import NamedArray
from api.policy import Policy, RolloutRequest, RolloutResult, SampleBatch
from api.trainer import Trainer, TrainerStepResult
from system.errors import (
    EnvironmentFailure,
    NonFiniteLossError,
    TrainerContractError,
    VersionError,
    WireError,
)
from system.parameters.inproc import InprocParameterService
from system.parameters.store import ParameterStore
from system.roles import Role
from system.run.plan import PLAN_TYPES
from system.streams.inference import InferenceReply, InprocInferenceHub
from system.streams.samples import InprocSampleHub
from system.workers import actor_worker
from system.workers.actor_worker import ActorWorker
from system.workers.batch_source import ReplaySource
from system.workers.parameter_worker import ParameterServiceWorker
from system.workers.policy_worker import PolicyWorker
from system.workers.replay_worker import ReplayWorker
from system.workers.trainer_worker import TrainerWorker, segment_source


class CountingEnv(Environment):
    """One agent; obs is the step count; the episode terminates after ``length`` steps."""

    def __init__(self, length: int = 3, fail_at: int | None = None):
        self.length, self.fail_at, self.t = length, fail_at, 0

    agent_count = 1
    observation_spaces = [gym.spaces.Box(0, 100, (1,), np.float32)]
    action_spaces = [gym.spaces.Discrete(2)]

    def reset(self):
        self.t = 0
        return [StepResult(np.array([0.0], np.float32))]

    def step(self, actions):
        self.t += 1
        if self.fail_at is not None and self.t == self.fail_at:
            raise RuntimeError("boom")
        obs = np.array([float(self.t)], np.float32)
        return [StepResult(obs, reward=1.0, done=self.t >= self.length)]


def answer_all(hub: InprocInferenceHub, policy: str, version: int = 7, action=None) -> int:
    """Play the policy worker: answer every pending request with action 1."""
    server, answered = hub.server(policy), 0
    for pending in server.gather(10_000, 0):
        n = pending.rows
        act = np.ones(n, np.int64) if action is None else action(n)
        out = NamedArray(log_prob=np.zeros((n, 1), np.float32), value=np.zeros((n, 1), np.float32))
        server.reply(pending, RolloutResult(action=act, policy_output=out), version)
        answered += 1
    return answered


def eval_actor(hub: InprocInferenceHub, name: str, make_env, n_envs: int, **kwargs):
    """An evaluation actor (nothing recorded) answered by the test through ``hub``."""
    return ActorWorker(
        name,
        make_env,
        n_envs,
        lambda a: "p",
        hub.client(name),
        None,
        is_evaluation=True,
        **kwargs,
    )


def test_an_actor_reports_the_emulator_frames_a_step_covers_and_refuses_a_bad_count():
    class Skipping(CountingEnv):
        frames_per_step = 3

    class Broken(CountingEnv):
        frames_per_step = 2.5

    class SetInInit(CountingEnv):
        def __init__(self):
            super().__init__()
            self.frames_per_step = 5

    hub = InprocInferenceHub()
    actor = eval_actor(hub, "a", lambda i: Skipping(), 2)
    for _ in range(4):
        actor.poll()
        answer_all(hub, "p")
    stats = actor.collect_stats()
    assert stats["frames_per_step"] == 3 and stats["eval_env_frames"] > 0
    assert "frames_per_step" not in eval_actor(hub, "b", lambda i: CountingEnv(), 1).collect_stats()
    assert eval_actor(hub, "d", lambda i: SetInInit(), 1).frames_per_step == 5
    with pytest.raises(ValueError, match=r"environment 'Broken': frames_per_step must be a whole "
                                         r"number of 1 or more, got 2\.5"):  # fmt: skip
        eval_actor(hub, "c", lambda i: Broken(), 1)


def test_actor_builds_overlapping_segments_with_bootstrap_step():
    hub, samples = InprocInferenceHub(), InprocSampleHub()
    actor = ActorWorker(
        "a",
        lambda i: CountingEnv(length=3),
        1,
        lambda a: "p",
        hub.client("a"),
        samples.producer(),
        segment_length=4,
        groups=1,
    )
    for _ in range(12):
        actor.poll()
        answer_all(hub, "p")
    segments = [chunk[:, 0] for chunk in samples.queues["p"]]
    assert len(segments) >= 2
    first, second = segments[0], segments[1]
    assert first.obs.shape == (5, 1)  # segment_length + 1
    # obs 0,1,2,3(done) then the reset obs 0: the final obs is sent to the policy too
    assert first.obs[:, 0].tolist() == [0, 1, 2, 3, 0]
    assert first.done[:, 0].tolist() == [False, False, False, True, False]
    assert first.on_reset[:, 0].tolist() == [True, False, False, False, True]
    assert first.reward[:, 0].tolist() == [0, 1, 1, 1, 0]
    assert (first.policy_version == 7).all()
    # the last step of a segment is the first of the next
    np.testing.assert_array_equal(second.obs[0], first.obs[-1])
    stats = actor.collect_stats()
    assert stats["episodes"][0]["episode_return"] == 3.0


def test_actor_ignores_stale_replies_and_reposts_unanswered_requests():
    hub = InprocInferenceHub()
    actor = eval_actor(hub, "a", lambda i: CountingEnv(), 2, groups=2)
    actor.poll()
    assert actor.stalled_policies(timeout_s=-1) == {"p"}
    hub.requests["p"].clear()  # the policy worker died with the requests
    actor.repost({"p"})
    assert len(hub.requests["p"]) == 2
    stale = InferenceReply("p", 0, 99, RolloutResult(action=np.ones(1, np.int64)), 1)
    hub.replies["a"].append(stale)
    assert actor.poll() == 0  # a reply to an old sequence number is not used


def test_a_request_is_stalled_only_after_the_actor_looked_for_its_answer_that_long(monkeypatch):
    """An actor held back (the trainers' back-pressure during a long step) does not read its
    answers: a request that waited unread in its socket is not a policy worker's failure."""
    clock = [100.0]
    fake = SimpleNamespace(monotonic=lambda: clock[0], time=time.time, sleep=time.sleep)
    monkeypatch.setattr(actor_worker, "time", fake)
    hub = InprocInferenceHub()
    actor = eval_actor(hub, "a", lambda i: CountingEnv(), 2, groups=1)
    actor.poll()  # posts the request and looks for its answer at once
    clock[0] += 30.0  # held back all this time: no poll, no look
    assert actor.stalled_policies(timeout_s=5.0) == set()
    actor.poll()  # looks, and no answer has come in 30 s
    assert actor.stalled_policies(timeout_s=5.0) == {"p"}
    answer_all(hub, "p")
    clock[0] += 1.0
    assert actor.poll() == 2  # answered: stepped, and asked again
    assert actor.stalled_policies(timeout_s=5.0) == set()


def test_actor_reports_env_failure_with_its_name_or_resets_when_configured():
    hub = InprocInferenceHub()
    actor = eval_actor(hub, "a", lambda i: CountingEnv(fail_at=1), 1, groups=1)
    actor.poll()
    answer_all(hub, "p")
    with pytest.raises(EnvironmentFailure, match=r"environment 0 of a raised in step\(\)") as e:
        actor.poll()
    assert str(e.value).endswith("; actors.on_env_error=reset rebuilds such an environment and "
                                 "goes on")  # fmt: skip

    resetting = eval_actor(
        hub, "b", lambda i: CountingEnv(fail_at=1), 1, groups=1, on_env_error="reset"
    )
    resetting.poll()
    answer_all(hub, "p")
    resetting.poll()
    assert resetting.collect_stats()["env_errors"] == 1


class MalformedEnv(CountingEnv):
    """``returns`` what ``step`` gives from the second step on: ``bare`` (a StepResult, not a
    list), ``short`` (one result for two agents) or ``vector`` (a reward of three numbers); or
    its ``reset`` raises (``reset_fails``)."""

    def __init__(self, returns: str = "bare", reset_fails: bool = False):
        super().__init__(length=10)
        self.returns, self.reset_fails = returns, reset_fails
        self.agent_count = 2 if returns == "short" else 1
        self.observation_spaces = CountingEnv.observation_spaces * self.agent_count
        self.action_spaces = CountingEnv.action_spaces * self.agent_count

    def reset(self):
        if self.reset_fails:
            raise RuntimeError("no reset today")
        return super().reset() * self.agent_count

    def step(self, actions):
        (result,) = super().step(actions[:1])
        if self.t < 2:
            return [result] * self.agent_count
        if self.returns == "vector":
            result.reward = np.array([result.reward, 1.0, 2.0])
        return result if self.returns == "bare" else [result]


LIST = "; it returns a list of one StepResult (or None) per agent"


@pytest.mark.parametrize(
    "returns, said",
    [
        ("bare", "a StepResult" + LIST),
        ("short", "1 result for 2 agents" + LIST),
        ("vector", "a result for agent 0 whose reward must be one number (a Python or numpy "
         "scalar, or an array of shape () or (1,)), got an array of shape (3,) and dtype "
         "float64; make a vector reward one number in the environment (a weighted sum)"),
    ],
)  # fmt: skip
def test_an_environment_that_returns_no_list_of_one_result_per_agent_is_named(returns, said):
    """A short list used to leave the missing agents' last results in place: acted on, and
    their rewards recorded, again, with no error; a bare StepResult was a TypeError; a vector
    reward was cut to its first number, and trained on."""
    hub = InprocInferenceHub()
    actor = eval_actor(hub, "a", lambda i: MalformedEnv(returns), 1, groups=1,
                       env_name="Malformed-v0")  # fmt: skip
    with pytest.raises(EnvironmentFailure) as caught:
        for _ in range(4):
            actor.poll()
            answer_all(hub, "p")
    assert str(caught.value) == (f"environment 'Malformed-v0' #0 of a: step() returned {said}")


def test_on_env_error_reset_gives_up_on_an_environment_that_fails_again_once_rebuilt():
    """Its reset raises every time: rebuilding it once more would recurse for ever."""
    hub = InprocInferenceHub()
    actor = eval_actor(
        hub, "a", lambda i: MalformedEnv(reset_fails=True), 1, groups=1, on_env_error="reset"
    )
    with pytest.raises(EnvironmentFailure, match=r"raised in reset\(\): RuntimeError\('no reset "
                       r"today'\), right after it was rebuilt"):  # fmt: skip
        actor.poll()


def test_actor_validates_actions_against_the_action_space():
    hub = InprocInferenceHub()
    actor = eval_actor(hub, "a", lambda i: CountingEnv(), 1, groups=1, validate_actions=True)
    actor.poll()
    answer_all(hub, "p", action=lambda n: np.full(n, 5, np.int64))
    with pytest.raises(PipelineCheckError, match="not in its action space Discrete"):
        actor.poll()


class EchoPolicy(Policy):
    """Memory counts the steps; action = obs > 0; version set by load_checkpoint."""

    def __init__(self):
        self._version = 0
        self.loads = 0

    @property
    def default_policy_state(self):
        return NamedArray(count=np.zeros((1, 1), np.float32))

    @property
    def version(self):
        return self._version

    def rollout(self, request: RolloutRequest, **kwargs) -> RolloutResult:
        count = np.where(request.on_reset, 0.0, request.policy_state.count) + 1
        return RolloutResult(
            action=(request.obs[:, 0] > 0).astype(np.int64),
            policy_state=NamedArray(count=count.astype(np.float32)),
        )

    def analyze(self, sample, target="", **kwargs):
        raise NotImplementedError

    def get_checkpoint(self):
        return {"version": self._version}

    def load_checkpoint(self, checkpoint):
        self._version = int(checkpoint["version"])
        self.loads += 1


def request(rows: int, state: bool) -> RolloutRequest:
    return RolloutRequest(
        obs=np.arange(rows, dtype=np.float32).reshape(rows, 1),
        policy_state=NamedArray(count=np.full((rows, 1), 5, np.float32)) if state else None,
        is_evaluation=np.zeros((rows, 1), bool),
        on_reset=np.zeros((rows, 1), bool),
        client_id=np.zeros((rows, 1), np.int64),
        request_id=np.zeros((rows, 1), np.int64),
    )


def test_policy_worker_batches_requests_splits_replies_and_fills_missing_state():
    hub, store = InprocInferenceHub(), ParameterStore()
    policy = EchoPolicy()
    worker = PolicyWorker("w", "p", policy, hub.server("p"), InprocParameterService(store))
    hub.client("a").post("p", 0, 1, request(3, state=True))
    hub.client("b").post("p", 0, 1, request(2, state=False))
    assert worker.poll() == 5
    a, b = hub.replies["a"][0], hub.replies["b"][0]
    assert a.result.action.tolist() == [0, 1, 1] and b.result.action.tolist() == [0, 1]
    assert a.result.policy_state.count[:, 0].tolist() == [6, 6, 6]
    assert b.result.policy_state.count[:, 0].tolist() == [1, 1]  # default state filled in
    assert worker.collect_stats()["batches"] == 1


def test_policy_worker_takes_new_versions_and_never_reloads_an_unchanged_one():
    hub, store = InprocInferenceHub(), ParameterStore()
    policy = EchoPolicy()
    worker = PolicyWorker("w", "p", policy, hub.server("p"), InprocParameterService(store))
    store.publish("p", 3, {"version": 3})
    worker.poll()
    worker.poll()
    assert policy.version == 3 and policy.loads == 1
    hub.client("a").post("p", 0, 1, request(1, state=True))
    worker.poll()
    assert hub.replies["a"][0].version == 3


class ShortPolicy(EchoPolicy):
    """A policy of one's own with a bug: the last row of every answer is lost."""

    def rollout(self, request: RolloutRequest, **kwargs) -> RolloutResult:
        return super().rollout(request)[:-1]


def test_a_policy_that_answers_fewer_rows_than_it_was_asked_is_named():
    """Before, the answer went to the actors, and the one whose rows were short failed with a
    numpy broadcasting error while recording it."""
    hub = InprocInferenceHub()
    worker = PolicyWorker("w", "p", ShortPolicy(), hub.server("p"), None)
    hub.client("a").post("p", 0, 1, request(3, state=True))
    hub.client("b").post("p", 0, 1, request(2, state=True))
    with pytest.raises(UserError, match=r"^policy 'p' \(ShortPolicy\)\.rollout answered a batch "
                       r"of 5 observations with 4 actions: a RolloutResult holds one row per "
                       r"observation"):  # fmt: skip
        worker.poll()
    assert not hub.replies.get("a") and not hub.replies.get("b")  # nothing wrong went out


class StubTrainer(Trainer):
    def __init__(self, policy, loss=0.5):
        self._policy, self.loss, self.seen = policy, loss, []

    @property
    def policy(self):
        return self._policy

    def step(self, samples: SampleBatch) -> TrainerStepResult:
        self.seen.append(samples.reward.shape)
        self._policy._version += 1
        return TrainerStepResult({"loss": self.loss}, len(self.seen))


def segment(version: int = 0, segments: int = 1, t: int = 5) -> SampleBatch:
    """``segments`` segments of ``t`` steps, as an actor sends them: ``[T, k, ...]``."""
    flags = np.zeros((t, segments, 1), bool)
    return SampleBatch(
        obs=np.zeros((t, segments, 1), np.float32),
        action=np.zeros((t, segments), np.int64),
        reward=np.zeros((t, segments, 1), np.float32),
        done=flags,
        truncated=flags,
        on_reset=flags,
        policy_version=np.full((t, segments, 1), version, np.int64),
    )


def test_trainer_worker_waits_for_a_full_batch_then_steps_and_publishes():
    samples, store = InprocSampleHub(), ParameterStore()
    trainer = StubTrainer(EchoPolicy())
    source = segment_source(samples.consumer("p"), "p", trainer, 3)
    worker = TrainerWorker("t", "p", trainer, source, InprocParameterService(store))
    producer = samples.producer()
    producer.post("p", segment())
    producer.post("p", segment())
    assert worker.poll() == 0 and store.latest_version("p") == 0  # initial weights published
    producer.post("p", segment(segments=2))  # one message may carry several segments
    assert worker.poll() == 1
    assert trainer.seen == [(5, 3, 1)]
    assert source.pending_segments == 1  # the extra segment waits for the next batch
    assert store.latest_version("p") == 1
    assert worker.collect_stats()["version_lag"] == 0.0


def test_trainer_worker_reports_the_version_it_holds_before_its_first_step():
    """A resumed run's panel showed ``v0`` until the trainer's first step: its heartbeats said
    no version, though it had published the one it resumed at."""
    samples, store = InprocSampleHub(), ParameterStore()
    trainer = StubTrainer(EchoPolicy())
    trainer.policy._version = 7  # as restored from the run's checkpoint
    source = segment_source(samples.consumer("p"), "p", trainer, 3)
    worker = TrainerWorker("t", "p", trainer, source, InprocParameterService(store))
    assert "version" not in worker.collect_stats()  # not yet published: no version to name
    assert worker.poll() == 0 and store.latest_version("p") == 7
    assert worker.collect_stats()["version"] == 7
    assert worker.collect_stats()["version"] == 7  # every heartbeat, not once


def test_trainer_worker_drops_segments_older_than_max_policy_lag(caplog):
    samples, store = InprocSampleHub(), ParameterStore()
    trainer = StubTrainer(EchoPolicy())
    trainer.policy._version = 5
    source = segment_source(samples.consumer("p"), "p", trainer, 2, max_policy_lag=2)
    worker = TrainerWorker("t", "p", trainer, source, InprocParameterService(store))
    producer = samples.producer()
    mixed = segment(version=4, segments=3)
    mixed.policy_version[:2, 1] = 2  # the oldest step decides: 3 versions behind
    producer.post("p", segment(version=1))  # 4 behind: dropped whole
    producer.post("p", mixed)  # columns 0 and 2 kept
    with caplog.at_level("WARNING"):
        assert worker.poll() == 1
    assert trainer.seen == [(5, 2, 1)]
    stats = worker.collect_stats()
    assert stats["stale_segments_dropped"] == 2 and stats["version_lag"] == 1.0
    (warning,) = [r.getMessage() for r in caplog.records if "max_policy_lag" in r.getMessage()]
    assert warning.startswith(
        "trainer of policy 'p' dropped 1 segment(s) more than max_policy_lag=2 versions old (1 "
        "so far): the trainer cannot keep up with the actors; use fewer actors"
    )  # rate-limited: the second drop, right after, is counted but not repeated


def test_max_policy_lag_must_be_positive():
    with pytest.raises(ConfigError, match=r"policies\.default\.max_policy_lag: must be at least 1"):
        make_experiment("cartpole-ppo", ["policies.default.max_policy_lag=0"])


def test_trainer_worker_warns_when_it_trains_on_old_samples_and_keeps_them(caplog):
    samples, store = InprocSampleHub(), ParameterStore()
    trainer = StubTrainer(EchoPolicy())
    trainer.policy._version = 20
    source = segment_source(samples.consumer("p"), "p", trainer, 1, warn_policy_lag=16)
    worker = TrainerWorker("t", "p", trainer, source, InprocParameterService(store))
    producer = samples.producer()
    for version in (4, 2, 1):  # 16 versions behind (not warned), then 19 and 21
        producer.post("p", segment(version=version))
    with caplog.at_level("WARNING"):
        assert [worker.poll() for _ in range(3)] == [1, 1, 1]
    assert len(trainer.seen) == 3  # nothing dropped: a warning, not a cap
    stats = worker.collect_stats()
    assert stats["version_lag"] == 21.0 and "stale_segments_dropped" not in stats
    (warning,) = [r.getMessage() for r in caplog.records if "warn_policy_lag" in r.getMessage()]
    assert warning == (
        "trainer of policy 'p' trains on samples up to 19 versions old "
        "(policies.p.warn_policy_lag=16): the trainer cannot keep up with the actors, whose "
        "samples wait for it; use fewer actors (actors.workers, actors.envs_per_worker), more "
        "trainer workers (policies.p.trainer_workers) or a larger policies.p.batch_segments, a "
        "trainer that corrects for lag (impala, or ppo with vtrace=True), or drop older samples "
        "with policies.p.max_policy_lag"
    )  # rate-limited: the batch 21 versions old, right after, is not warned again


def test_the_policy_lag_warning_is_on_by_default_and_off_for_replay_trainers(caplog):
    config = make_experiment("cartpole-ppo", [])
    assert config.policies["default"].warn_policy_lag == 16
    assert config.policies["default"].max_policy_lag is None  # warned, never dropped
    params = InprocParameterService(ParameterStore())
    worker = TrainerWorker("t", "p", StubTrainer(EchoPolicy()), ReplaySource(object()), params)
    old = SimpleNamespace(policy_version=np.zeros((4, 1), np.int64))
    with caplog.at_level(logging.WARNING):
        # a replay buffer's samples are old by design: their age is a stat, never a warning
        assert worker.source.age(100, old) == {"sample_age_versions": 100.0}
    assert caplog.records == []
    with pytest.raises(ConfigError, match=r"warn_policy_lag: must be at least 1, or None for no"):
        make_experiment("cartpole-ppo", ["policies.default.warn_policy_lag=0"])


def test_trainer_worker_refuses_to_publish_non_finite_losses():
    samples, store = InprocSampleHub(), ParameterStore()
    trainer = StubTrainer(EchoPolicy(), loss=float("nan"))
    source = segment_source(samples.consumer("p"), "p", trainer, 1)
    worker = TrainerWorker("t", "p", trainer, source, InprocParameterService(store))
    samples.producer().post("p", segment())
    with pytest.raises(NonFiniteLossError, match=r"non-finite \['loss'\]"):
        worker.poll()
    assert store.latest_version("p") == 0


class ContractTrainer(StubTrainer):
    """Reports ``extra`` among its stats; ``bumps``: whether its step moves the version."""

    def __init__(self, policy, extra, bumps=True):
        super().__init__(policy)
        self.extra, self.bumps = extra, bumps

    def step(self, samples):
        result = super().step(samples)
        self._policy._version -= 0 if self.bumps else 1
        result.stats.update(self.extra)
        return result


@pytest.mark.parametrize(
    "extra, bumps, said",
    [
        ({"hist": torch.zeros(3)}, True, r"stat 'hist' is Tensor of shape \(3,\); a stat is one"),
        ({"hist": np.zeros((2, 2))}, True, r"stat 'hist' is ndarray of shape \(2, 2\)"),
        ({"note": "ok"}, True, r"stat 'note' is str; a stat is one number"),
        ({}, False, r"step 1 left the policy at version 0; .* calls self.policy.inc_version\(\)"),
    ],
)
def test_a_trainer_that_breaks_the_contract_is_named_and_not_restarted(extra, bumps, said):
    """A stat of three values raised torch's "only one element tensors can be converted"
    naming no stat, and a step without inc_version() a VersionError from the parameter
    service; both were restarted five times. A user error: one message, no restart."""
    samples, store = InprocSampleHub(), ParameterStore()
    trainer = ContractTrainer(EchoPolicy(), extra, bumps)
    source = segment_source(samples.consumer("p"), "p", trainer, 1)
    worker = TrainerWorker("t", "p", trainer, source, InprocParameterService(store))
    samples.producer().post("p", segment())
    with pytest.raises(TrainerContractError, match=said):
        worker.poll()
    assert issubclass(TrainerContractError, UserError)  # fatal in worker_process: no restart


def test_a_stat_of_one_value_in_a_tensor_or_array_is_its_number():
    """A 0-d tensor stat went missing from metrics.jsonl without a word."""
    samples, store = InprocSampleHub(), ParameterStore()
    extra = {"t0": torch.ones(()) * 2, "a1": np.ones(1), "i": np.int64(3)}
    trainer = ContractTrainer(EchoPolicy(), extra)
    source = segment_source(samples.consumer("p"), "p", trainer, 1)
    worker = TrainerWorker("t", "p", trainer, source, InprocParameterService(store))
    samples.producer().post("p", segment())
    assert worker.poll() == 1
    stats = worker.collect_stats()
    assert (stats["t0"], stats["a1"], stats["i"]) == (2.0, 1.0, 3)
    assert all(type(stats[k]) in (int, float) for k in ("t0", "a1", "i"))


def test_each_worker_class_plays_the_role_of_its_plan():
    workers = {
        Role.PARAMETER_SERVICE: ParameterServiceWorker,
        Role.TRAINER: TrainerWorker,
        Role.POLICY: PolicyWorker,
        Role.ACTOR: ActorWorker,
        Role.REPLAY: ReplayWorker,
    }
    assert {role.value for role in workers} == {r.value for r in Role} <= set(PLAN_TYPES)
    assert all(PLAN_TYPES[role.value].role is role for role in workers)
    assert {role: cls.role for role, cls in workers.items()} == {r: r for r in workers}
    assert all(isinstance(cls.role, Role) for cls in workers.values())  # the enum, no literals


class _RefusingLater(InprocParameterService):
    """Stores like the in-process service, but an answer to a version sent without waiting
    comes as a refusal, raised by the next call (as the socket client does)."""

    def __init__(self, store):
        super().__init__(store)
        self.refusal: Exception | None = None

    def publish_nowait(self, policy, version, params, *, timeout_s=5.0):
        self.settle()
        self.refusal = VersionError(f"policy '{policy}' refused version {version}")

    def settle(self):
        refusal, self.refusal = self.refusal, None
        if refusal is not None:
            raise refusal


def test_a_refused_routine_version_does_not_stop_the_final_checkpoint(caplog, tmp_path):
    samples, store = InprocSampleHub(), ParameterStore(tmp_path)
    trainer = StubTrainer(EchoPolicy())
    source = segment_source(samples.consumer("p"), "p", trainer, 1)
    params = _RefusingLater(store)
    worker = TrainerWorker("t", "p", trainer, source, params, checkpoint_every=0, publish_every=1)
    samples.producer().post("p", segment())
    assert worker.poll() == 1  # the initial version waited for; the step's went without waiting
    assert params.refusal is not None and store.latest_version("p") == 0
    with caplog.at_level("WARNING"):
        worker.on_stop()
    assert store.latest_version("p") == 1  # the final version, waited for
    assert store.checkpoint_path("p", 1).is_file()
    assert any("an earlier version was not published" in r.getMessage() for r in caplog.records)


class _RefusingAll(InprocParameterService):
    """Refuses every version as malformed (parameters that do not fit the declared layout)."""

    def publish(self, policy, version, params, **kwargs):
        raise WireError(f"parameters of '{policy}'.model.log_std has shape (2,), declared (1,)")

    def publish_nowait(self, policy, version, params, *, timeout_s=5.0):
        pass  # the refusal would come with the answer, read at the next publish


def test_a_refused_first_version_fails_the_trainer_at_once(tmp_path):
    """The policy workers start from the trainer's first version. Sent without waiting, its
    refusal was read only at the trainer's next publish, which never came (no weights, no
    samples): every policy worker waited for parameters and was restarted, for minutes."""
    samples, store = InprocSampleHub(), ParameterStore(tmp_path)
    trainer = StubTrainer(EchoPolicy())
    source = segment_source(samples.consumer("p"), "p", trainer, 1)
    worker = TrainerWorker("t", "p", trainer, source, _RefusingAll(store))
    with pytest.raises(WireError, match="declared"):
        worker.poll()
