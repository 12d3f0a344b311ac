"""Learning check of the replay worker role: SAC on Pendulum-v1 through the runtime's serial mode
(the actor, policy, replay and trainer workers of a run, wired in one process), registered
experiment ``pendulum-sac``. Run alone with ``pytest -m learning -s``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from replay_loop import greedy_returns

from api.config import StopConfig, make_experiment

pytestmark = pytest.mark.learning


def test_pendulum_sac_through_the_replay_worker_beats_minus_250_within_20k_frames():
    torch.set_num_threads(1)
    from system.run.serial import SerialRun

    cfg = make_experiment("pendulum-sac")
    cfg.evaluation = dataclasses.replace(cfg.evaluation, workers=0)
    cfg.stop = StopConfig(env_frames=20_000)
    run = SerialRun(cfg)
    greedy, frames = -np.inf, 0
    try:
        while frames < 20_000:
            frames = run.run(env_frames=frames + 2000).env_frames
            policy = run.trainers["default"].trainer.policy
            greedy = float(np.mean(greedy_returns("Pendulum-v1", policy, 10)))
            print(f"pendulum-sac (serial): {frames} frames, greedy {greedy:.1f}", flush=True)
            if greedy > -250.0:
                break
    finally:
        run.close()
    assert greedy > -250.0, f"greedy return {greedy:.1f} after {frames} frames"
