"""Issue 14: a policy mapping chooses the policies of every episode in the actor; a self-play
opponent plays drawn past versions of its learner; the controller rates who beat whom."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from api.config import make_experiment
from api.config.league import SelfPlayConfig
from api.environment import Environment, StepResult
from api.errors import ConfigError
from api.global_state import GlobalState
from api.namedarray import NamedArray
from api.policy import RolloutResult
from system.run.coordination.ratings import Ratings
from system.run.episodes import EpisodeRecord
from system.streams.inference import InprocInferenceHub
from system.streams.samples import InprocSampleHub
from system.workers.actor_worker import ActorWorker
from system.workers.opponent_pool import SCORES_KEY, OpponentPool


class Duel(Environment):
    """Two agents, both act every step; after 2 steps the episode ends and agent 0 wins."""

    agent_count = 2
    observation_spaces = [gym.spaces.Box(0, 10, (1,), np.float32)] * 2
    action_spaces = [gym.spaces.Discrete(2)] * 2

    def reset(self):
        self.t = 0
        return [StepResult(np.zeros(1, np.float32)) for _ in range(2)]

    def step(self, actions):
        self.t += 1
        done = self.t >= 2
        rewards = (1.0, -1.0) if done else (0.0, 0.0)
        return [StepResult(np.full(1, self.t, np.float32), r, done) for r in rewards]


def _answer(hub: InprocInferenceHub, policy: str, version: int) -> list[int]:
    """Answer every request of ``policy``; the client ids (env * 1000 + agent) it served."""
    server, served = hub.server(policy), []
    for pending in server.gather(10_000, 0):
        n = pending.rows
        out = NamedArray(log_prob=np.zeros((n, 1), np.float32), value=np.zeros((n, 1), np.float32))
        served += pending.request.client_id[:, 0].tolist()
        server.reply(
            pending, RolloutResult(action=np.ones(n, np.int64), policy_output=out), version
        )
    return served


def _alternate(episode_id: int, agent: int, info: dict) -> str:
    """The learner ``a`` takes seat ``episode_id % 2``; frozen ``b`` the other."""
    return "a" if agent == episode_id % 2 else "b"


def _actor(
    samples, mapping=_alternate, policies=("a", "b")
) -> tuple[ActorWorker, InprocInferenceHub]:
    hub = InprocInferenceHub()
    actor = ActorWorker(
        "actor/0", lambda i: Duel(), 1, lambda a: "unused", hub.client("actor/0"), samples,
        segment_length=4, groups=1, policy_mapping=mapping, mapped_policies=list(policies),
        trained_policies=["a"],
    )  # fmt: skip
    return actor, hub


def test_the_mapping_seats_policies_afresh_every_episode():
    samples = InprocSampleHub()
    actor, hub = _actor(samples.producer())
    seats = []
    for _ in range(30):
        actor.poll()
        seats.append((tuple(_answer(hub, "a", 3)), tuple(_answer(hub, "b", 9))))
    played = {s for s in seats if s != ((), ())}
    # agent 0 (client id 0) and agent 1 (id 1) each played for both policies
    assert ((0,), (1,)) in played and ((1,), (0,)) in played
    episodes = actor.collect_stats()["episodes"]
    assert len(episodes) >= 4
    for e in episodes:  # agent 0 always wins; who sat there alternates
        (winner, winner_version, _), (loser, loser_version, _) = e["seats"]
        assert {winner, loser} == {"a", "b"}
        assert e[f"result/{winner}_vs_{loser}"] == 1.0 and e[f"result/{loser}_vs_{winner}"] == 0
        assert {winner: winner_version, loser: loser_version} == {"a": 3, "b": 9}
    assert {e["seats"][0][0] for e in episodes} == {"a", "b"}
    # only the trained policy's steps are recorded, from whichever seat it sat in
    assert set(samples.queues) == {"a"} and samples.queues["a"]


def test_a_mapping_naming_a_policy_the_actor_does_not_play_fails_with_its_name():
    with pytest.raises(ConfigError, match="gave 'c' to agent 0"):
        _actor(None, mapping=lambda e, a, info: "c")[0].poll()


def test_the_pool_keeps_every_kth_version_and_draws_by_its_rule():
    pool = OpponentPool(snapshot_every=5, size=3, sampling="uniform", seed=0)
    kept = [v for v in range(1, 30) if pool.offer(v, {"w": np.full(2, float(v))}) is not None]
    assert kept == [1, 6, 11, 16, 21, 26]
    assert list(pool.snapshots) == [16, 21, 26]  # the oldest left
    draws = {pool.draw()[0] for _ in range(200)}
    assert draws == {16, 21, 26}
    heavy = OpponentPool(1, 10, "latest-heavy", seed=0)
    for v in range(10):
        heavy.offer(v, {})
    newest = sum(heavy.draw()[0] == 9 for _ in range(1000))
    assert 500 < newest < 620  # half the time the newest, plus its share of the uniform half
    hard = OpponentPool(1, 10, "prioritized", seed=0)
    for v in range(2):
        hard.offer(v, {})
    picks = [hard.draw({0: 1.0, 1: 0.0})[0] for _ in range(500)]
    assert picks.count(1) > 495  # the learner always beats version 0: it is (almost) never drawn


def test_a_snapshot_owns_its_arrays():
    pool = OpponentPool(1, 2, "uniform")
    pushed = {"layer": np.zeros(3)}
    pool.offer(1, pushed)
    pushed["layer"][:] = 5.0  # the pushed buffer is reused or unmapped after the push
    assert pool.draw()[1]["layer"].tolist() == [0.0, 0.0, 0.0]


class _State(GlobalState):
    def __init__(self):
        self.values = {}

    def get(self, key):
        return self.values.get(key, (None, 0))

    def items(self):
        return dict(self.values)

    def set(self, key, value):
        self.values[key] = (value, self.values.get(key, (None, 0))[1] + 1)
        return self.values[key][1]

    def compare_and_set(self, key, value, expected_version):
        raise NotImplementedError


def test_ratings_rank_players_and_score_the_learner_against_each_snapshot(tmp_path):
    config = make_experiment("connect4-selfplay")
    state = _State()
    ratings = Ratings(config, tmp_path, state)
    games = (
        [{"seats": [["main", 40, 1.0], ["past", 10, -1.0]]}] * 30
        + [{"seats": [["past", 35, 1.0], ["main", 40, -1.0]]}] * 10
        + [{"seats": [["main", 40, 1.0], ["random", 0, -1.0]]}] * 20
        + [{"seats": [["main", 40, 0.0], ["main", 40, 0.0]]}]  # mirror play: not a game
    )
    ratings.on_episodes([EpisodeRecord.from_wire({"episode_return": 0.0, **g}) for g in games])
    record = ratings.on_record()
    table = {row["name"]: row for row in ratings.table()}
    assert set(table) == {"main", "main@10", "main@35", "random"}
    assert table["main"]["games"] == 60 and table["main"]["wins"] == 50
    assert table["main@35"]["wins"] == 10 and table["main"]["rating"] > table["random"]["rating"]
    assert record["rating/main"] == pytest.approx(table["main"]["rating"], abs=0.1)
    assert "rating/main@10" not in record
    assert state.get(SCORES_KEY)[0] == {"10": 1.0, "35": 0.0}
    assert (tmp_path / "ratings.json").exists()
    (tmp_path / "ratings.json").unlink()
    # nothing new: nothing written, and the next record has the ratings all the same (the
    # last one of a run is what `troupe status` shows)
    assert ratings.on_record() == record and not (tmp_path / "ratings.json").exists()


def test_a_resumed_run_goes_on_with_its_ratings_and_scores(tmp_path, caplog):
    config = make_experiment("connect4-selfplay")
    state = _State()
    first = Ratings(config, tmp_path, state)
    games = [{"seats": [["main", 40, 1.0], ["past", 10, -1.0]]}] * 3 + [
        {"seats": [["past", 10, 1.0], ["main", 40, -1.0]]}
    ]
    first.on_episodes([EpisodeRecord.from_wire({"episode_return": 0.0, **g}) for g in games])
    first.on_record()
    before = {row["name"]: row for row in first.table()}

    resumed = Ratings(config, tmp_path, state)  # the controller of `troupe run --resume`
    assert {row["name"]: row for row in resumed.table()} == before
    assert resumed.on_record()["rating/main"] == pytest.approx(before["main"]["rating"])
    more = [{"seats": [["past", 10, 1.0], ["main", 40, -1.0]]}] * 4
    resumed.on_episodes([EpisodeRecord.from_wire({"episode_return": 0.0, **g}) for g in more])
    resumed.on_record()
    table = {row["name"]: row for row in resumed.table()}
    assert table["main"]["games"] == 8 and table["main"]["wins"] == 3
    assert state.get(SCORES_KEY)[0] == {"10": 3 / 8}  # weighed by all 8 games, not the last 4

    (tmp_path / "ratings.json").write_text('[{"name": "main", "rating": "high"}]')
    odd = _State()
    odd.set(SCORES_KEY, {"10": 0.5, "11": "x"})
    odd.set("selfplay/score_games", {"10": "many", "11": 3})
    fresh = Ratings(config, tmp_path, odd)
    assert fresh.table() == [] and fresh.scores == {}  # nothing odd is taken for a count
    assert "ratings.json is unreadable, the ratings start afresh" in caplog.text


def test_selfplay_config_errors_name_the_key():
    bad = [
        "selfplay.learner=main", "selfplay.opponent=heuristic", "selfplay.sampling=best",
        "selfplay.pool_size=0",
    ]  # fmt: skip
    with pytest.raises(ConfigError) as e:
        make_experiment("connect4-selfplay", bad)
    text = str(e.value)
    assert "policies.heuristic.policy: must be the learner's" in text
    choices = "one of 'uniform', 'latest-heavy', 'prioritized'"
    assert f"selfplay.sampling: must be {choices}, got 'best'" in text
    assert "selfplay.snapshot_every and selfplay.pool_size: must be at least 1" in text


def test_a_mapping_with_an_unknown_policy_is_a_config_error():
    with pytest.raises(ConfigError, match="the mapping returned 'ghost'"):
        make_experiment("connect4-selfplay", ['policy_mapping.args.opponents={"ghost": 1.0}'])
    with pytest.raises(ConfigError, match="agent_policies: leave empty with policy_mapping"):
        make_experiment("connect4-selfplay", ['agent_policies=["main", "past"]'])


def test_the_pool_follows_the_config():
    sp = SelfPlayConfig(learner="main", opponent="past", snapshot_every=2, pool_size=4)
    pool = OpponentPool(sp.snapshot_every, sp.pool_size, sp.sampling)
    assert [v for v in range(10) if pool.offer(v, {}) is not None] == [0, 2, 4, 6, 8]
    assert len(pool) == 4


def test_each_snapshot_takes_the_place_of_the_one_it_pushes_out():
    pool = OpponentPool(1, 3, "uniform")
    assert [pool.offer(v, {}) for v in range(5)] == [0, 1, 2, 0, 1]  # 3 then 4 replace 0, 1
    restored = OpponentPool(1, 3, "uniform")
    restored.restore({2: (2, {}), 0: (3, {}), 1: (4, {})})
    assert list(restored.snapshots) == [2, 3, 4]
    assert restored.offer(4, {}) is None and restored.offer(5, {}) == 2  # after 4's, in 2's
    smaller = OpponentPool(1, 2, "uniform")  # a pool of 3 places resumed with pool_size=2
    smaller.restore({2: (2, {}), 0: (3, {}), 1: (4, {})})
    assert list(smaller.snapshots) == [3, 4] and smaller.offer(5, {}) == 0


def _opponent_worker(store, config, spaces, seed=0):
    from system.parameters.inproc import InprocParameterService
    from system.run import builders
    from system.workers.opponent_pool import OpponentPolicyWorker

    policy = builders.make_policy(config, "past", spaces, seed)
    server = InprocInferenceHub().server("past")
    params = InprocParameterService(store)
    return OpponentPolicyWorker("policy/past/0", "past", policy, server, params, config.selfplay)


def test_a_restarted_or_resumed_opponent_plays_the_same_past_versions(tmp_path):
    """Issue 14's pool outlives its worker: the snapshots are tagged at the service, which keeps
    them (and their files) for a restarted worker and for a resumed run's."""
    from system.parameters.inproc import InprocParameterService
    from system.parameters.store import ParameterStore
    from system.run import builders

    config = make_experiment("connect4-selfplay", ["selfplay.snapshot_every=2",
                                                   "selfplay.pool_size=3"])  # fmt: skip
    spaces = builders.probe_spaces(config)
    learner = builders.make_policy(config, "main", spaces, 1)
    store = ParameterStore(tmp_path, keep=2, durable=True, keep_files=1)
    trainer = InprocParameterService(store)
    worker = _opponent_worker(store, config, spaces)
    for version in range(10):
        checkpoint = learner.get_checkpoint()
        checkpoint["version"] = version
        trainer.publish("main", version, checkpoint, persist=version % 5 == 4)
        worker.offer(*worker.params.poll_latest("main"))
    assert list(worker.pool.snapshots) == [4, 6, 8]
    assert "pool_untagged" not in worker.stats

    restarted = _opponent_worker(store, config, spaces, seed=3)
    assert restarted.restore_pool() == 3
    assert list(restarted.pool.snapshots) == [4, 6, 8]
    drawn = {restarted.pool.draw()[0] for _ in range(50)}
    assert drawn == {4, 6, 8}
    restarted.pool.draw = lambda scores=None: (6, restarted.pool.snapshots[6])
    restarted._update_parameters()
    assert restarted.policy.version == 6  # the drawn past version, loaded from the service

    resumed = ParameterStore(tmp_path, keep=2, durable=True, keep_files=1)
    resumed.load_from_disk()  # what the parameter service of `troupe run --resume` does
    again = _opponent_worker(resumed, config, spaces)
    assert again.restore_pool() == 3 and list(again.pool.snapshots) == [4, 6, 8]
    config.selfplay.pool_size = 2  # `troupe run --resume RUN selfplay.pool_size=2`
    fewer = _opponent_worker(resumed, config, spaces)
    assert fewer.restore_pool() == 2 and list(fewer.pool.snapshots) == [6, 8]
    kept_files = sorted(f.name for f in (tmp_path / "checkpoints" / "main").glob("v*.ckpt"))
    assert kept_files == ["v00000004.ckpt", "v00000006.ckpt", "v00000008.ckpt",
                          "v00000009.ckpt"]  # fmt: skip


