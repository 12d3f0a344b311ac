"""``actor_keys``: an actor that reads its own part of a Dict observation and a critic that
reads all of it (MAPPO's centralised critic, ``--algo mappo``)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from algorithm.actor_critic_policies.policy import ActorCriticPolicy
from api.namedarray import NamedArray
from api.policy import RolloutRequest

SPACE = gym.spaces.Dict(
    {
        "obs": gym.spaces.Box(-1.0, 1.0, (4,), np.float32),
        "state": gym.spaces.Box(-1.0, 1.0, (8,), np.float32),
        "action_mask": gym.spaces.MultiBinary(3),
    }
)
ACTIONS = gym.spaces.Discrete(3)


def observations(rows: int, seed: int = 0) -> NamedArray:
    rng = np.random.default_rng(seed)
    return NamedArray(
        obs=rng.uniform(-1, 1, (rows, 4)).astype(np.float32),
        state=rng.uniform(-1, 1, (rows, 8)).astype(np.float32),
        action_mask=np.ones((rows, 3), np.int8),
    )


def replaced(original: NamedArray, **keys: np.ndarray) -> NamedArray:
    return NamedArray(**{**{k: original[k] for k in original.keys()}, **keys})  # noqa: SIM118 (no iter)


def forward(policy: ActorCriticPolicy, obs: NamedArray):
    """The torch network's distribution parameters and values for one step of ``obs``."""
    rows = len(obs["obs"])
    with torch.no_grad():
        tensors = policy.to_tensor(obs).apply(lambda x: x[None])
        params, value, _ = policy.module(tensors, None, torch.zeros(1, rows, 1, dtype=bool))
    return params[0].numpy(), value[0].numpy()


def test_the_actor_reads_its_keys_and_the_critic_every_key():
    policy = ActorCriticPolicy(SPACE, ACTIONS, actor_keys=["obs"], seed=1, numpy_inference=False)
    assert policy.module.actor_body.encoder.keys == ["obs"]
    assert policy.module.critic_body.encoder.keys == ["obs", "state"]
    obs = observations(16)
    params, value = forward(policy, obs)
    other_state = replaced(obs, state=observations(16, seed=1)["state"])
    params_2, value_2 = forward(policy, other_state)
    np.testing.assert_array_equal(params, params_2)  # acting ignores the state
    assert not np.allclose(value, value_2)  # judging reads it
    other_own = replaced(obs, obs=observations(16, seed=2)["obs"])
    params_3, value_3 = forward(policy, other_own)
    assert not np.allclose(params, params_3) and not np.allclose(value, value_3)


def test_the_numpy_path_reads_the_same_keys_as_torch():
    fast = ActorCriticPolicy(SPACE, ACTIONS, actor_keys=["obs"], seed=3)
    slow = ActorCriticPolicy(SPACE, ACTIONS, actor_keys=["obs"], seed=3, numpy_inference=False)
    assert fast._numpy is not None
    obs = observations(32)
    request = RolloutRequest(
        obs=obs, is_evaluation=np.ones((32, 1), bool), on_reset=np.ones((32, 1), bool)
    )
    got, ref = fast.rollout(request), slow.rollout(request)
    np.testing.assert_array_equal(got.action, ref.action)  # greedy: the same choices
    np.testing.assert_allclose(got.policy_output.value, ref.policy_output.value, atol=1e-5)
    np.testing.assert_allclose(got.policy_output.log_prob, ref.policy_output.log_prob, atol=1e-5)


@pytest.mark.parametrize("numpy_inference", [True, False])
def test_the_mask_still_binds_an_actor_that_reads_only_its_own_keys(numpy_inference):
    policy = ActorCriticPolicy(
        SPACE, ACTIONS, actor_keys=["obs"], seed=0, numpy_inference=numpy_inference
    )
    obs = observations(64)
    obs["action_mask"][:, 1] = 0
    request = RolloutRequest(
        obs=obs, is_evaluation=np.zeros((64, 1), bool), on_reset=np.ones((64, 1), bool)
    )
    assert 1 not in policy.rollout(request).action


@pytest.mark.parametrize(
    "space, kwargs, said",
    [
        (SPACE, dict(shared_backbone=True), "actor_keys needs shared_backbone=False"),
        (SPACE["obs"], {}, r"actor_keys names keys of a Dict observation; this one is Box\("),
        (SPACE, dict(actor_keys=["own"]), r"no input \['own'\]; it has obs, state"),
        (SPACE, dict(actor_keys=["action_mask"]), r"no input \['action_mask'\]"),
        (SPACE, dict(mirror_actions=[2, 1, 0]), "actor_keys and mirror_actions: one or"),
    ],
)
def test_a_wrong_actor_keys_is_refused_saying_why(space, kwargs, said):
    with pytest.raises(ValueError, match=said):
        ActorCriticPolicy(space, ACTIONS, **{"actor_keys": ["obs"], **kwargs})
