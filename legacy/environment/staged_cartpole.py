"""CartPole with a curriculum: each stage asks for longer balancing with a shorter pole.

Stage ``k`` ends episodes (truncated) after ``time_limits[k]`` steps and shortens the pole to
``pole_lengths[k]`` (CartPole's half-length; a shorter pole falls faster, so it is harder to
hold). A stage set during an episode takes effect at the next reset. Every step's ``info`` has
``curriculum_stage``, so the stage each episode was played in reaches the run's metrics as
``episode_info/curriculum_stage``.
"""

from __future__ import annotations

from typing import Any

from api.environment import StepResult
from api.errors import UserError
from legacy.environment.gym_adapter import GymnasiumEnvironment


class StagedCartPole(GymnasiumEnvironment):
    def __init__(
        self,
        time_limits: tuple[int, ...] | list[int] = (100, 200, 500),
        pole_lengths: tuple[float, ...] | list[float] = (0.5, 0.45, 0.4),
    ):
        if len(time_limits) != len(pole_lengths) or not time_limits:
            raise UserError(
                f"StagedCartPole: time_limits ({len(time_limits)}) and pole_lengths "
                f"({len(pole_lengths)}) must list the same, non-zero number of stages"
            )
        super().__init__("CartPole-v1", max_episode_steps=max(time_limits))
        self.time_limits = [int(t) for t in time_limits]
        self.pole_lengths = [float(p) for p in pole_lengths]
        self.stage = 0
        self._next_stage = 0
        self._steps = 0

    def set_curriculum_stage(self, stage: Any) -> None:
        index = int(stage)
        if not 0 <= index < len(self.time_limits):
            raise UserError(
                f"StagedCartPole has stages 0..{len(self.time_limits) - 1}; got {stage!r}"
            )
        self._next_stage = index

    def reset(self) -> list[StepResult | None]:
        self.stage = self._next_stage
        cartpole = self.gym_env.unwrapped
        cartpole.length = self.pole_lengths[self.stage]
        cartpole.polemass_length = cartpole.masspole * cartpole.length
        self._steps = 0
        return self._tag(super().reset())

    def step(self, actions: list[Any]) -> list[StepResult | None]:
        results = super().step(actions)
        self._steps += 1
        result = results[0]
        if not result.done and self._steps >= self.time_limits[self.stage]:
            result.truncated = True
            self._episode_over = True
        return self._tag(results)

    def _tag(self, results: list[StepResult | None]) -> list[StepResult | None]:
        for r in results:
            if r is not None:
                r.info["curriculum_stage"] = self.stage
        return results