def test_a_snapshot_the_service_let_go_stays_in_the_pool_and_is_counted(tmp_path):
    from system.parameters.inproc import InprocParameterService
    from system.parameters.store import ParameterStore
    from system.run import builders

    config = make_experiment("connect4-selfplay")
    spaces = builders.probe_spaces(config)
    store = ParameterStore(keep=1)
    checkpoint = builders.make_policy(config, "main", spaces, 1).get_checkpoint()
    InprocParameterService(store).publish("main", 0, checkpoint)
    worker = _opponent_worker(store, config, spaces)
    pushed = worker.params.poll_latest("main")
    InprocParameterService(store).publish("main", 1, checkpoint)  # 0 leaves the service
    worker.offer(*pushed)
    assert list(worker.pool.snapshots) == [0] and worker.stats["pool_untagged"] == 1
    assert _opponent_worker(store, config, spaces).restore_pool() == 0


def test_a_frozen_policy_starts_from_another_runs_checkpoint_file(tmp_path):
    from system.parameters.checkpoint_file import write_checkpoint
    from system.parameters.store import ParameterStore
    from system.run import builders
    from system.run.plan import PolicyWorkerPlan
    from system.run.serial import InprocWiring

    config = make_experiment("connect4-selfplay")
    trained = builders.make_policy(config, "main", builders.probe_spaces(config), seed=5)
    checkpoint = trained.get_checkpoint()
    checkpoint["version"] = 321  # as a run's trainer would have stamped it
    path = tmp_path / "v00000321.ckpt"
    with open(path, "wb") as f:
        write_checkpoint(f, {"policy": "main", "version": 321, "params": checkpoint})
    config = make_experiment("connect4-selfplay", [f"policies.past.checkpoint={path}"])
    config.selfplay = SelfPlayConfig()  # no pool: the file's weights are what it plays
    plan = PolicyWorkerPlan("policy/past/0", policy="past")
    built = builders.build(plan, config, InprocWiring(ParameterStore(), config))
    assert built.worker.policy.version == 321
    loaded = built.worker.policy.get_checkpoint()
    for name, value in checkpoint["model"].items():
        np.testing.assert_array_equal(np.asarray(loaded["model"][name]), np.asarray(value))


