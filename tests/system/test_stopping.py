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


# ----------------------------------------------------------------- holding one version
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def held(windows: EvaluationWindows, returns: list[float], versions) -> bool:
    solved = False
    for r in returns:
        windows.add(r, versions)
        solved = windows.solved()
    return solved


def test_a_candidate_is_confirmed_only_by_episodes_its_held_version_played_whole():
    w = EvaluationWindows(target=475.0, episodes=4, windows=2, policy="p")
    assert not held(w, [500.0] * 4, [3, 5])  # a candidate, played by versions 3 to 5
    assert w.holding and w.hold_order() == {"policy": "p", "round": 1}
    assert not held(w, [500.0] * 4, [5, 5])  # no worker said what it holds yet: not counted
    w.on_worker_stats({"held_version": 6, "held_round": 1})
    assert not held(w, [500.0] * 4, [5, 6])  # began before the hold
    assert not held(w, [500.0] * 4, [7, 7])  # another version (a worker that holds none)
    assert not held(w, [490.0] * 3, [6, 6])
    assert held(w, [480.0], [6, 6])
    assert w.solved_version == 6 and w.confirmed == [500.0, 487.5]
    assert w.describe() == (
        "greedy mean return reached 475 in a window of 4 episodes, then in 1 window of 4 fresh "
        "episodes played by version 6 alone: 500.0, 487.5"
    )


def test_a_held_version_that_falls_short_is_released_and_a_fresh_window_is_needed():
    w = EvaluationWindows(target=475.0, episodes=2, windows=2, policy="p")
    held(w, [500.0] * 2, None)
    w.on_worker_stats({"held_version": 4, "held_round": 1})
    assert not held(w, [500.0, 100.0], [4, 4])
    assert not w.holding and w.hold_order() is None and w.confirmed == []
    assert not held(w, [500.0], [9, 9])  # the window still holds 100.0: no candidate
    assert not w.holding
    assert not held(w, [500.0], [9, 9])  # two fresh episodes at the target: round 2
    assert w.hold_order() == {"policy": "p", "round": 2}
    w.on_worker_stats({"held_version": 4, "held_round": 1})  # a late report of round 1
    assert w.held_version is None


def test_without_a_worker_that_can_hold_consecutive_windows_confirm():
    w = EvaluationWindows(target=1.0, episodes=2, windows=2, policy="p")
    held(w, [1.0] * 2, None)
    w.on_worker_stats({"hold_unsupported": 1})
    assert w.policy is None and not w.holding and w.confirmed == [1.0]  # still a candidate
    assert not held(w, [1.0], None)
    assert held(w, [1.0], None) and w.solved_version is None


def test_a_hold_nobody_acts_on_times_out_and_one_without_episodes_is_released():
    clock = Clock()
    w = EvaluationWindows(target=1.0, episodes=2, windows=2, policy="p", hold_timeout_s=30,
                          clock=clock)  # fmt: skip
    held(w, [1.0] * 2, None)
    clock.now = 31.0
    assert not w.solved() and w.policy is None  # no worker held: confirm without holding
    w = EvaluationWindows(target=1.0, episodes=2, windows=2, policy="p", hold_timeout_s=30,
                          clock=clock)  # fmt: skip
    held(w, [1.0] * 2, None)
    w.on_worker_stats({"held_version": 2, "held_round": 1})
    clock.now = 62.0
    assert not w.solved() and not w.holding and w.policy == "p"  # released, may hold again


def test_with_one_window_nothing_is_held():
    w = EvaluationWindows(target=1.0, episodes=2, windows=1, policy="p")
    assert held(w, [1.0] * 2, None) and w.policy is None and w.hold_order() is None
