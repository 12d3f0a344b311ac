"""The solved rule: a target reached in consecutive windows of fresh greedy episodes."""

from __future__ import annotations

from system.run.stopping import EvaluationWindows


def feed(windows: EvaluationWindows, returns: list[float]) -> bool:
    solved = False
    for r in returns:
        windows.add(r)
        solved = windows.solved()
    return solved


def test_one_lucky_window_is_not_enough():
    w = EvaluationWindows(target=475.0, episodes=4, windows=2)
    assert not feed(w, [500.0] * 4)  # a candidate
    assert w.confirmed == [500.0]
    assert not feed(w, [300.0] * 4)  # the next fresh window falls short: start over
    assert w.confirmed == []


def test_two_consecutive_windows_of_fresh_episodes_solve():
    w = EvaluationWindows(target=475.0, episodes=4, windows=2)
    assert not feed(w, [500.0] * 4)
    assert not feed(w, [480.0] * 3)  # the second window is not complete yet
    assert feed(w, [480.0])
    assert w.confirmed == [500.0, 480.0]  # the second window: episodes 5 to 8 only
    assert "2 consecutive windows of 4 fresh episodes: 500.0, 480.0" in w.describe()


def test_one_window_solves_at_once_when_asked():
    w = EvaluationWindows(target=10.0, episodes=2, windows=1)
    assert not feed(w, [10.0])
    assert feed(w, [12.0])
    assert "1 consecutive window of 2" in w.describe()
