"""``troupe eval RUN --video`` of multi-agent runs: every agent played by the policy the run's
evaluation seats there, one frame after each reset and each step.

It was refused ("--video plays one-agent environments"), for ``troupe train TicTacToe-v3`` (a
self-play mapping), for ``gather-2p-ppo`` (red and blue by ``agent_policies``) and for
KnightsArchersZombies (one policy at four seats) alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from api.errors import UserError

pytestmark = pytest.mark.multiprocess

ROOT = Path(__file__).resolve().parents[2]


def troupe(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "distributed.cli", *args],
        capture_output=True, text=True, timeout=300, cwd=cwd,
        env={**os.environ, "COLUMNS": "400", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def video(run: Path, out: Path) -> tuple[str, list, int]:
    """Who played, the returns printed, and the frames written."""
    imageio = pytest.importorskip("imageio.v3")
    result = troupe("eval", str(run), "--episodes", "2", "--video", str(out), cwd=run.parent)
    said = result.stdout + result.stderr
    assert result.returncode == 0, said[-3000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("video of 2 greedy"))
    who = line.split(" greedy episodes of ")[1].split(", played for it")[0]
    returns = json.loads(line.split("(returns ")[1].split("), in ")[0].replace("'", '"'))
    return who, returns, imageio.imread(out, index=None).shape[0]


def test_a_self_play_run_is_filmed_as_its_evaluation_seats_it(tmp_path):
    """``troupe train TicTacToe-v3`` plays the learner against the scripted ``random`` in
    evaluation, the learner in either seat: so does the video, one winner per game."""
    run = tmp_path / "ttt"
    trained = troupe("train", "TicTacToe-v3", "frames=1500", "--run-dir", str(run),
                     "--no-display", cwd=tmp_path)  # fmt: skip
    assert trained.returncode == 0, (trained.stdout + trained.stderr)[-3000:]
    who, returns, frames = video(run, tmp_path / "ttt.gif")
    assert set(who.split(", ")) == {"main", "random"}
    assert [sorted(r) for r in returns] == [["main", "random"]] * 2
    for episode in returns:  # a game is won, lost or drawn: its two scores sum to 0
        assert episode["main"] + episode["random"] == 0, returns
    assert 2 * 6 <= frames <= 2 * 10  # a reset's frame and 5 to 9 moves per game

    import troupe as api

    first, again = (api.evaluate(run, episodes=12, envs=2) for _ in range(2))
    assert first.results == again.results  # the random opponent's draws are seeded: a replay
    scripted = api.load_policy(run, policy="random")  # plays as it is built: nothing saved
    assert scripted.name == "random" and scripted.version == 0
    with pytest.raises(UserError, match="plays past versions of 'main'"):
        api.load_policy(run, policy="past")


def test_agents_with_policies_of_their_own_are_each_played_by_theirs(tmp_path):
    run = tmp_path / "gather"
    trained = troupe("run", "gather-2p-ppo", "stop.env_frames=3000", "--run-dir", str(run),
                     "--no-display", cwd=tmp_path)  # fmt: skip
    assert trained.returncode == 0, (trained.stdout + trained.stderr)[-3000:]
    who, returns, frames = video(run, tmp_path / "gather.gif")
    assert who == "red, blue"
    assert [sorted(r) for r in returns] == [["blue", "red"]] * 2
    assert frames > 2


def test_one_policy_of_a_run_without_seats_plays_every_agent():
    """KnightsArchersZombies trains one policy for its four agents (no ``agent_policies``):
    it plays every seat."""
    from types import SimpleNamespace

    from api.config import make_experiment
    from distributed.video import Seating

    played = SimpleNamespace(name="default", config=make_experiment("cartpole-ppo"))
    assert not played.config.agent_policies and not played.config.policy_mapping.type
    assert Seating("unused", played, 4).of(0) == [played] * 4


def test_a_self_play_opponent_without_an_evaluation_mapping_plays_the_learners_version(
    monkeypatch,
):
    """A self-play run written without an evaluation mapping is filmed with its training
    mapping, which seats the frozen opponent: ``load_policy`` refuses it (it has no parameters
    of its own), and the video failed with that. The learner's version plays its seat, under
    the opponent's name."""
    import dataclasses
    from types import SimpleNamespace

    import distributed.api
    from api.config import ComponentConfig, make_experiment
    from distributed.video import Seating

    config = make_experiment("connect4-selfplay")
    config.evaluation = dataclasses.replace(config.evaluation, policy_mapping=ComponentConfig())
    loads: list[str] = []

    def load_policy(target, policy):
        loads.append(policy)
        return SimpleNamespace(name=policy, config=config, policy=f"{policy}'s network")

    monkeypatch.setattr(distributed.api, "load_policy", load_policy)
    seating = Seating("run", load_policy("run", "main"), 2)
    seats = [seat for episode in range(40) for seat in seating.of(episode)]
    past = next(seat for seat in seats if seat.name == "past")
    assert past.policy == "main's network" and loads == ["main"]
