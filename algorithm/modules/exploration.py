"""Exploration scheduled by frames, counted the same way by every policy that has one.

A Q policy's epsilon and SAC's uniform warm-up both follow the number of training rows the
policy has acted on. Each policy worker counts its own rows; the replay worker knows the run's
count (every frame inserted, kept with the buffer across restarts and resumes) and hands it to
the trainer with each batch, which moves its copy on with :meth:`observe_frames`. The count goes
out in every published checkpoint and loading one never moves it backwards, so all policy
workers, a restarted one and those of a resumed run too, follow one schedule instead of starting
to explore from scratch.
"""

from __future__ import annotations

from typing import Any


class CountsExploration:
    """Mix in before the policy's base class: ``explore_frames`` in checkpoints, and
    :meth:`observe_frames` to move it on."""

    explore_frames: int = 0

    def observe_frames(self, frames: int) -> None:
        """Move the exploration count to ``frames`` if that is further along."""
        self.explore_frames = max(self.explore_frames, int(frames))

    def get_checkpoint(self) -> dict[str, Any]:
        return {**super().get_checkpoint(), "explore_frames": self.explore_frames}  # type: ignore[misc]

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().load_checkpoint(checkpoint)  # type: ignore[misc]
        self.observe_frames(checkpoint.get("explore_frames", 0))
