"""Holding one version for evaluation while a target is confirmed (``system.run.stopping``):
the policy worker's side (evaluation requests answered by the held copy, training by the newest,
the held version tagged and written), the global-state order it follows, and the versions an
actor stamps on each episode."""

from __future__ import annotations

import logging

import numpy as np
from test_workers import CountingEnv, EchoPolicy, answer_all, eval_actor, request

from system.parameters.inproc import InprocParameterService
from system.parameters.store import ParameterStore
from system.run.coordination.evaluation_hold import HOLD_KEY, EvaluationHold
from system.run.coordination.state import StateStore
from system.streams.inference import InprocInferenceHub
from system.workers.policy_worker import EVAL_TAG, PolicyWorker


def evaluation_request(rows: int):
    r = request(rows, state=True)
    r.is_evaluation = np.ones((rows, 1), bool)
    return r


def worker_at_version_3(tmp_path, make_copy=EchoPolicy):
    hub, store = InprocInferenceHub(), ParameterStore(tmp_path)
    worker = PolicyWorker("w", "p", EchoPolicy(), hub.server("p"), InprocParameterService(store),
                          make_copy=make_copy)  # fmt: skip
    store.publish("p", 3, {"version": 3})
    worker.poll()
    return hub, store, worker


def test_evaluation_gets_the_held_version_and_training_the_newest(tmp_path):
    hub, store, worker = worker_at_version_3(tmp_path)
    assert worker.hold_evaluation(round_=1) == 3
    assert store.tags("p")[EVAL_TAG] == 3 and store.checkpoint_path("p", 3).exists()
    store.publish("p", 4, {"version": 4})
    hub.client("train").post("p", 0, 1, request(2, state=True))
    hub.client("eval").post("p", 0, 1, evaluation_request(3))
    assert worker.poll() == 5
    assert hub.replies["train"][0].version == 4 and hub.replies["eval"][0].version == 3
    stats = worker.collect_stats()
    assert (stats["held_version"], stats["held_round"]) == (3, 1)
    worker.release()
    hub.client("eval").post("p", 0, 2, evaluation_request(1))
    worker.poll()
    assert hub.replies["eval"][-1].version == 4
    assert "held_version" not in worker.collect_stats()


def test_a_worker_holds_the_version_the_order_names_and_one_file_is_kept(tmp_path):
    _, store, worker = worker_at_version_3(tmp_path)
    state = StateStore()
    follow = EvaluationHold(state, worker)
    state.set(HOLD_KEY, {"policy": "p", "round": 1})
    follow()  # holds 3, its own
    store.publish("p", 4, {"version": 4})
    store.tag("p", 4, EVAL_TAG)  # another worker held 4 first: the order names it
    state.set(HOLD_KEY, {"policy": "p", "round": 1, "version": 4})
    follow()
    assert worker.held.version == 4 and worker.policy.version == 3  # fetched, not loaded
    assert not store.checkpoint_path("p", 3).exists()  # written for the tag alone, let go
    assert store.checkpoint_path("p", 4).exists()
    state.set(HOLD_KEY, {"policy": "p", "round": 1, "version": 99})  # gone: one warning
    follow()
    follow()
    assert worker.held.version == 4 and follow.tried == (1, 99)


def test_a_persisted_version_keeps_its_file_when_the_tag_moves_on(tmp_path):
    store = ParameterStore(tmp_path)
    store.publish("p", 1, {"version": 1}, persist=True)
    store.tag("p", 1, EVAL_TAG)
    store.publish("p", 2, {"version": 2})
    store.tag("p", 2, EVAL_TAG)
    store.publish("p", 3, {"version": 3})
    store.tag("p", 3, EVAL_TAG)
    paths = [store.checkpoint_path("p", v).exists() for v in (1, 2, 3)]
    assert paths == [True, False, True]


def test_a_worker_without_a_copy_says_it_cannot_hold(tmp_path):
    _, _, worker = worker_at_version_3(tmp_path, make_copy=None)
    assert worker.hold_evaluation(round_=1) is None
    assert worker.collect_stats()["hold_unsupported"] == 1


def test_the_worker_follows_the_order_in_the_global_state(tmp_path):
    _, store, worker = worker_at_version_3(tmp_path)
    state = StateStore()
    follow = EvaluationHold(state, worker)
    state.set(HOLD_KEY, {"policy": "other", "round": 1})
    follow()
    assert worker.held is None  # another policy's order
    state.set(HOLD_KEY, {"policy": "p", "round": 1})
    follow()
    assert worker.held is not None and worker.held.version == 3
    store.publish("p", 5, {"version": 5})
    worker.poll()
    follow()  # the same round: still version 3
    assert worker.held.version == 3
    state.set(HOLD_KEY, {"policy": "p", "round": 2})  # a new candidate: what is loaded now
    follow()
    assert worker.held.version == 5 and worker.held_round == 2
    state.set(HOLD_KEY, None)
    follow()
    assert worker.held is None


def test_episodes_carry_the_first_and_last_version_that_played_them():
    hub = InprocInferenceHub()
    actor = eval_actor(hub, "a", lambda i: CountingEnv(length=3), 1)
    for version in (7, 7, 8, *[8] * 10):  # the first episode meets versions 7 and 8
        actor.poll()
        answer_all(hub, "p", version=version)
    records = actor.collect_stats()["eval_episodes"]
    assert [r["versions"] for r in records[:2]] == [{"p": [7, 8]}, {"p": [8, 8]}]


def test_a_restarted_worker_takes_the_named_version_and_tags_nothing_else(tmp_path):
    _, store, worker = worker_at_version_3(tmp_path)
    store.tag("p", 3, "eval-1")  # the worker beside it holds 3
    store.publish("p", 4, {"version": 4})
    worker.poll()  # this (new) process has 4 loaded
    state = StateStore()
    state.set(HOLD_KEY, {"policy": "p", "round": 7, "version": 3})
    EvaluationHold(state, worker)()
    assert worker.held.version == 3 and worker.held_round == 7
    assert store.tags("p")[EVAL_TAG] == 3 and not store.checkpoint_path("p", 4).exists()


def test_a_round_holds_the_version_its_order_names_or_what_is_loaded_if_that_is_gone(
    tmp_path, caplog
):
    """The controller names the trainer's newest version when a round opens: a worker that has
    not loaded it yet fetches it; one that cannot get it (the service let it go) holds its own,
    and says so, for the order to name that one instead."""
    _, store, worker = worker_at_version_3(tmp_path)
    store.publish("p", 4, {"version": 4})  # published; not pushed to this worker yet
    state = StateStore()
    follow = EvaluationHold(state, worker)
    state.set(HOLD_KEY, {"policy": "p", "round": 1, "version": 4})
    follow()
    assert worker.held.version == 4 and worker.policy.version == 3 and worker.held_round == 1
    assert store.tags("p")[EVAL_TAG] == 4
    state.set(HOLD_KEY, {"policy": "p", "round": 2, "version": 99})  # gone from the service
    with caplog.at_level(logging.INFO):
        follow()
        follow()  # tried once: no second fetch
    assert worker.held.version == 3 and worker.held_round == 2 and follow.tried == (2, 99)
    said = [r for r in caplog.records if "no version 99" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO]  # the designed way, not a warning
    stats = worker.collect_stats()
    assert (stats["held_version"], stats["held_round"]) == (3, 2)
