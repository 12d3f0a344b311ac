"""Who beats whom: Elo ratings of every player of a multi-agent run, and the learner's score
against each past version it plays in self-play.

Actors stamp every multi-agent episode with its ``seats`` (``[policy, version, return]`` per
agent, :func:`system.workers.lanes.matchups`). A *player* is a policy, except that a self-play
opponent is a different player for each learner version it played (``main@120``): the pool's
snapshots are fixed players, rated as they are met. Each pair of different players of an episode
is one game, scored by return (higher wins, equal draws). Training and evaluation games both
count; evaluation games against scripted policies anchor the scale.

The controller feeds episodes in, adds the learner's rating to each metrics record, keeps
``ratings.json`` in the run folder (the table, sorted by rating, with games, wins, draws and
losses), and writes the learner's score against each snapshot into the global state
(``selfplay/scores``, with the games behind each in ``selfplay/score_games``) for
``prioritized`` opponent sampling. A resumed run goes on from both: its players keep their
ratings and games, and the scores their weight.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from api.config import ExperimentConfig
from api.global_state import GlobalState
from system import run_folder
from system.run.episodes import EpisodeRecord, Seat
from system.run_folder import write_atomically
from system.workers.opponent_pool import SCORES_KEY

logger = logging.getLogger(__name__)

RATINGS_FILE = run_folder.RATINGS
SCORE_GAMES_KEY = "selfplay/score_games"
"""Global state key: ``{str(version): games}`` behind each of ``selfplay/scores``' means."""
INITIAL = 1000.0
K = 16.0
"""Elo's step: how far one game moves a rating (16: slow and steady, many games a second)."""


@dataclass
class Player:
    name: str
    rating: float = INITIAL
    games: int = 0
    wins: int = 0
    draws: int = 0
    losses: int = 0


def _numbers(player: Player) -> bool:
    counts = (player.rating, player.games, player.wins, player.draws, player.losses)
    return all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in counts)


class Ratings:
    def __init__(self, config: ExperimentConfig, run_dir: Path, store: GlobalState):
        self.learner = config.selfplay.learner
        self.opponent = config.selfplay.opponent
        self.path = Path(run_dir) / RATINGS_FILE
        self.store = store
        self.players: dict[str, Player] = {}
        self.scores: dict[int, list[float]] = {}
        """Opponent version -> [the learner's total score against it, games]."""
        self.changed = False
        self._restore()

    def _restore(self) -> None:
        """A resumed run's table and scores (a fresh run has neither)."""
        if self.path.is_file():
            try:
                rows = json.loads(self.path.read_text())
                names = [f.name for f in fields(Player)]
                players = [Player(**{k: row[k] for k in names}) for row in rows]
                if not all(isinstance(p.name, str) and _numbers(p) for p in players):
                    raise TypeError("a row's name is not a string or a count is not a number")
            except (OSError, ValueError, KeyError, TypeError) as e:
                logger.warning("%s is unreadable, the ratings start afresh: %s", self.path, e)
            else:
                self.players = {p.name: p for p in players}
        means, games = self.store.get(SCORES_KEY)[0], self.store.get(SCORE_GAMES_KEY)[0]
        if isinstance(means, dict) and isinstance(games, dict):
            for version, n in games.items():
                mean = means.get(str(version))
                if str(version).isdigit() and type(n) is int and isinstance(mean, (int, float)):
                    self.scores[int(version)] = [float(mean) * n, n]

    def player(self, policy: str, version: int) -> str:
        return f"{self.learner}@{version}" if policy == self.opponent else policy

    def on_episodes(self, episodes: list[EpisodeRecord]) -> None:
        for episode in episodes:
            if episode.seats:
                self._games(episode.seats)

    def _games(self, seats: tuple[Seat, ...]) -> None:
        played = [
            (self.player(s.policy, s.version), s.episode_return, s.policy, s.version) for s in seats
        ]
        for i, (a, ret_a, policy_a, _) in enumerate(played):
            for b, ret_b, policy_b, version_b in played[i + 1 :]:
                if a == b:
                    continue  # mirror play: no information about strength
                score = 0.5 if ret_a == ret_b else float(ret_a > ret_b)
                self._elo(a, b, score)
                if policy_a == self.learner and policy_b == self.opponent:
                    self._score(version_b, score)
                elif policy_b == self.learner and policy_a == self.opponent:
                    self._score(int(played[i][3]), 1.0 - score)

    def _elo(self, a: str, b: str, score_a: float) -> None:
        pa = self.players.setdefault(a, Player(a))
        pb = self.players.setdefault(b, Player(b))
        expected_a = 1.0 / (1.0 + 10 ** ((pb.rating - pa.rating) / 400.0))
        pa.rating += K * (score_a - expected_a)
        pb.rating -= K * (score_a - expected_a)
        for p, s in ((pa, score_a), (pb, 1.0 - score_a)):
            p.games += 1
            p.wins += s == 1.0
            p.draws += s == 0.5
            p.losses += s == 0.0
        self.changed = True

    def _score(self, version: int, score: float) -> None:
        total = self.scores.setdefault(version, [0.0, 0])
        total[0] += score
        total[1] += 1

    def table(self) -> list[dict[str, Any]]:
        ordered = sorted(self.players.values(), key=lambda p: -p.rating)
        return [{**asdict(p), "rating": round(p.rating, 1)} for p in ordered]

    def on_record(self) -> dict[str, Any]:
        """Each policy's rating (not the snapshots') for every metrics record once it has one
        (the last record, which ``troupe status`` shows, has them even when no game ended in
        its second); when a game changed them, saves the table, and the learner's scores
        against the snapshots for prioritised sampling."""
        if self.changed:
            self.changed = False
            text = (json.dumps(self.table(), indent=1) + "\n").encode()
            write_atomically(self.path, lambda f: f.write(text), sync=False)
            if self.opponent and self.scores:
                self.store.set(SCORES_KEY, {str(v): s / n for v, (s, n) in self.scores.items()})
                self.store.set(SCORE_GAMES_KEY, {str(v): n for v, (_, n) in self.scores.items()})
        return {f"rating/{p.name}": p.rating for p in self.players.values() if "@" not in p.name}

    def summary(self) -> list[dict[str, Any]]:
        return self.table()[:10]
