"""Learning checks for the off-policy algorithms, through an in-process replay loop (real
gymnasium environments, the policy's own rollout, ``system.replay.buffer.ReplayBuffer``, the
trainer): what the replay worker role will run over sockets. Run alone with
``pytest -m learning -s``.

* SAC on Pendulum-v1: greedy return above -250 (10 episodes) within 20k frames.
"""

import gymnasium as gym
import numpy as np
import pytest
import torch
from replay_loop import SegmentCollector, greedy_returns, train_off_policy

from algorithm.sac.policy import SACPolicy
from algorithm.sac.trainer import SACTrainer
from system.replay.buffer import ReplayBuffer, ReplayConfig
from system.replay.rate_limiter import RateLimiterConfig

pytestmark = pytest.mark.learning


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _train_until(env_id, collector, buffer, trainer, target, budget, every, updates, batch):
    """Train in chunks of ``every`` frames; after each, play 10 greedy episodes. Returns
    ``(frames, greedy mean)`` at the first chunk that reaches ``target``, or at the budget."""
    greedy = -np.inf
    while collector.frames < budget:
        train_off_policy(collector, buffer, trainer, collector.frames + every, updates, batch)
        greedy = float(np.mean(greedy_returns(env_id, trainer.policy, 10)))
        print(f"{env_id}: {collector.frames} frames, greedy {greedy:.1f}", flush=True)
        if greedy >= target:
            break
    return collector.frames, greedy


def test_sac_beats_minus_250_on_pendulum_within_20k_frames():
    env = gym.make("Pendulum-v1")
    policy = SACPolicy(
        env.observation_space, env.action_space, hidden_sizes=(64, 64), warmup_frames=1000, seed=0
    )
    buffer = ReplayBuffer(
        ReplayConfig(capacity_frames=50_000, seed=0, rate_limit=RateLimiterConfig(min_size=1000))
    )
    trainer = SACTrainer(policy)
    collector = SegmentCollector("Pendulum-v1", policy, envs=1, segment_length=16)
    frames, greedy = _train_until(
        "Pendulum-v1", collector, buffer, trainer, -250.0, 20_000, 2000, updates=16, batch=128
    )
    assert greedy > -250.0, f"greedy return {greedy} after {frames} frames"
