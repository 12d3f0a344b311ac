"""Learning checks: PPO with the actor-critic policy trains to its targets through the runtime's
serial mode
(``system.run.serial.SerialRun``: the production actor, policy and trainer workers in one
process). Minutes each; run alone with ``pytest -m learning -s`` to see the numbers.

Targets (training-episode returns, stochastic actions, averaged over the last ``window`` episodes):

* CartPole-v1: 475 within 175k environment steps, for 3 of 3 seeds (and 475 greedily).
* MemoryCue-v0: +0.9 with a GRU policy; a feed-forward policy stays at chance (about 0).
* Pendulum-v1: -200 within the example's 300k-step budget for 3 of 3 seeds (and -250 or better
  greedily within it, judged as the stop rule judges).
* CartPole-v1 with IMPALA (4 actors): 475 within 300k environment steps (and 475 greedily).
* CartPole-v1 with DQN (cartpole-dqn, replay worker): greedy 475 within 200k environment steps,
  under CleanRL's DQN budget (``dqn.py``'s default ``--total-timesteps`` of 500k, the budget of
  its CartPole-v1 result on https://docs.cleanrl.dev/rl-algorithms/dqn/).
"""

import numpy as np
import pytest
import torch

from api.config import make_experiment
from system.run.serial import SerialRun

pytestmark = pytest.mark.learning


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _train(experiment, seed, env_frames, target, window, *overrides, evaluate=False):
    """Train until the mean of the last ``window`` training returns reaches ``target``; with
    ``evaluate``, also play the config's evaluation episodes greedily on the trained parameters."""
    config = make_experiment(experiment, [f"seed={seed}", *overrides])
    run = SerialRun(config)
    try:
        progress = run.run(env_frames=env_frames, until_return=target, return_window=window)
    finally:
        run.close()
    mean = progress.recent_return(window)
    print(
        f"{experiment} seed {seed} {' '.join(overrides)}: return {mean:.3f} over the last "
        f"{window} episodes after {progress.env_frames} env frames ({progress.wall_s:.0f}s)"
    )
    if not evaluate:
        return progress, mean, None
    greedy = _greedy(config, run.store)
    print(f"  greedy evaluation: {greedy:.1f} over {config.evaluation.episodes} episodes")
    return progress, mean, greedy


