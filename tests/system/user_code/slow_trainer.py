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


SAVE_S = 20.0


class SlowSavePPOTrainer(PPOTrainer):
    """PPO whose state takes ``SAVE_S`` seconds to hand over at the stop (the final
    checkpoint), as a large state written to a slow disk does; longer than the 15 s the
    controller gave every worker's stop (used by tests/system/test_busy_heartbeat.py)."""

    def get_checkpoint(self):
        state = super().get_checkpoint()
        if self.stopping():
            time.sleep(SAVE_S)
        return state

    @staticmethod
    def stopping() -> bool:
        import inspect  # called from the trainer worker's on_stop: the last save

        return any(frame.function == "on_stop" for frame in inspect.stack(0))
