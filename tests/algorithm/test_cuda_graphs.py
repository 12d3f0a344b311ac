"""Acting through CUDA graphs (``ActorCriticPolicy(cuda_graphs=True)``): the same actions,
log-probabilities and values as the eager rollout, whatever the padding; sampling that follows
the policy's distribution; new weights read without a new capture.

The graph-free tests run the very buffers, buckets and padding of :class:`GraphedRollout` as
plain calls (``capture=False``); the ones marked ``cuda`` capture graphs and are skipped without
a GPU (they ran on the project's H200 machine, BENCHMARKS.md)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from algorithm.actor_critic_policies.policy import ActorCriticPolicy
from algorithm.modules.cuda_graphs import GraphedRollout, sample_rows
from algorithm.modules.distributions import Categorical
from api.policy import RolloutRequest

FRAMES = gym.spaces.Box(0, 255, shape=(4, 36, 36), dtype=np.uint8)
VECTOR = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
TF32 = 2e-3
"""On a GPU, products run in TF32 (``tune_cuda``), and a padded batch may take other cuDNN
algorithms than the eager one: the outputs agree to about 1e-3 (2.6e-4 seen on an H200)."""
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _policy(space=FRAMES, seed=0, **kwargs) -> ActorCriticPolicy:
    return ActorCriticPolicy(
        observation_space=space,
        action_space=gym.spaces.Discrete(6),
        seed=seed,
        hidden_sizes=[] if space is FRAMES else [16],
        shared_backbone=True,
        numpy_inference=False,
        **kwargs,
    )


def _obs(rows: int, seed: int, space=FRAMES) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if space is FRAMES:
        return rng.integers(0, 256, size=(rows, *space.shape), dtype=np.uint8)
    return rng.uniform(-1, 1, size=(rows, *space.shape)).astype(np.float32)


def _eager(policy: ActorCriticPolicy, obs: np.ndarray):
    """The greedy action, its log-prob and the value, through the module and ``Categorical``."""
    with torch.no_grad():
        params, value, _ = policy.module(
            policy.to_tensor(obs)[None], None, torch.zeros(1, len(obs), 1, dtype=torch.bool)
        )
        dist = Categorical(params[0])
        action = dist.mode()
        return action.numpy(), dist.log_prob(action).numpy(), value[0].numpy()


def _graphed(policy: ActorCriticPolicy, space=FRAMES, **kwargs) -> GraphedRollout:
    policy.eval_mode()
    return GraphedRollout(policy.module, space, 6, policy.device, capture=False, **kwargs)


def test_greedy_rows_match_the_categorical_mode_its_log_prob_and_the_value():
    policy = _policy()
    obs = _obs(5, seed=1)
    with torch.no_grad():
        out = sample_rows(
            policy.module, torch.from_numpy(obs), torch.rand(5, 6), torch.ones(5, dtype=torch.bool)
        )
    action, log_prob, value = _eager(policy, obs)
    np.testing.assert_array_equal(out[:, 0].numpy().astype(np.int64), action)
    np.testing.assert_allclose(out[:, 1:2].numpy(), log_prob, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out[:, 2:3].numpy(), value, rtol=1e-6, atol=1e-6)


def test_gumbel_max_sampling_draws_from_the_policy_distribution():
    policy = _policy(VECTOR)
    rows = 40_000
    obs = torch.from_numpy(np.repeat(_obs(1, seed=2, space=VECTOR), rows, axis=0))
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        out = sample_rows(
            policy.module,
            obs,
            torch.rand(rows, 6, generator=generator),
            torch.zeros(rows, dtype=torch.bool),
        )
    counts = np.bincount(out[:, 0].numpy().astype(np.int64), minlength=6) / rows
    probs = np.exp(_log_probs(policy, obs[:1]))
    # 40,000 draws: a frequency's standard deviation is at most 0.0025
    np.testing.assert_allclose(counts, probs, atol=0.012)
    logged = out[:, 1].numpy()
    chosen = out[:, 0].numpy().astype(np.int64)
    np.testing.assert_allclose(np.exp(logged), probs[chosen], rtol=1e-5)


def _log_probs(policy: ActorCriticPolicy, obs: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        flags = torch.zeros(1, 1, 1, dtype=torch.bool, device=obs.device)
        params, _, _ = policy.module(obs[None], None, flags)
        return torch.log_softmax(params[0, 0], -1).cpu().numpy()


def test_batches_are_padded_to_power_of_two_buckets_and_the_padding_never_leaks():
    policy = _policy()
    graphed = _graphed(policy)
    for rows, seed in ((5, 1), (3, 2), (8, 3), (9, 4), (1, 5)):
        obs = _obs(rows, seed)
        action, log_prob, value = graphed.act(obs, np.ones(rows, dtype=bool), None)
        want = _eager(policy, obs)
        np.testing.assert_array_equal(action, want[0])
        np.testing.assert_allclose(log_prob, want[1], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(value, want[2], rtol=1e-5, atol=1e-6)
        assert action.dtype == np.int64 and log_prob.shape == value.shape == (rows, 1)
    assert sorted(graphed.buckets) == [8, 16]


def test_a_batch_it_cannot_take_is_left_to_the_eager_rollout():
    graphed = _graphed(_policy(), max_rows=32)
    assert graphed.max_rows == 32
    assert graphed.act(_obs(33, seed=0), None, None) is None  # past the largest bucket
    assert graphed.act(_obs(4, seed=0)[:, :2], None, None) is None  # another shape
    assert graphed.act(_obs(0, seed=0), None, None) is None
    assert graphed.buckets == {}


def test_sampled_rows_mix_with_greedy_rows_and_a_seeded_generator_repeats():
    policy = _policy()
    obs = _obs(12, seed=6)
    greedy = np.arange(12) % 2 == 0
    runs = [_graphed(policy).act(obs, greedy, torch.Generator().manual_seed(7)) for _ in range(2)]
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][0][greedy], _eager(policy, obs)[0][greedy])


def test_on_the_cpu_the_option_acts_the_eager_way():
    """``device="cuda"`` without a GPU falls back to the CPU, where no graph is captured."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    policy = _policy(device="cuda", cuda_graphs=True)
    assert policy._graphed is None
    obs = _obs(3, seed=8)
    result = policy.rollout(RolloutRequest(obs=obs, is_evaluation=np.ones((3, 1), dtype=bool)))
    np.testing.assert_array_equal(result.action, _eager(policy, obs)[0])


