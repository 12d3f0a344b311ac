"""Issue 15, item 4: an Atari game's unclipped score reaches the run's metrics as ``game_return``.

Atari-v0's episodes are lives and its rewards are clipped, so ``episode_return`` is neither the
game nor its score; the score of a whole game is in the ``info`` of the step that ends it. Here a
real actor plays real Breakout games (random actions) and the real controller makes its metrics
record from the actor's stats."""

from __future__ import annotations

import numpy as np
import pytest
from test_builders import controller  # noqa: F401 - a fixture
from test_workers import answer_all, eval_actor

from api import environment
from system.run.report import read_metrics
from system.run.tally import WorkerStats
from system.streams.inference import InprocInferenceHub

pytest.importorskip("ale_py", reason="Atari needs the atari extra: pip install -e '.[atari]'")


def test_the_unclipped_score_of_whole_games_is_in_the_metrics(controller):  # noqa: F811
    _, ctl = controller
    hub = InprocInferenceHub()
    rng = np.random.default_rng(0)
    actor = eval_actor(hub, "a", lambda e: environment.make("Atari-v0", game="Breakout"), 2)
    actor.is_evaluation = False  # its episodes count as training episodes
    games, lives = [], []
    for _ in range(20_000):
        actor.poll()
        answer_all(hub, "p", action=lambda n: rng.integers(0, 4, n))
        for record in actor.collect_stats().get("episodes", []):
            lives.append(record)
            if "episode_info/game_return" in record:
                games.append(record["episode_info/game_return"])
        if len(games) >= 2:
            break
    assert len(games) >= 2 and len(lives) > len(games)  # several lives to a game
    ctl.tally.add(ctl.workers["actor/0"], WorkerStats.from_heartbeat({"episodes": lives}))
    ctl._report(show=False)
    ctl.metrics.close()
    record = read_metrics(ctl.run_dir)[-1]
    assert record["game_return"] == pytest.approx(np.mean(games))


def test_emulator_frames_reach_the_metrics(controller):  # noqa: F811
    """Atari-v0's steps are 4 emulator frames each (its frame skip): the actor says so, and the
    record counts both, where it counted agent steps alone."""
    _, ctl = controller
    hub = InprocInferenceHub()
    actor = eval_actor(hub, "a", lambda e: environment.make("Atari-v0", game="Breakout"), 2)
    actor.is_evaluation = False
    for _ in range(40):
        actor.poll()
        answer_all(hub, "p", action=lambda n: np.zeros(n, np.int64))
    stats = actor.collect_stats()
    assert stats["frames_per_step"] == 4 and stats["env_frames"] > 0
    ctl.tally.add(ctl.workers["actor/0"], WorkerStats.from_heartbeat(stats))
    ctl._report(show=False)
    ctl.metrics.close()
    record = read_metrics(ctl.run_dir)[-1]
    assert record["emulator_frames"] == 4 * record["env_frames"] == 4 * stats["env_frames"]
