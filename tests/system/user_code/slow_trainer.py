"""A real PPO trainer whose every step takes at least ``STEP_S`` seconds longer, as a Nature-CNN
update on a loaded 2-core machine does (used by tests/system/test_busy_heartbeat.py)."""

from __future__ import annotations

import time

from algorithm.ppo.trainer import PPOTrainer

STEP_S = 5.0


class SlowPPOTrainer(PPOTrainer):
    """PPO, then a wait inside the step (the worker loop gets no control back meanwhile)."""

    def step(self, samples):
        result = super().step(samples)
        time.sleep(STEP_S)
        return result
