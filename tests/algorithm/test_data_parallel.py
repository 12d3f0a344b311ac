"""Data-parallel training of the off-policy algorithms (``trainer_workers=2``): two gloo ranks,
each stepping on its own transitions, must end with the same parameters (and SAC with the same
temperature), as the ranks of a trainer group do (``system/workers/trainer_group.py``).

Each rank starts from a policy of its own seed and trains on batches drawn from its own random
stream, so only DDP's initial broadcast and its gradient averaging can make them agree.
"""

from __future__ import annotations

import multiprocessing

import gymnasium as gym
import numpy as np
import pytest

STEPS = 3
BATCH = 32
OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
BOX = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 10.0], np.float32))
IMAGE = gym.spaces.Box(0, 255, (12, 12, 3), np.uint8)


def _observations(rng: np.random.Generator, space: gym.Space) -> np.ndarray:
    if space is IMAGE:
        return rng.integers(0, 256, (BATCH, *IMAGE.shape), dtype=np.uint8)
    return rng.uniform(-1, 1, (BATCH, 3)).astype(np.float32)


def _transitions(rng: np.random.Generator, action: np.ndarray, space: gym.Space = OBS):
    from api.replay import TransitionBatch

    return TransitionBatch(
        obs=_observations(rng, space),
        action=action,
        reward=rng.normal(size=(BATCH, 1)).astype(np.float32),
        discount=np.where(rng.random((BATCH, 1)) < 0.1, 0.0, 0.99).astype(np.float32),
        next_obs=_observations(rng, space),
    )


def _sac(rank: int, space: gym.Space = OBS):
    from algorithm.sac.policy import SACPolicy
    from algorithm.sac.trainer import SACTrainer

    policy = SACPolicy(space, BOX, hidden_sizes=(16, 16), feature_dim=8, seed=rank)
    rng = np.random.default_rng(100 + rank)
    batches = [
        _transitions(rng, rng.uniform(BOX.low, BOX.high, (BATCH, 2)).astype(np.float32), space)
        for _ in range(STEPS)
    ]
    return policy, lambda: SACTrainer(policy), batches


def _sac_pixels(rank: int):
    """SAC from images: the encoder, trained by the critics' loss, and its target copy too."""
    return _sac(rank, IMAGE)


def _dqn(rank: int):
    from algorithm.dqn.trainer import DQNTrainer
    from algorithm.q_policies.policy import QPolicy

    policy = QPolicy(OBS, gym.spaces.Discrete(3), hidden_sizes=(16, 16), seed=rank)
    rng = np.random.default_rng(100 + rank)
    batches = [_transitions(rng, rng.integers(3, size=BATCH)) for _ in range(STEPS)]
    return policy, lambda: DQNTrainer(policy, lr=1e-2), batches


def _rank(algorithm: str, rank: int, init_file: str, results) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        cases = {"sac": _sac, "sac-pixels": _sac_pixels, "dqn": _dqn}
        policy, make_trainer, batches = cases[algorithm](rank)
        trainer = make_trainer()
        policy.distributed_setup()  # as GroupTrainerWorker.join does, once the trainer is built
        for batch in batches:
            trainer.step(batch)
        state = {k: v.detach().numpy().copy() for k, v in policy.module.state_dict().items()}
        alpha = float(trainer.log_alpha.detach()) if algorithm != "dqn" else None
        results.put((rank, state, alpha))
    except BaseException as e:
        results.put((rank, repr(e), None))
        raise
    finally:
        dist.destroy_process_group()


@pytest.mark.multiprocess
@pytest.mark.parametrize("algorithm", ["sac", "sac-pixels", "dqn"])
def test_two_ranks_on_different_data_end_with_equal_parameters(algorithm, tmp_path):
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    ranks = [
        ctx.Process(target=_rank, args=(algorithm, r, str(tmp_path / "pg"), results))
        for r in range(2)
    ]
    try:
        for p in ranks:
            p.start()
        (_, state0, alpha0), (_, state1, alpha1) = sorted(
            (results.get(timeout=180) for _ in ranks), key=lambda r: r[0]
        )
    finally:
        for p in ranks:
            p.join(60)
            if p.is_alive():
                p.kill()
    assert isinstance(state0, dict) and isinstance(state1, dict), (state0, state1)
    different = [k for k in state0 if not np.array_equal(state0[k], state1[k])]
    assert different == [], f"{algorithm}: ranks diverged in {different}"
    if algorithm == "sac-pixels":  # the encoder and its target are compared, not left out
        assert any(k.startswith("features_target.") for k in state0), sorted(state0)
    assert alpha0 == alpha1
