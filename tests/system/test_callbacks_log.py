"""Issue 28, item 2: a controller-side callback logs its own numbers by returning them, and
an actor callback's ``Episode.log`` refuses what is not a finite number, naming it."""

from __future__ import annotations

import pytest

from api import registry
from api.config import ComponentConfig
from api.episode import Episode
from api.errors import UserError
from system.errors import CallbackError
from system.run.episodes import Callbacks, EpisodeRecord, EpisodeWindow


class _Counting:
    def __init__(self):
        self.evaluations = 0

    def on_evaluation(self, mean_return, episodes):
        self.evaluations += 1
        return {"evaluations": self.evaluations, "best_so_far": mean_return}


class _Wrong:
    def on_evaluation(self, mean_return, episodes):
        return {"verdict": "good"}


@pytest.fixture
def registered():
    registry.register_callback("counting-t28", _Counting, override=True)
    registry.register_callback("wrong-t28", _Wrong, override=True)
    yield
    registry.callbacks.unregister("counting-t28")
    registry.callbacks.unregister("wrong-t28")


def test_what_a_controller_hook_returns_is_logged(registered):
    callbacks = Callbacks([ComponentConfig("counting-t28")])
    callbacks.on_evaluation(10.0, [])
    callbacks.on_evaluation(12.0, [])
    assert callbacks.logged == {"custom/evaluations": 2.0, "custom/best_so_far": 12.0}


class _PerPolicy:
    def on_train_result(self, policy, stats):
        return {"grad_steps": stats["steps"]}


def test_what_on_train_result_returns_is_logged_for_its_policy():
    registry.register_callback("per-policy-t28", _PerPolicy, override=True)
    try:
        callbacks = Callbacks([ComponentConfig("per-policy-t28")])
        callbacks.on_train_stats("main", {"steps": 3})
        callbacks.on_train_stats("past", {"steps": 1})
    finally:
        registry.callbacks.unregister("per-policy-t28")
    assert callbacks.logged == {
        "policy/main/custom/grad_steps": 3.0,
        "policy/past/custom/grad_steps": 1.0,
    }


def test_a_hook_returning_what_is_no_number_is_named(registered):
    callbacks = Callbacks([ComponentConfig("wrong-t28")])
    with pytest.raises(CallbackError, match="returned verdict='good' from on_evaluation"):
        callbacks.on_evaluation(1.0, [])


def test_episode_log_takes_finite_numbers_under_plain_names():
    episode = Episode(
        "actor/0/1/0", env=None, env_index=1, actor="actor/0", evaluation=False,
        policies=["main", "past"],
    )  # fmt: skip
    episode.log("bonus", 2)
    episode.log("bonus", 0.5, policy="past")
    assert episode.logged == {"custom/bonus": 2.0, "policy/past/custom/bonus": 0.5}
    for name, value in (("a/b", 1.0), ("", 1.0), ("nan", float("nan"))):
        with pytest.raises(UserError):
            episode.log(name, value)
    with pytest.raises(UserError, match="no agent of this episode plays 'random'"):
        episode.log("bonus", 1.0, policy="random")


def test_custom_numbers_get_their_spread_in_each_record():
    window = EpisodeWindow(10)
    records = [{"custom/bonus": 1.0}, {"custom/bonus": 3.0}, {}]
    records += [{"policy/main/custom/bonus": 2.0}, {"policy/main/custom/bonus": 4.0}]
    window.extend(EpisodeRecord.from_wire({"episode_return": 5.0, **r}) for r in records)
    means = window.means()
    assert means["custom/bonus"] == 2.0
    assert (means["custom/bonus/min"], means["custom/bonus/max"]) == (1.0, 3.0)
    assert means["policy/main/custom/bonus"] == 3.0
    assert means["policy/main/custom/bonus/max"] == 4.0
    assert "episode_return/min" not in means
