"""Head-to-head matches: play N games between policies in this process and count the outcomes.

A quick, exact answer to "does my agent beat the random and the heuristic opponent?" without
starting a run: any policies (learned ones loaded from a checkpoint, scripted ones) play any
registered multi-agent environment, several games at once. Requests are batched per policy like
the runtime's (one ``RolloutRequest`` for every agent a policy moves this step, with memories and
``on_reset`` flags), so a policy that works here works behind a policy worker::

    from api import policy
    from legacy.matches import play_matches

    env = "ConnectFour-v3"
    spaces = ...  # the agents' spaces, e.g. from api.environment.make(env)
    heuristic = policy.make("connect-four-heuristic", observation_space=..., action_space=...)
    report = play_matches(env, [my_policy, heuristic], games=200)
    print(report)  # wins / draws / losses of my_policy, overall and per seat

The outcome of a game is read from the episode returns: the first policy wins when its return is
higher than every other seat's, draws when it ties the best, loses otherwise. Seats rotate from
game to game (``rotate_seats``), so the first-move advantage is shared out fairly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from api.environment import Environment, StepResult, make
from api.errors import UserError
from api.namedarray import NamedArray, concatenate, stack
from api.policy import Policy, RolloutRequest


@dataclass
class MatchReport:
    """Outcomes from the first policy's side."""

    games: int = 0
    wins: int = 0
    draws: int = 0
    losses: int = 0
    by_seat: dict[int, list[int]] = field(default_factory=dict)
    """Seat the first policy played -> ``[wins, draws, losses]`` in those games."""
    steps: int = 0
    """Environment steps over all games."""

    @property
    def win_rate(self) -> float:
        return self.wins / max(1, self.games)

    @property
    def draw_rate(self) -> float:
        return self.draws / max(1, self.games)

    @property
    def loss_rate(self) -> float:
        return self.losses / max(1, self.games)

    def record(self, seat: int, outcome: int) -> None:
        """Count one game; ``outcome`` is 0 win, 1 draw, 2 loss."""
        self.games += 1
        self.wins += outcome == 0
        self.draws += outcome == 1
        self.losses += outcome == 2
        self.by_seat.setdefault(seat, [0, 0, 0])[outcome] += 1

    def __str__(self) -> str:
        seats = ", ".join(
            f"seat {seat}: {w}/{d}/{lost}" for seat, (w, d, lost) in sorted(self.by_seat.items())
        )
        return (
            f"{self.games} games: win {self.win_rate:.1%}, draw {self.draw_rate:.1%}, loss "
            f"{self.loss_rate:.1%} (wins/draws/losses by seat: {seats})"
        )


@dataclass
class _Table:
    """One environment and the game on it: who sits where, returns, memories."""

    env: Environment
    lineup: list[int]
    """Policy index of each seat."""
    results: list[StepResult | None]
    returns: np.ndarray
    states: list[NamedArray | None]
    on_reset: list[bool]


def play_matches(
    environment: str | Environment,
    policies: Sequence[Policy],
    games: int,
    *,
    tables: int = 8,
    greedy: bool = True,
    rotate_seats: bool = True,
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
) -> MatchReport:
    """Play ``games`` games between ``policies`` (one per seat) and count the first one's results.

    ``tables`` environments play at once (their requests batched per policy). ``greedy`` sets
    ``is_evaluation`` on every request. With ``rotate_seats``, game ``g`` puts policy ``k`` in
    seat ``(k + g) % seats``; otherwise policy ``k`` always sits in seat ``k``.
    """
    if games < 1 or tables < 1:
        raise UserError(f"play_matches: games and tables must be at least 1, got {games}, {tables}")
    envs = [_make_env(environment, env_kwargs, i) for i in range(min(tables, games))]
    if len(policies) != envs[0].agent_count:
        raise UserError(
            f"play_matches: the environment has {envs[0].agent_count} seats but "
            f"{len(policies)} policies were given; give one policy per seat"
        )
    match = _Match(policies, games, greedy, rotate_seats)
    try:
        for i, env in enumerate(envs):
            env.seed(seed + i)
            match.open(env)
        while match.tables:
            match.play_one_step()
    finally:
        if not isinstance(environment, Environment):
            for env in envs:
                env.close()
    return match.report


