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
    assert "2 consecutive windows of 4 fresh episodes: 500, 480" in w.describe()


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


def test_every_window_judges_one_version_and_the_run_delivers_the_confirmed_one():
    w = EvaluationWindows(target=475.0, episodes=4, windows=2, policy="p")
    assert w.hold_order() is None  # nothing held before evaluation begins
    assert not held(w, [500.0], [3, 3])  # evaluation has begun: round 1
    assert w.hold_order() == {"policy": "p", "round": 1}
    assert not held(w, [500.0] * 4, [5, 5])  # no worker said what it holds yet: not counted
    w.on_worker_stats({"held_version": 6, "held_round": 1})
    assert w.hold_order() == {"policy": "p", "round": 1, "version": 6}  # all workers hold 6
    assert not held(w, [500.0] * 4, [5, 6])  # began before the hold
    assert not held(w, [500.0] * 4, [7, 7])  # another version
    assert not held(w, [500.0] * 4, [6, 6])  # a candidate: the same version again
    assert w.confirmed == [500.0] and w.round == 1
    assert not held(w, [490.0] * 3, [6, 6])
    assert held(w, [480.0], [6, 6])
    assert w.solved_version == 6 and w.confirmed == [500.0, 487.5]
    assert w.describe() == (
        "greedy mean return reached 475 in 2 windows of 4 fresh episodes played by version 6 "
        "alone (1 version judged in all): 500, 487.5"
    )


def test_a_round_names_the_trainer_s_newest_version_until_a_worker_says_what_it_holds():
    w = EvaluationWindows(target=475.0, episodes=2, windows=2, policy="p")
    w.on_trainer_version(7)
    held(w, [0.0], None)  # evaluation has begun: round 1 names the newest version
    assert w.hold_order() == {"policy": "p", "round": 1, "version": 7}
    w.on_trainer_version(8)  # training goes on: the open round keeps its version
    assert w.hold_order()["version"] == 7
    w.on_worker_stats({"held_version": 6, "held_round": 1})  # 7 was gone: it holds its own
    assert w.hold_order() == {"policy": "p", "round": 1, "version": 6}
    assert not held(w, [0.0, 0.0], [6, 6])  # falls short: the next round names 8
    assert w.hold_order() == {"policy": "p", "round": 2, "version": 8}


def test_a_version_that_falls_short_ends_its_round_and_the_next_one_is_judged():
    w = EvaluationWindows(target=475.0, episodes=2, windows=2, policy="p")
    held(w, [0.0], None)
    w.on_worker_stats({"held_version": 4, "held_round": 1})
    assert not held(w, [500.0, 100.0], [4, 4])
    assert w.hold_order() == {"policy": "p", "round": 2} and w.confirmed == []
    assert not held(w, [500.0] * 2, [4, 4])  # version 4's late episodes do not count
    w.on_worker_stats({"held_version": 4, "held_round": 1})  # a late report of round 1
    assert w.held_version is None
    w.on_worker_stats({"held_version": 9, "held_round": 2})
    assert not held(w, [500.0] * 2, [9, 9]) and w.confirmed == [500.0]
    assert not held(w, [500.0, 400.0], [9, 9])  # not confirmed: round 3
    assert w.round == 3 and w.confirmed == [] and len(w.judged) == 2
    assert w.figures() == {
        "eval/held_version": None,
        "eval/versions_judged": 2,
        "eval/judged_version": 9,
        "eval/judged_window_return": 450.0,
    }


def test_without_a_worker_that_can_hold_consecutive_windows_confirm():
    w = EvaluationWindows(target=1.0, episodes=2, windows=2, policy="p")
    held(w, [1.0], None)
    w.on_worker_stats({"hold_unsupported": 1})
    assert w.policy is None and w.hold_order() is None
    assert not held(w, [1.0] * 2, None)  # a candidate of fresh episodes
    assert not held(w, [1.0], None)
    assert held(w, [1.0], None) and w.solved_version is None


def test_a_hold_nobody_acts_on_times_out_and_one_nobody_plays_moves_on():
    clock = Clock()
    w = EvaluationWindows(target=1.0, episodes=2, windows=2, policy="p", hold_timeout_s=30,
                          clock=clock)  # fmt: skip
    held(w, [1.0], None)
    clock.now = 31.0
    assert not w.solved() and w.policy is None  # no worker held: judge any versions
    w = EvaluationWindows(target=1.0, episodes=2, windows=2, policy="p", hold_timeout_s=30,
                          clock=clock)  # fmt: skip
    held(w, [1.0], None)
    w.on_worker_stats({"held_version": 2, "held_round": 1})
    clock.now = 1000.0  # a long episode (Atari): time alone ends no round once one is held
    assert not held(w, [1.0] * 49, [3, 3]) and w.round == 1
    assert not held(w, [1.0], [3, 3]) and w.round == 2  # 50 in a row by others: hold another
    assert w.policy == "p"


def test_with_one_window_or_no_target_nothing_is_held():
    w = EvaluationWindows(target=1.0, episodes=2, windows=1, policy="p")
    assert held(w, [1.0] * 2, None) and w.policy is None and w.hold_order() is None
    w = EvaluationWindows(target=None, episodes=2, windows=2, policy="p")
    assert not held(w, [1.0] * 4, None) and w.hold_order() is None


def test_with_max_return_a_window_that_cannot_reach_the_target_ends_at_once():
    w = EvaluationWindows(target=0.8, episodes=10, windows=2, policy="p", max_return=1.0)
    held(w, [0.0], None)
    w.on_worker_stats({"held_version": 4, "held_round": 1})
    assert not held(w, [-1.0], [4, 4])  # (-1 + 9 wins) / 10 = 0.8 is still within reach
    assert not held(w, [1.0] * 5, [4, 4]) and w.round == 1
    assert not held(w, [0.0], [4, 4]) and w.round == 2  # a draw: at best 0.7, so version 4
    assert len(w.judged) == 1 and w.last_window == (4, 4 / 7)  # is done after 7 of 10 games
    w.on_worker_stats({"held_version": 5, "held_round": 2})
    assert not held(w, [1.0] * 10, [5, 5]) and w.confirmed == [1.0]  # a candidate
    assert not held(w, [-1.0], [5, 5]) and w.round == 2  # its confirmation: 0.8 is in reach
    assert not held(w, [-1.0], [5, 5])  # ...and now it is not
    assert w.round == 3 and w.confirmed == [] and len(w.judged) == 2
    w.on_worker_stats({"held_version": 5, "held_round": 3})  # no newer version yet: 5 again
    assert not held(w, [-1.0] * 2, [5, 5]) and w.round == 4
    assert len(w.judged) == 2 and w.figures()["eval/versions_judged"] == 2  # versions, not rounds
    plain = EvaluationWindows(target=0.8, episodes=10, windows=2, policy="p")  # no max_return
    held(plain, [0.0], None)
    plain.on_worker_stats({"held_version": 4, "held_round": 1})
    assert not held(plain, [-1.0] * 9, [4, 4]) and plain.round == 1  # played out
    assert not held(plain, [-1.0], [4, 4]) and plain.round == 2
