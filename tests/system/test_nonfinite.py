"""NaN and infinity are caught at the actor, with the environment named, not in the trainer.

On main a NaN observation went to the policy and the trainer unnoticed, and the trainer failed
over and over with advice about the learning rate. The environment here is a real gymnasium
CartPole whose physics blow up at a chosen step, behind the real gymnasium adapter.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from api.config import make_experiment
from api.errors import ConfigError, NonFiniteError
from legacy.environment.gym_adapter import GymnasiumEnvironment
from system.run import builders
from system.streams.inference import InprocInferenceHub
from system.streams.samples import InprocSampleHub
from system.workers.actor_worker import ActorWorker
from system.workers.policy_worker import PolicyWorker


class BrokenCartPole(CartPoleEnv):
    """CartPole whose observation (or reward) turns NaN at step ``at`` of every episode; or,
    ``field="shape"``, whose observation has one value too many there
    (tests/system/test_misfit_observations.py)."""

    def __init__(self, at: int = 3, field: str = "obs", **kwargs):
        super().__init__(**kwargs)
        self.at, self.field, self.t = at, field, 0

    def reset(self, **kwargs):
        self.t = 0
        return super().reset(**kwargs)

    def step(self, action):
        obs, reward, done, truncated, info = super().step(action)
        self.t += 1
        if self.t == self.at:
            if self.field == "obs":
                obs = obs.copy()
                obs[2] = np.nan
            elif self.field == "shape":
                obs = np.append(obs, np.float32(0.0))
            else:
                reward = float("inf")
        return obs, reward, done, truncated, info


gym.register("BrokenCartPole-v0", entry_point=BrokenCartPole, max_episode_steps=500)


def actor_and_policy(on_nonfinite: str, make_env, env_name="BrokenCartPole-v0", **kwargs):
    """A cartpole-ppo actor of 4 environments and its policy worker, in one process: the test
    polls both. ``kwargs``: more of the actor's arguments."""
    config = make_experiment("cartpole-ppo")
    spaces = builders.probe_spaces(config)
    hub, samples = InprocInferenceHub(), InprocSampleHub()
    policy = builders.make_policy(config, "default", spaces, 0)
    worker = PolicyWorker("policy", "default", policy, hub.server("default"), None)
    actor = ActorWorker(
        "actor/3",
        make_env,
        4,
        config.policy_of_agent,
        hub.client("actor/3"),
        samples.producer(),
        segment_length=4,
        on_nonfinite=on_nonfinite,
        env_name=env_name,
        **kwargs,
    )
    return actor, worker, samples.queues["default"]


def broken_second_env(field: str = "obs"):
    def make(index: int):
        if index == 2:
            return GymnasiumEnvironment("BrokenCartPole-v0", at=3, field=field)
        return GymnasiumEnvironment("CartPole-v1")

    return make


@pytest.mark.parametrize("field, what", [("obs", "observation"), ("reward", "reward")])
def test_a_nonfinite_value_fails_the_actor_naming_the_environment(field, what):
    actor, worker, _ = actor_and_policy("fail", broken_second_env(field))
    with pytest.raises(NonFiniteError) as caught:
        for _ in range(50):
            actor.poll()
            worker.poll()
    assert str(caught.value).startswith(
        f"environment 'BrokenCartPole-v0' #2 of actor/3, agent 0, at step 3 of its episode "
        f"returned a non-finite {what} (NaN or infinity); fix the environment"
    )
    assert "actors.on_nonfinite='drop_episode'" in str(caught.value)
    actor.close()


def test_drop_episode_resets_the_environment_and_no_nan_leaves_the_actor():
    actor, worker, segments = actor_and_policy("drop_episode", broken_second_env())
    dropped = 0
    for _ in range(60):
        actor.poll()
        worker.poll()
        dropped += actor.collect_stats().get("nonfinite_episodes", 0)
    assert dropped >= 10  # every episode of environment 2 goes NaN at its third step
    assert segments, "the healthy environments kept producing segments"
    for chunk in segments:
        assert np.isfinite(chunk.obs).all() and np.isfinite(chunk.reward).all()
    actor.close()


def test_on_nonfinite_is_checked_with_the_config():
    expected = r"actors\.on_nonfinite: must be 'fail' or 'drop_episode', got 'ignore'"
    with pytest.raises(ConfigError, match=expected):
        make_experiment("cartpole-ppo", ["actors.on_nonfinite=ignore"])


def test_a_policy_that_answers_nan_actions_is_named():
    config = make_experiment("pendulum-ppo")
    spaces = builders.probe_spaces(config)
    hub = InprocInferenceHub()
    policy = builders.make_policy(config, "default", spaces, 0)
    diverged = policy.get_checkpoint()
    diverged["model"] = {k: v * float("nan") for k, v in diverged["model"].items()}
    policy.load_checkpoint(diverged)
    worker = PolicyWorker("policy", "default", policy, hub.server("default"), None)
    actor = ActorWorker(
        "actor/0",
        builders.env_factory(config),
        2,
        config.policy_of_agent,
        hub.client("actor/0"),
        InprocSampleHub().producer(),
        env_name="Pendulum-v1",
    )
    with pytest.raises(NonFiniteError, match=r"policy 'default' answered environment "
                       r"'Pendulum-v1' #\d of actor/0, agent 0, at step 0 of its episode with a "
                       r"non-finite action"):  # fmt: skip
        for _ in range(10):
            actor.poll()
            worker.poll()
    actor.close()
