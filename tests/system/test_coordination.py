"""Run-wide coordination, piece by piece on a real global state store: the controller's side
(answers to heartbeats and writes, the curriculum driver) and the workers' side (the curriculum
follower on real environments, a PBT member carrying out an order on a real PPO trainer)."""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import pytest

from algorithm.actor_critic_policies.policy import ActorCriticPolicy
from algorithm.ppo.trainer import PPOTrainer
from api.config import make_experiment
from api.config.league import CurriculumConfig
from api.errors import ConfigError
from legacy.environment.staged_cartpole import StagedCartPole
from system.errors import EnvironmentFailure, WireError
from system.parameters.inproc import InprocParameterService
from system.run.control_protocol import StateWrite
from system.run.coordination.coordinator import Coordination, follow_coordination
from system.run.coordination.curriculum import CurriculumDriver, CurriculumFollower
from system.run.coordination.pbt import PBTMember, weights_digest
from system.run.coordination.state import StateStore
from system.run.plan import ActorPlan, PolicyWorkerPlan


def test_the_controller_side_answers_heartbeats_and_writes(tmp_path):
    c = Coordination(make_experiment("cartpole-curriculum"), tmp_path)
    try:
        first = c.snapshot()
        assert first["entries"]["curriculum/stage"][0] == {"index": 0, "stage": 0}
        assert c.changes(None) is None  # a worker that follows no state
        assert c.changes(first["revision"]) is None  # up to date
        reply = c.write(StateWrite(1, "league/x", 5), may_write=True)
        assert reply.ok and reply.version == 1
        assert c.changes(first["revision"])["entries"] == {"league/x": [5, 1]}
        refused = c.write(StateWrite(2, "league/x", 6), may_write=False)
        assert not refused.ok and "only trainers" in str(refused.error)
        bad = c.refuse({"id": 3, "key": ""}, WireError("'state_write' message has no 'value'"))
        assert bad.id == 3 and not bad.ok and c.bad_writes.count == 2
        assert c.on_record({"episode_return": 0.0}) == {"curriculum/stage": 0}
    finally:
        c.close()


def test_the_curriculum_moves_on_only_past_the_threshold_and_enough_episodes():
    state = StateStore()
    config = CurriculumConfig(
        metric="episode_return", thresholds=[50.0, 100.0], stages=["easy", "mid", "hard"],
        min_episodes=10,
    )  # fmt: skip
    driver = CurriculumDriver(config, state)
    driver.on_episodes(5)
    assert driver.on_record({"episode_return": 60.0}) == {"curriculum/stage": 0}  # too few
    driver.on_episodes(5)
    assert driver.on_record({"episode_return": 60.0}) == {"curriculum/stage": 1}
    assert state.get(config.key)[0] == {"index": 1, "stage": "mid"}
    driver.on_episodes(50)
    assert driver.on_record({"episode_return": 90.0}) == {"curriculum/stage": 1}  # below 100
    assert CurriculumDriver(config, state).index == 1  # a resumed run starts where it was


def test_a_watched_metric_in_no_record_is_said_once_with_the_keys_like_it(caplog):
    """``curriculum.metric=episode_retrun`` left a run in stage 0, nothing said."""
    driver = CurriculumDriver(CurriculumConfig(metric="episode_retrun", thresholds=[1.0]),
                              StateStore())  # fmt: skip
    record = {"episode_return": 500.0, "episode_length": 500.0}
    with caplog.at_level("WARNING"):
        driver.on_episodes(99)
        driver.on_record(record)  # a key of episodes' info may come with a later episode
        assert not caplog.records
        driver.on_episodes(1)
        for _ in range(3):
            assert driver.on_record(record) == {"curriculum/stage": 0}
    (said,) = [r.getMessage() for r in caplog.records]
    assert said == ("curriculum.metric 'episode_retrun' is in no metrics record after 100 "
                    "episodes, so the curriculum stays in stage 0; did you mean "
                    "'episode_return'?")  # fmt: skip


def test_an_actor_s_environments_follow_the_stage_once_per_change():
    state = StateStore()
    envs = [StagedCartPole(), StagedCartPole()]
    worker = SimpleNamespace(envs=envs, worker_id="actor/0")
    follow = CurriculumFollower(state, worker, "curriculum/stage")
    follow()  # nothing set yet: environments are left as built
    state.set("curriculum/stage", {"index": 1, "stage": 2})
    follow()
    assert [(e.reset(), e.stage)[1] for e in envs] == [2, 2]  # from their next episode
    envs.append(StagedCartPole())  # rebuilt after an error: told on the next heartbeat
    follow()
    assert (envs[-1].reset(), envs[-1].stage)[1] == 2

    class Broken(StagedCartPole):
        def set_curriculum_stage(self, stage):
            raise RuntimeError("no such stage")

    envs.append(Broken())
    with pytest.raises(EnvironmentFailure, match=r"environment 3 of actor/0 raised in set_cur"):
        follow()


def test_each_worker_follows_what_its_plan_needs(tmp_path):
    cfg = make_experiment("cartpole-curriculum")
    state = StateStore()
    actor = SimpleNamespace(envs=[], worker_id="actor/0")
    state.set(cfg.curriculum.key, {"index": 0, "stage": 0})
    (hook,) = follow_coordination(state, ActorPlan("actor/0"), cfg, actor)
    assert isinstance(hook, CurriculumFollower) and hook.seen == 1  # it ran once already
    eval_cfg = make_experiment("cartpole-ppo")
    policy_worker = PolicyWorkerPlan("policy/default/1", policy="other")
    assert follow_coordination(state, policy_worker, eval_cfg, actor) == []  # not judged


def _member(name: str, service: InprocParameterService) -> SimpleNamespace:
    obs = gym.spaces.Box(-1.0, 1.0, (4,))
    policy = ActorCriticPolicy(observation_space=obs, action_space=gym.spaces.Discrete(2), seed=0)
    worker = SimpleNamespace(
        policy_name=name, trainer=PPOTrainer(policy, lr=1e-3), params=service, stats={}
    )
    worker.publish = lambda persist: service.publish(name, policy.version, policy.get_checkpoint())
    return worker


def test_a_pbt_member_copies_the_source_and_takes_the_order_s_hyperparameters():
    service = InprocParameterService()
    source = _member("b", service)
    for p in source.trainer.policy.parameters():
        p.data.add_(1.0)  # the better member's weights differ
    source.publish(False)
    state = StateStore()
    target = _member("a", service)
    member = PBTMember(state, target, {"lr": 1e-3})
    state.set("pbt/a/order", {"generation": 1, "source": "b", "hyperparameters": {"lr": 5e-4}})
    member()
    applied = state.get("pbt/a/applied")[0]
    assert applied["digest_after"] == applied["digest_source"] != applied["digest_before"]
    assert applied["version_after"] == applied["version_before"] + 1
    assert target.trainer.lr == 5e-4 and target.stats["hp/lr"] == 5e-4
    member()  # the same order again: nothing more is done
    assert target.stats["pbt_exploits"] == 1
    with pytest.raises(ConfigError, match=r"pbt\.hyperparameters"):
        PBTMember(state, _member("c", service), {"no_such_knob": 1.0})


def test_weights_digests_see_any_change():
    policy = ActorCriticPolicy(
        observation_space=gym.spaces.Box(-1.0, 1.0, (4,)), action_space=gym.spaces.Discrete(2)
    )
    before = weights_digest(policy.get_checkpoint())
    assert weights_digest(policy.get_checkpoint()) == before
    next(iter(policy.parameters())).data[0] += 1e-3
    assert weights_digest(policy.get_checkpoint()) != before
