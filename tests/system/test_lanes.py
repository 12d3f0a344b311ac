"""A lane (system.workers.lanes): one policy's agents of an environment group as one batch, from
their results to a request, from its answer to recorded steps and finished segments."""

from __future__ import annotations

import numpy as np

from api.environment import StepResult
from api.namedarray import NamedArray
from api.policy import RolloutResult
from system.workers.lanes import Lane, Slot, matchups, nonfinite_rows, per_policy
from system.workers.trajectory import SegmentBuffer


def _result(obs: float, reward: float = 1.0) -> StepResult:
    return StepResult(obs=np.full(3, obs, np.float32), reward=reward, done=False, truncated=False)


def _lane(segment_length: int = 2) -> Lane:
    slots = [Slot(0, 0, "p"), Slot(0, 1, "q"), Slot(1, 0, "p")]
    return Lane("p", slots, SegmentBuffer(len(slots), segment_length))


def _answer(n: int) -> RolloutResult:
    return RolloutResult(
        action=np.arange(n, dtype=np.int64).reshape(n, 1),
        policy_output=NamedArray(log_prob=np.zeros((n, 1), np.float32)),
    )


def test_a_request_holds_only_the_lane_s_policy_agents_that_act():
    lane = _lane()
    for slot, value in zip(lane.slots, (1.0, 2.0, 3.0)):
        slot.result = _result(value)
    lane.slots[2].result = None  # waiting on its environment
    request = lane.build_request(seq=7)
    assert request is not None and list(lane.acting) == [0]  # slot 1 is q's
    assert request.obs.shape == (1, 3) and request.request_id[0, 0] == 7
    assert request.on_reset[0, 0] and request.client_id[0, 0] == 0
    lane.slots[0].result = None
    assert lane.build_request(seq=8) is None


def test_answers_are_recorded_until_a_segment_is_full():
    lane = _lane(segment_length=2)
    segments = None
    for step in range(3):  # a segment of 2 steps keeps 3 rows: the last bootstraps
        for slot in lane.slots:
            slot.result = _result(step)
        lane.build_request(seq=step)
        segments = lane.take_answer(_answer(len(lane.acting)), version=4 + step)
        if step < 2:
            assert segments is None
    assert segments is not None and segments.obs.shape[:2] == (3, 2)  # [T + 1, agents of p]
    assert segments.policy_version[:, 0, 0].tolist() == [4, 5, 6]
    assert [s.first_version for s in lane.slots] == [4, -1, 4]  # q's agent never acted here
    assert not lane.slots[0].on_reset and lane.slots[0].version == 6


def test_nonfinite_observations_and_rewards_are_found_by_row():
    lane = _lane()
    lane.slots[0].result = _result(np.nan)
    lane.slots[2].result = _result(0.0, reward=float("inf"))
    lane.build_request(seq=0)
    found = [(s.env, what) for s, what in lane.nonfinite_inputs()]
    assert found == [(0, "observation"), (1, "reward")]
    nested = NamedArray(a=np.array([[1.0], [np.inf]]), b=np.array([[0], [1]]))
    assert nonfinite_rows(nested).tolist() == [1]


def test_an_episode_says_each_policy_s_return_versions_and_who_won():
    a, b, c = Slot(0, 0, "p"), Slot(0, 1, "p"), Slot(0, 2, "q")
    a.episode_return, b.episode_return, c.episode_return = 1.0, 3.0, 1.0
    a.first_version, a.version, b.first_version, b.version = 2, 5, 3, 4
    record = per_policy([a, b, c])
    assert record["policy/p/episode_return"] == 2.0  # the mean over p's two agents
    assert record["versions"]["p"] == [2, 5]
    games = matchups([a, c])
    assert games["result/p_vs_q"] == 0.5 and games["seats"][1] == ["q", -1, 1.0]