def test_a_checkpoint_for_a_trained_policy_or_a_missing_file_is_refused(tmp_path):
    with pytest.raises(ConfigError) as e:
        make_experiment(
            "connect4-selfplay",
            [f"policies.main.checkpoint={tmp_path}/v1.ckpt", "policies.past.checkpoint=/nope"],
        )
    assert "policies.main.checkpoint: only a frozen policy (no trainer)" in str(e.value)
    assert "policies.past.checkpoint: no file '/nope'" in str(e.value)


def test_random_moves_are_legal_and_leave_evaluation_rows_alone():
    from api.policy import RolloutRequest
    from system.workers.opponent_pool import RandomMoves

    class Column3:
        """Always plays column 3."""

        action_space = gym.spaces.Discrete(7)
        version = 4

        def rollout(self, request):
            return RolloutResult(action=np.full(len(request.on_reset), 3, np.int64))

    n = 4000
    mask = np.zeros((n, 7), np.int8)
    mask[:, [0, 5]] = 1  # only columns 0 and 5 are legal
    evaluation = np.zeros((n, 1), bool)
    evaluation[n // 2 :] = True
    request = RolloutRequest(
        obs=NamedArray(observation=np.zeros((n, 6, 7, 2), np.int8), action_mask=mask),
        policy_state=None,
        is_evaluation=evaluation,
        on_reset=np.zeros((n, 1), bool),
        client_id=np.zeros((n, 1), np.int64),
        request_id=np.zeros((n, 1), np.int64),
    )
    wrapped = RandomMoves(Column3(), p=0.25, seed=0)
    actions = wrapped.rollout(request).action
    training, greedy = actions[: n // 2], actions[n // 2 :]
    assert set(greedy.tolist()) == {3}  # evaluation rows: the policy's own move
    random = training[training != 3]
    assert set(random.tolist()) == {0, 5}  # only legal columns
    assert 0.2 < len(random) / len(training) < 0.3
    assert wrapped.version == 4  # everything else is the policy's