def _make_env(environment: str | Environment, env_kwargs, index: int) -> Environment:
    if isinstance(environment, Environment):
        if index > 0:
            raise UserError("play_matches: pass a registered name to play on several tables")
        return environment
    return make(environment, **(env_kwargs or {}))


class _Match:
    def __init__(self, policies: Sequence[Policy], games: int, greedy: bool, rotate: bool):
        self.policies = list(policies)
        self.games = games
        self.greedy = greedy
        self.rotate = rotate
        self.started = 0
        self.tables: list[_Table] = []
        self.report = MatchReport()
        self.request_id = 0

    def open(self, env: Environment, table: _Table | None = None) -> None:
        """Start the next game on ``env`` (reusing ``table``), or retire the table if all
        games have started."""
        if table is not None:
            self.tables.remove(table)
        if self.started >= self.games:
            return
        n = env.agent_count
        shift = self.started if self.rotate else 0
        lineup = [(s - shift) % n for s in range(n)]  # policy k sits in seat (k + shift) % n
        self.started += 1
        defaults = [self.policies[k].default_policy_state for k in lineup]
        self.tables.append(_Table(env, lineup, env.reset(), np.zeros(n), defaults, [True] * n))

    def play_one_step(self) -> None:
        actions = {id(t): [None] * len(t.lineup) for t in self.tables}
        for k, policy in enumerate(self.policies):
            seats = [
                (t, s)
                for t in self.tables
                for s in range(len(t.lineup))
                if t.lineup[s] == k and _acts(t.results[s])
            ]
            if seats:
                self._ask(policy, seats, actions)
        for table in list(self.tables):
            self._step(table, actions[id(table)])

    def _ask(self, policy: Policy, seats: list[tuple[_Table, int]], actions: dict) -> None:
        """One batched request for every seat ``policy`` moves now; hand out the actions."""
        n = len(seats)
        obs = [t.results[s].obs for t, s in seats]
        states = [t.states[s] for t, s in seats]
        self.request_id += 1
        request = RolloutRequest(
            obs=stack([NamedArray(**o) for o in obs])
            if isinstance(obs[0], dict)
            else np.stack(obs),
            policy_state=None if states[0] is None else concatenate(states),
            is_evaluation=np.full((n, 1), self.greedy),
            on_reset=np.array([[t.on_reset[s]] for t, s in seats]),
            client_id=np.arange(n, dtype=np.int64).reshape(n, 1),
            request_id=np.full((n, 1), self.request_id, dtype=np.int64),
        )
        result = policy.rollout(request)
        for row, (t, s) in enumerate(seats):
            actions[id(t)][s] = result.action[row]
            t.on_reset[s] = False
            if result.policy_state is not None:
                t.states[s] = result.policy_state[row : row + 1]

    def _step(self, table: _Table, actions: list[Any]) -> None:
        table.results = table.env.step(actions)
        self.report.steps += 1
        for s, result in enumerate(table.results):
            if result is not None:
                table.returns[s] += float(np.asarray(result.reward).reshape(-1)[0])
        live = [r for r in table.results if r is not None]
        if live and not any(_acts(r) for r in live):
            self._score(table)
            self.open(table.env, table)

    def _score(self, table: _Table) -> None:
        seat = table.lineup.index(0)
        mine = table.returns[seat]
        best_other = np.delete(table.returns, seat).max()
        self.report.record(seat, 0 if mine > best_other else 1 if mine == best_other else 2)


def _acts(result: StepResult | None) -> bool:
    return result is not None and not (result.done or result.truncated)