def test_a_policy_the_graphs_cannot_act_for_is_refused_before_it_runs():
    with pytest.raises(ValueError, match=r"needs a feed-forward network \(rnn_hidden=0\)"):
        _policy(rnn_hidden=8, cuda_graphs=True)
    with pytest.raises(ValueError, match="needs one Discrete action, not Box"):
        ActorCriticPolicy(VECTOR, gym.spaces.Box(-1, 1, (2,)), cuda_graphs=True)


# ------------------------------------------------------------------------- on a GPU
@cuda
def test_captured_graphs_act_as_the_eager_rollout_for_every_batch_size():
    eager = _policy(device="cuda")
    graphed = _policy(device="cuda", cuda_graphs=True)
    eager.eval_mode(), graphed.eval_mode()
    for rows in (1, 5, 8, 23, 100, 300):
        obs = _obs(rows, seed=rows)
        greedy = np.ones((rows, 1), dtype=bool)
        want = eager.rollout(RolloutRequest(obs=obs, is_evaluation=greedy))
        got = graphed.rollout(RolloutRequest(obs=obs, is_evaluation=greedy))
        np.testing.assert_array_equal(got.action, want.action)
        np.testing.assert_allclose(got.policy_output.log_prob, want.policy_output.log_prob,
                                   rtol=0, atol=TF32)  # fmt: skip
        np.testing.assert_allclose(got.policy_output.value, want.policy_output.value,
                                   rtol=0, atol=TF32)  # fmt: skip
    assert sorted(graphed._graphed.buckets) == [8, 32, 128, 512]
    assert all(b.graph is not None for b in graphed._graphed.buckets.values())


@cuda
def test_new_weights_are_read_by_the_captured_graphs_without_a_new_capture():
    graphed = _policy(device="cuda", cuda_graphs=True, seed=0)
    other = _policy(device="cuda", seed=1)
    graphed.eval_mode(), other.eval_mode()
    obs, greedy = _obs(20, seed=9), np.ones((20, 1), dtype=bool)
    graphed.rollout(RolloutRequest(obs=obs, is_evaluation=greedy))  # captures the 32-row graph
    graph = graphed._graphed.buckets[32].graph
    graphed.load_checkpoint(other.get_checkpoint())
    got = graphed.rollout(RolloutRequest(obs=obs, is_evaluation=greedy))
    want = other.rollout(RolloutRequest(obs=obs, is_evaluation=greedy))
    assert graphed._graphed.buckets[32].graph is graph
    np.testing.assert_allclose(got.policy_output.value, want.policy_output.value,
                               rtol=0, atol=TF32)  # fmt: skip


@cuda
def test_captured_sampling_follows_the_policy_distribution():
    policy = _policy(VECTOR, device="cuda", cuda_graphs=True)
    policy.eval_mode()
    obs = np.repeat(_obs(1, seed=2, space=VECTOR), 1000, axis=0)
    actions = np.concatenate([policy.rollout(RolloutRequest(obs=obs)).action for _ in range(40)])
    probs = np.exp(_log_probs(policy, torch.from_numpy(obs[:1]).cuda()))
    np.testing.assert_allclose(np.bincount(actions, minlength=6) / len(actions), probs,
                               atol=0.012)  # fmt: skip