def _greedy(config, store) -> float:
    """Mean return of the config's evaluation episodes, played greedily with the newest
    parameters in ``store``."""
    evaluation = SerialRun(config, train=False, store=store)
    try:
        episodes = evaluation.eval_until(config.evaluation.episodes)
    finally:
        evaluation.close()
    return float(np.mean([e["episode_return"] for e in episodes]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cartpole_reaches_475_within_175k_steps(seed):
    progress, mean, greedy = _train("cartpole-ppo", seed, 175_000, 475.0, 50, evaluate=True)
    assert mean >= 475.0, f"mean return {mean} after {progress.env_frames} frames"
    assert greedy >= 475.0


def test_memory_cue_is_solved_with_a_gru_and_not_without():
    progress, mean, _ = _train("memory-gru-ppo", 0, 50_000, 0.9, 100)
    assert mean >= 0.9, f"GRU policy: mean return {mean} after {progress.env_frames} frames"
    # the same budget and more for a memoryless policy: it cannot beat a coin flip
    override = "policies.default.policy.args.rnn_hidden=0"
    progress, mean, _ = _train("memory-gru-ppo", 0, 30_000, 2.0, 1000, override)
    assert abs(mean) < 0.15, f"feed-forward policy should be at chance, got {mean}"


def _greedy_within(config, run, progress, budget: int, target: float, every: int) -> list:
    """Greedy evaluations of the newest parameters, training ``every`` more frames between
    them, until one scores ``target`` or the frame budget is spent: what a run's stop rule
    (``stop.eval_return``) does as it trains. ``(env_frames, greedy return)`` of each."""
    seen = [(progress.env_frames, _greedy(config, run.store))]
    while seen[-1][1] < target and progress.env_frames < budget:
        progress = run.run(env_frames=min(budget, progress.env_frames + every))
        seen.append((progress.env_frames, _greedy(config, run.store)))
    print(f"  greedy evaluations (frames, return): {[(f, round(g, 1)) for f, g in seen]}")
    return seen


@pytest.mark.timeout(900)  # three seeds of 20-70 s each on a quiet 2-core machine
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pendulum_reaches_minus_200_and_plays_it_greedily_for_every_seed(seed):
    """Each seed's mean over 100 training episodes (the usual window) reaches -200 within the
    example's 300k frames, and greedy play of the config's 100 evaluation episodes scores -250
    or better within that budget, judged every 16k frames from the moment the training mean
    crossed, as the recipe's stop rule judges it while it trains.

    Greedy play is not judged at the crossing alone: PPO's returns on Pendulum are not monotone.
    On a 2-core AMD EPYC VM (2026-12-03), seed 1 crossed at 76.8k frames on a good stretch
    (-182.5), played -327.6 greedily there, fell to a training mean of -313.2 by 92.8k, and
    played -180.1 at 124.8k; seeds 0 and 2 played -206.6 and -179.0 at their crossings (62.4k,
    65.6k), and later fell back for a while too (greedy -357.8 at 158.4k, -464.9 at 113.6k).
    Seeds 3-5, not in the check, crossed at 102.4k, 96k and 78.4k frames and played -169.5,
    -175.2 and -176.8 there. On another AMD EPYC VM (2026-11-29) seeds 0-8 crossed after
    49.6k-105.6k frames and played -161 to -208 at the crossing (serial mode is deterministic on
    one machine only). The config before (discount 0.9, raw rewards) was seed-sensitive: seed 1
    ended at -264 after 300k frames."""
    config = make_experiment("pendulum-ppo", [f"seed={seed}"])
    run = SerialRun(config)
    try:
        progress = run.run(env_frames=300_000, until_return=-200.0, return_window=100)
        mean = progress.recent_return(100)
        print(f"pendulum-ppo seed {seed}: {mean:.1f} over 100 episodes at {progress.env_frames}")
        assert mean >= -200.0, f"training mean {mean} after {progress.env_frames} frames"
        seen = _greedy_within(config, run, progress, 300_000, -250.0, 16_000)
    finally:
        run.close()
    assert seen[-1][1] >= -250.0, f"greedy evaluations (frames, return): {seen}"


def test_cartpole_impala_reaches_475_within_300k_steps():
    progress, mean, greedy = _train("cartpole-impala", 0, 300_000, 475.0, 50, evaluate=True)
    assert mean >= 475.0, f"mean return {mean} after {progress.env_frames} frames"
    assert greedy >= 475.0


CLEANRL_DQN_BUDGET = 500_000
"""CleanRL's ``dqn.py`` default ``--total-timesteps``, the budget of its CartPole-v1 result."""


@pytest.mark.timeout(900)
def test_cartpole_dqn_reaches_greedy_475_within_cleanrl_budget():
    """cartpole-dqn's learner (actors -> replay worker -> trainer, serially), in the recipe's
    layout: greedy play after every 10k frames, until 10 greedy episodes average 475. Seeds 0, 1
    and 2 met it at 70k, 110k and 90k frames here (serial mode with replay is not
    deterministic); the cap of 200k keeps a failing check short and is well inside CleanRL's
    500k.

    Serial mode lets the trainer make every step the replay worker's rate limiter allows within
    a round (:meth:`system.run.serial.SerialRun.poll`). Before it did, a trainer made one step a
    round, one per 32 frames with the recipe's one actor of 32, a quarter of its updates: seeds
    0, 0 and 1 then read greedy 427, 158 and 288 at 200k frames."""
    config = make_experiment("cartpole-dqn", ["seed=0"])
    run = SerialRun(config)
    greedy, frames = -np.inf, 0
    try:
        while frames < 200_000 and greedy < 475.0:
            frames = run.run(env_frames=frames + 10_000).env_frames
            greedy = _greedy(config, run.store)
            print(f"cartpole-dqn: greedy {greedy:.1f} after {frames} frames", flush=True)
    finally:
        run.close()
    print(f"cartpole-dqn: {run.progress.wall_s:.0f}s training wall-clock", flush=True)
    assert greedy >= 475.0, f"greedy return {greedy} after {frames} frames"
    assert frames <= CLEANRL_DQN_BUDGET
