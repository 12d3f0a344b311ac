"""GridGather: a small turn-based multi-agent game that exercises the whole environment contract.

Agents share a square grid scattered with coins. They move in turns, one agent per step, so on
every step only the agent whose turn comes next gets a result and the others get ``None`` (and
``step`` receives ``None`` for them). Moving onto a coin collects it for +1. The episode ends
(``done`` for every agent) when the last coin is taken, or is cut short (``truncated`` for every
agent) after ``max_steps`` steps in total.

Observations are dicts, so policies with dict inputs and action masks get tested on a built-in:

* ``position``: the agent's own (row, column), scaled to [0, 1];
* ``coins``: a ``size x size`` grid, 1 where a coin lies;
* ``others``: a ``size x size`` grid, 1 where another agent stands;
* ``action_mask``: 1 for each legal action. Moving off the grid or onto another agent is illegal;
  an illegal action is accepted and does nothing, so random actions are safe.

Actions: 0 stay, 1 up, 2 down, 3 left, 4 right.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import gymnasium as gym
import numpy as np

from api.environment import Environment, StepResult
from api.errors import UserError

STAY, UP, DOWN, LEFT, RIGHT = range(5)
MOVES = np.array([(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)], dtype=np.int64)
"""Row and column change of each action, indexed by action."""


class GridGatherEnvironment(Environment):
    """Agents take turns moving on a grid and collect coins for +1 each."""

    def __init__(
        self,
        n_agents: int = 2,
        size: int = 5,
        n_coins: int = 5,
        max_steps: int = 50,
        seed: int | None = None,
    ):
        _check_arguments(n_agents, size, n_coins, max_steps)
        self.n_agents = n_agents
        self.size = size
        self.n_coins = n_coins
        self.max_steps = max_steps
        self._obs_spaces = [self._observation_space() for _ in range(n_agents)]
        self._act_spaces = [gym.spaces.Discrete(len(MOVES)) for _ in range(n_agents)]
        self._rng = np.random.default_rng(seed)
        self._positions = np.zeros((n_agents, 2), dtype=np.int64)
        self._coins = np.zeros((size, size), dtype=bool)
        self._pending = np.zeros(n_agents, dtype=np.float64)
        self._collected = np.zeros(n_agents, dtype=np.int64)
        self._turn = 0
        self._steps = 0
        self._running = False

    # ----------------------------------------------------------------- contract
    @property
    def agent_count(self) -> int:
        return self.n_agents

    @property
    def observation_spaces(self) -> list[gym.Space]:
        return list(self._obs_spaces)

    @property
    def action_spaces(self) -> list[gym.Space]:
        return list(self._act_spaces)

    def seed(self, seed: int) -> None:
        """Restart the layout generator, so the next ``reset`` deals the same board."""
        self._rng = np.random.default_rng(seed)
        for i, space in enumerate(self._act_spaces):
            space.seed(seed + i)

    def reset(self) -> list[StepResult | None]:
        cells = self._rng.choice(self.size * self.size, self.n_agents + self.n_coins, replace=False)
        rows, cols = np.divmod(cells, self.size)
        self._positions[:] = np.stack([rows[: self.n_agents], cols[: self.n_agents]], axis=1)
        self._coins[:] = False
        self._coins[rows[self.n_agents :], cols[self.n_agents :]] = True
        self._pending[:] = 0.0
        self._collected[:] = 0
        self._turn = 0
        self._steps = 0
        self._running = True
        return self._results_for([0])

    def step(self, actions: list[Any]) -> list[StepResult | None]:
        self._check_step_call(actions)
        self._move(self._turn, int(actions[self._turn]))
        self._steps += 1
        self._turn = (self._turn + 1) % self.n_agents
        if not self._coins.any():
            return self._end_episode(done=True)
        if self._steps >= self.max_steps:
            return self._end_episode(done=False)
        return self._results_for([self._turn])

    def render(self) -> np.ndarray:
        """An RGB picture of the board: coins yellow, agents in shades of blue."""
        frame = np.zeros((self.size, self.size, 3), dtype=np.uint8)
        frame[self._coins] = (230, 200, 40)
        for i, (r, c) in enumerate(self._positions):
            frame[r, c] = (40, 80 + 150 * i // max(1, self.n_agents - 1), 230)
        return frame

    # ----------------------------------------------------------------- game rules
    def _check_step_call(self, actions: list[Any]) -> None:
        if not self._running:
            raise UserError(
                "GridGather: step() called but no episode is running (it ended, or reset() was "
                "never called); call reset() to start a new episode"
            )
        if len(actions) != self.n_agents:
            raise ValueError(
                f"GridGather has {self.n_agents} agents, so step() takes {self.n_agents} actions "
                f"(None for agents not on turn); got {len(actions)}"
            )
        action = actions[self._turn]
        if action is None:
            raise ValueError(
                f"GridGather: it is agent {self._turn}'s turn but its action is None; pass an "
                "action for the agent whose last result was not None"
            )
        if not 0 <= int(action) < len(MOVES):
            raise ValueError(f"GridGather: action {action} is not in 0..{len(MOVES) - 1}")

    def _move(self, agent: int, action: int) -> None:
        """Apply a legal move and collect a coin there; an illegal move does nothing."""
        if not self._legal_actions(agent)[action]:
            return
        target = self._positions[agent] + MOVES[action]
        self._positions[agent] = target
        r, c = target
        if self._coins[r, c]:
            self._coins[r, c] = False
            self._pending[agent] += 1.0
            self._collected[agent] += 1

    def _legal_actions(self, agent: int) -> np.ndarray:
        targets = self._positions[agent] + MOVES
        inside = np.all((targets >= 0) & (targets < self.size), axis=1)
        others = np.delete(self._positions, agent, axis=0)
        occupied = (targets[:, None, :] == others[None, :, :]).all(axis=2).any(axis=1)
        legal = inside & ~occupied
        legal[STAY] = True
        return legal

    def _end_episode(self, done: bool) -> list[StepResult | None]:
        self._running = False
        return self._results_for(range(self.n_agents), done=done, truncated=not done)

    def _results_for(
        self, agents: Iterable[int], done: bool = False, truncated: bool = False
    ) -> list[StepResult | None]:
        """Results for ``agents`` (their rewards since they last acted); None for the rest."""
        results: list[StepResult | None] = [None] * self.n_agents
        over = done or truncated
        for i in agents:
            info = {"coins_collected": float(self._collected[i])} if over else {}
            results[i] = StepResult(
                self._observe(i), float(self._pending[i]), done, truncated, info
            )
            self._pending[i] = 0.0
        return results

    def _observe(self, agent: int) -> dict[str, np.ndarray]:
        others = np.zeros((self.size, self.size), dtype=np.float32)
        for i, (r, c) in enumerate(self._positions):
            if i != agent:
                others[r, c] = 1.0
        return {
            "position": (self._positions[agent] / (self.size - 1)).astype(np.float32),
            "coins": self._coins.astype(np.float32),
            "others": others,
            "action_mask": self._legal_actions(agent).astype(np.int8),
        }

    def _observation_space(self) -> gym.spaces.Dict:
        grid = gym.spaces.Box(0.0, 1.0, (self.size, self.size), np.float32)
        return gym.spaces.Dict(
            {
                "position": gym.spaces.Box(0.0, 1.0, (2,), np.float32),
                "coins": grid,
                "others": grid,
                "action_mask": gym.spaces.MultiBinary(len(MOVES)),
            }
        )


def _check_arguments(n_agents: int, size: int, n_coins: int, max_steps: int) -> None:
    problems = []
    if n_agents < 1:
        problems.append(f"n_agents must be at least 1, got {n_agents}")
    if size < 2:
        problems.append(f"size must be at least 2, got {size}")
    if n_coins < 1:
        problems.append(f"n_coins must be at least 1, got {n_coins}")
    if max_steps < 1:
        problems.append(f"max_steps must be at least 1, got {max_steps}")
    if not problems and n_agents + n_coins > size * size:
        problems.append(
            f"{n_agents} agents and {n_coins} coins do not fit on a {size}x{size} grid; "
            "raise size or lower n_coins"
        )
    if problems:
        raise ValueError("GridGather: " + "; ".join(problems))
