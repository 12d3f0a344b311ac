"""Shared fixtures for the algorithm tests: one torch thread, and sample batches that follow the
runtime's data conventions (built by rolling a policy out on random observations). The learning
checks start ``troupe`` with the end-to-end helpers of tests/system."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from api.namedarray import NamedArray, concatenate, stack
from api.policy import RolloutRequest, SampleBatch

# pytest puts each test's own folder on the path; the shared helpers live in a sibling one.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "system"))


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture
def gloo_group(tmp_path):
    """A gloo process group of this one process, destroyed once the test's objects are gone.

    The tests destroyed it themselves, in a ``finally``, while their DDP-wrapped policy was
    still alive: freed as the test returned, the wrapper then dropped the group's last
    reference, and the group's destructor joined gloo's threads from there. Once in CI it
    never returned (a data-parallel PPO test hung the suite; torch 2.13, CPU). Destroyed here
    after them, the group goes through ``destroy_process_group``, as a script's would."""
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield dist
    gc.collect()  # the test's DDP wrapper and reducer, before the group they hold
    dist.destroy_process_group()


def _sample_obs(space, rng: np.random.Generator, batch: int):
    space.seed(int(rng.integers(1 << 31)))
    if hasattr(space, "spaces") and isinstance(space.spaces, dict):
        rows = [space.sample() for _ in range(batch)]
        return NamedArray(**{k: np.stack([r[k] for r in rows]) for k in space.spaces})
    return np.stack([space.sample() for _ in range(batch)])


def collect_batch(policy, observation_space, steps: int, segments: int, seed: int = 0):
    """A ``[steps, segments]`` SampleBatch from rollouts on random observations.

    Episodes end at random (done or truncated), and the step after an end is a reset, exactly as
    an actor records them.
    """
    rng = np.random.default_rng(seed)
    state = policy.default_policy_state
    states = None if state is None else concatenate([state] * segments)
    on_reset = np.ones((segments, 1), dtype=bool)
    done = np.zeros((segments, 1), dtype=bool)
    truncated = np.zeros((segments, 1), dtype=bool)
    records = []
    for _ in range(steps):
        obs = _sample_obs(observation_space, rng, segments)
        request = RolloutRequest(
            obs=obs,
            policy_state=states,
            is_evaluation=np.zeros((segments, 1), dtype=bool),
            on_reset=on_reset,
        )
        result = policy.rollout(request)
        reward = np.where(on_reset, 0.0, rng.normal(size=(segments, 1))).astype(np.float32)
        records.append(
            SampleBatch(
                obs=obs,
                action=result.action,
                policy_output=result.policy_output,
                policy_state=states,
                reward=reward,
                done=done.copy(),
                truncated=truncated.copy(),
                on_reset=on_reset.copy(),
                policy_version=np.full((segments, 1), policy.version, dtype=np.int64),
            )
        )
        on_reset = done | truncated
        states = result.policy_state
        done = ~on_reset & (rng.random((segments, 1)) < 0.1)
        truncated = ~on_reset & ~done & (rng.random((segments, 1)) < 0.05)
    return stack(records)


@pytest.fixture
def make_batch():
    return collect_batch
