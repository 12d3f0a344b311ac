"""A tiny real PettingZoo AEC game for the adapter's tests: rewards go to the players NOT moving.

On each move the player to move gives every other player still in the game ``action`` points
(0, 1 or 2). ``quitter`` (a player index) leaves the game right after its first move; the game is
truncated for everyone after ``moves`` moves. So rewards arrive for agents that do not act, and an
agent leaves while the others play on: the two cases a turn-based adapter must get right.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv


class GiftGame(AECEnv):
    metadata = {"name": "gift_game_v0", "is_parallelizable": False, "render_modes": []}

    def __init__(self, players: int = 2, moves: int = 4, quitter: int | None = None):
        super().__init__()
        self.possible_agents = [f"player_{i}" for i in range(players)]
        self.moves = moves
        self.quitter = None if quitter is None else self.possible_agents[quitter]
        self._obs_space = spaces.Box(0.0, float(moves), (1,), np.float64)
        self.count = 0

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        self.agents = self.possible_agents[:]
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self.agent_selection = self.agents[0]
        self.count = 0

    def observe(self, agent):
        return np.array([self.count], dtype=np.float64)

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0
        self._clear_rewards()
        for other in self.agents:
            if other != agent and not self.terminations[other]:
                self.rewards[other] += float(action)
        self.count += 1
        if agent == self.quitter:
            self.terminations[agent] = True
        if self.count >= self.moves:
            self.truncations = dict.fromkeys(self.agents, True)
        self.agent_selection = self._next(agent)
        self._accumulate_rewards()
        self._deads_step_first()

    def _next(self, agent):
        order = self.possible_agents
        i = order.index(agent)
        for k in range(1, len(order) + 1):
            candidate = order[(i + k) % len(order)]
            if candidate in self.agents and not self.terminations[candidate]:
                return candidate
        return agent


class ChoiceGame(ParallelEnv):
    """A parallel game whose action is a Dict: each player picks 0-2 and may boost, scoring the
    pick plus the boost; ``box=True`` makes the action a Tuple of two Box parts instead (scoring
    minus the distance of each part from 0.5). Each action is checked against its space, as a
    strict game checks it."""

    metadata = {"name": "choice_game_v0", "render_modes": []}

    def __init__(self, moves: int = 5, box: bool = False):
        self.possible_agents = ["left", "right"]
        self.moves, self.box, self.count = moves, box, 0
        if box:
            part = spaces.Box(0.0, 1.0, (2,), np.float32)
            self._action_space = spaces.Tuple((part, spaces.Box(-1.0, 1.0, (1,), np.float32)))
        else:
            parts = {"pick": spaces.Discrete(3), "boost": spaces.MultiBinary(1)}
            self._action_space = spaces.Dict(parts)

    def observation_space(self, agent):
        return spaces.Box(0.0, 1.0, (1,), np.float32)

    def action_space(self, agent):
        return self._action_space

    def reset(self, seed=None, options=None):
        self.agents, self.count = self.possible_agents[:], 0
        return {a: self._obs() for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.count += 1
        rewards = {}
        for agent, action in actions.items():
            if not self._action_space.contains(action):
                raise ValueError(f"{agent}'s action {action!r} is not in {self._action_space}")
            rewards[agent] = self._score(action)
        over = self.count >= self.moves
        obs = {a: self._obs() for a in self.agents}
        ends = dict.fromkeys(self.agents, over)
        if over:
            self.agents = []
        return obs, rewards, dict.fromkeys(ends, False), ends, {a: {} for a in ends}

    def _score(self, action) -> float:
        if self.box:
            return -float(np.abs(action[0] - 0.5).sum() + np.abs(action[1] - 0.5).sum())
        return float(action["pick"] + action["boost"][0])

    def _obs(self):
        return np.array([self.count / self.moves], dtype=np.float32)


class MaskedWalk(ParallelEnv):
    """A parallel game with a global state: two walkers on a line of 5 cells, each observing a
    Dict of its own cell and an action mask (no step off the line), the state both cells as
    float64 (cast to float32 by the adapter). Moves: 0 left, 1 stay, 2 right (a masked one
    stays); 6 moves an episode, rewarded by the walkers' distance apart."""

    metadata = {"name": "masked_walk_v0", "render_modes": []}
    state_space = spaces.Box(0.0, 4.0, (2,), np.float64)

    def __init__(self):
        self.possible_agents = ["a", "b"]
        self.cells, self.count = np.array([1.0, 3.0]), 0

    def observation_space(self, agent):
        return spaces.Dict(
            {"cell": spaces.Box(0.0, 4.0, (1,), np.float32), "action_mask": spaces.MultiBinary(3)}
        )

    def action_space(self, agent):
        return spaces.Discrete(3)

    def state(self):
        return self.cells.copy()

    def reset(self, seed=None, options=None):
        self.agents, self.count = self.possible_agents[:], 0
        self.cells = np.random.default_rng(seed).integers(0, 5, 2).astype(np.float64)
        return {a: self._obs(i) for i, a in enumerate(self.agents)}, {a: {} for a in self.agents}

    def step(self, actions):
        self.count += 1
        for i, agent in enumerate(self.possible_agents):  # a masked move: no move
            self.cells[i] = np.clip(self.cells[i] + actions[agent] - 1, 0, 4)
        distance = float(abs(self.cells[0] - self.cells[1]))
        over = self.count >= 6
        obs = {a: self._obs(i) for i, a in enumerate(self.possible_agents)}
        ends = dict.fromkeys(self.possible_agents, over)
        if over:
            self.agents = []
        return (
            obs,
            dict.fromkeys(ends, distance),
            dict.fromkeys(ends, False),
            ends,
            {a: {} for a in ends},
        )

    def _obs(self, i):
        cell = self.cells[i]
        mask = np.array([cell > 0, True, cell < 4], dtype=np.int8)
        return {"cell": np.array([cell], dtype=np.float32), "action_mask": mask}
