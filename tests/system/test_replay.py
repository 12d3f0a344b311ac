"""The replay buffer's parts: sum tree, rate limiter, n-step sampling, priorities, checkpoints."""

import numpy as np
import pytest

from api.errors import ConfigError
from api.namedarray import NamedArray
from api.policy import SampleBatch
from system.replay.buffer import ReplayBuffer, ReplayConfig
from system.replay.rate_limiter import RateLimiter, RateLimiterConfig
from system.replay.sum_tree import SumTree

# ------------------------------------------------------------------------------ sum tree


def test_sum_tree_finds_what_a_cumulative_sum_finds():
    rng = np.random.default_rng(0)
    tree = SumTree(37)  # not a power of two
    priorities = rng.random(37) * (rng.random(37) < 0.7)  # some zeros
    tree.update(np.arange(37), priorities)
    assert tree.total == pytest.approx(priorities.sum())
    values = rng.random(500) * priorities.sum()
    expected = np.searchsorted(np.cumsum(priorities), values, side="right")
    assert tree.find(values).tolist() == expected.tolist()
    assert np.all(priorities[tree.find(values)] > 0)


def test_sum_tree_updates_batches_with_repeated_items():
    tree = SumTree(8)
    tree.update(np.arange(8), np.ones(8))
    tree.update(np.array([3, 5, 3]), np.array([10.0, 0.0, 4.0]))  # the last 3 wins
    assert tree.get(np.array([3, 5])).tolist() == [4.0, 0.0]
    assert tree.total == pytest.approx(6 + 4.0)
    with pytest.raises(IndexError, match=r"\[0, 8\)"):
        tree.update(np.array([8]), np.array([1.0]))
    with pytest.raises(ValueError, match="non-negative"):
        tree.update(np.array([1]), np.array([-1.0]))


def test_sum_tree_samples_in_proportion_to_priority():
    tree = SumTree(4)
    tree.update(np.arange(4), np.array([1.0, 0.0, 3.0, 6.0]))
    rng = np.random.default_rng(1)
    counts = np.bincount(tree.sample(20_000, rng), minlength=4) / 20_000
    assert counts[1] == 0.0
    np.testing.assert_allclose(counts, [0.1, 0.0, 0.3, 0.6], atol=0.01)
    with pytest.raises(ValueError, match="all zero"):
        SumTree(3).sample(1, rng)


# ------------------------------------------------------------------------------ rate limiter


def test_sum_tree_samples_several_stratified_batches_in_one_search():
    tree = SumTree(64)
    tree.update(np.arange(64), np.ones(64))
    items = tree.sample(8, np.random.default_rng(0), batches=3).reshape(3, 8)
    # each batch has one draw from each eighth of the total, in order: items 8j .. 8j+7
    assert (items // 8 == np.arange(8)).all()
    assert len({tuple(row) for row in items}) == 3  # three draws, not one repeated


def test_several_batches_sampled_at_once_are_each_weighted_as_one():
    buffer = _buffer(capacity_frames=1000, prioritized=True, priority_exponent=1.0)
    buffer.insert(_segments(10, 4, done_p=0.0, truncated_p=0.0))
    keys = buffer.sample(36).key
    buffer.update_priorities(keys, np.linspace(0.1, 10.0, len(keys)))
    sampled = buffer.limiter.sampled
    batch = buffer.sample(12, batches=3)
    assert len(batch.key) == 36 and buffer.limiter.sampled == sampled + 36
    # every batch is normalised by its own largest weight
    assert batch.weight.reshape(3, 12).max(axis=1).tolist() == [1.0, 1.0, 1.0]


def test_rate_limiter_waits_for_min_size_then_keeps_the_ratio():
    limiter = RateLimiter(RateLimiterConfig(min_size=100, samples_per_insert=2.0, tolerance=64))
    assert not limiter.can_sample(32, size=99)
    limiter.record_insert(100)
    # at min_size the sampler may run `tolerance` ahead of the ratio, then must wait
    sampled = 0
    while limiter.can_sample(32, size=100):
        limiter.record_sample(32)
        sampled += 32
    assert sampled == 64
    # ... and the inserter may run `tolerance` ahead of the sampler
    assert limiter.can_insert(32)
    limiter.record_insert(33)
    assert not limiter.can_insert(32)
    limiter.record_insert(50)  # 100 more samples are owed now
    assert limiter.can_sample(32, size=183)


def test_rate_limiter_without_a_ratio_only_waits_for_min_size():
    limiter = RateLimiter(RateLimiterConfig(min_size=10))
    assert not limiter.can_sample(1000, size=9) and limiter.can_sample(1000, size=10)
    assert limiter.can_insert(10**9)


def test_rate_limiter_refuses_a_request_that_could_never_fit():
    limiter = RateLimiter(RateLimiterConfig(min_size=1, samples_per_insert=1.0, tolerance=10))
    limiter.record_insert(100)
    with pytest.raises(ValueError, match=r"Raise policies\.<policy>\.replay\.tolerance to at"):
        limiter.can_sample(64, size=100)
    with pytest.raises(ValueError, match="samples_per_insert must be positive"):
        RateLimiter(RateLimiterConfig(samples_per_insert=0.0))


def test_a_default_tolerance_widens_to_fit_an_insert_of_many_agents():
    """The default counts one agent per environment; a 4-agent game's chunk of segments did not
    fit it, and the replay worker failed in a loop on default settings."""
    limiter = RateLimiter(
        RateLimiterConfig(min_size=1, samples_per_insert=1.0, tolerance=10, fitted=True)
    )
    assert limiter.can_insert(64)  # 64 > 10: widened, not refused
    assert limiter.config.tolerance == 64
    limiter.record_insert(64)
    assert limiter.can_sample(64, size=64)


@pytest.mark.parametrize("agents", [1, 2, 3])
def test_a_default_tolerance_lets_inserts_reach_min_size_and_both_sides_go_on(agents):
    """pendulum-sac's settings (min_size 1000, 128 samples a frame, a default tolerance for one
    agent's 16-frame chunks) on a game of two agents sharing the policy: chunks of 32 frames
    stopped at 992 frames, below min_size, so nothing was sampled and nothing inserted again:
    the run stalled at 528 frames for good."""
    chunk, message = 16 * agents, 128
    limiter = RateLimiter(
        RateLimiterConfig(min_size=1000, samples_per_insert=128.0, tolerance=16 * 128.0,
                          fitted=True)
    )  # fmt: skip
    for _ in range(2000):  # actors insert and the trainer samples, each whenever it may
        moved = False
        if limiter.can_insert(chunk):
            limiter.record_insert(chunk)
            moved = True
        if limiter.can_sample(message, size=limiter.inserted):
            limiter.record_sample(message)
            moved = True
        assert moved, (limiter.inserted, limiter.sampled, limiter.config.tolerance)
    assert limiter.inserted > 1000 and limiter.sampled > 0


# ------------------------------------------------------------------------------ the buffer


def _segments(steps, batch, seed=0, done_p=0.15, truncated_p=0.1, start=0):
    """``[steps, batch]`` segments whose obs and actions number the steps (to find them again)."""
    rng = np.random.default_rng(seed)
    shape = (steps, batch, 1)
    ids = start + np.arange(steps * batch).reshape(steps, batch)
    done = rng.random(shape) < done_p
    return SampleBatch(
        obs=np.stack([ids, -ids], axis=-1).astype(np.float32),
        action=ids.astype(np.int64),
        reward=rng.normal(size=shape).astype(np.float32),
        done=done,
        truncated=~done & (rng.random(shape) < truncated_p),
        on_reset=np.zeros(shape, dtype=bool),
        policy_version=np.full(shape, 7, dtype=np.int64),
    )


def _reference_n_step(seg, t, n, gamma):
    """Reward sum, discount and bootstrap step of the transition at ``t`` of one segment."""
    total, scale, k = 0.0, 1.0, t
    for step in range(t + 1, min(t + n, len(seg.reward) - 1) + 1):
        total += scale * float(seg.reward[step, 0])
        scale *= gamma
        k = step
        if seg.done[step, 0]:
            return total, 0.0, k
        if seg.truncated[step, 0]:
            break
    return total, scale, k


def _buffer(**kwargs):
    kwargs.setdefault("rate_limit", RateLimiterConfig(min_size=1))
    return ReplayBuffer(ReplayConfig(seed=0, **kwargs))


@pytest.mark.parametrize("n_step", [1, 3])
def test_sampled_transitions_carry_their_n_step_returns(n_step):
    segments = _segments(steps=10, batch=6, seed=n_step)
    buffer = _buffer(capacity_frames=1000, n_step=n_step, gamma=0.9)
    assert buffer.insert(segments) == 9 * 6 and buffer.size == 54
    batch = buffer.sample(300)
    seen = set()
    for i, ident in enumerate(batch.action):
        t, b = divmod(int(ident), 6)
        seg = segments[:, b]
        assert t < 9 and not seg.done[t, 0] and not seg.truncated[t, 0]
        total, discount, k = _reference_n_step(seg, t, n_step, 0.9)
        assert batch.reward[i, 0] == pytest.approx(total, abs=1e-5)
        assert batch.discount[i, 0] == pytest.approx(discount, abs=1e-6)
        assert batch.next_obs[i, 0] == seg.obs[k, 0]
        assert batch.obs[i, 0] == seg.obs[t, 0] and batch.policy_version[i, 0] == 7
        seen.add((t, b))
    valid = ~(segments.done | segments.truncated)[:-1, :, 0]
    assert len(seen) == int(valid.sum())  # every drawable transition was drawn, no other
    assert batch.weight.tolist() == [[1.0]] * 300


def test_capacity_overwrites_the_oldest_segments():
    buffer = _buffer(capacity_frames=4 * 9)
    for i in range(5):
        buffer.insert(_segments(10, 2, seed=i, start=1000 * i))
    assert buffer.size == 36
    drawn = buffer.sample(500).action
    assert drawn.min() >= 3000  # the first 1.5 inserts are gone
    one = _buffer(capacity_frames=9)  # one segment: of three inserted at once, the last stays
    one.insert(_segments(10, 3, done_p=0.0, truncated_p=0.0))
    assert set(one.sample(50).action % 3) == {2} and one.size == 9
    # a config error (fatal): a restarted replay worker would meet the same segments
    with pytest.raises(ConfigError, match="segments of 4 frames came to a replay buffer that "
                       "holds segments of 9"):  # fmt: skip
        buffer.insert(_segments(5, 2))
    with pytest.raises(ValueError, match="raise capacity_frames"):
        _buffer(capacity_frames=5).insert(_segments(10, 1))


def test_the_count_of_drawable_transitions_follows_overwrites_and_a_reload():
    """``transitions`` is kept by insert (not summed per sample): it must stay the number of
    drawable steps as segments are overwritten, and come back with a loaded state."""
    buffer = _buffer(capacity_frames=5 * 9)
    for i in range(9):
        buffer.insert(_segments(10, 1 + i % 3, seed=i))
        assert buffer.transitions == int(buffer.state_dict()["valid"].sum()) > 0
    copy = _buffer(capacity_frames=5 * 9)
    copy.load_state_dict(buffer.state_dict())
    assert copy.transitions == buffer.transitions


def test_sampling_respects_the_rate_limiter():
    buffer = _buffer(
        capacity_frames=1000,
        rate_limit=RateLimiterConfig(min_size=50, samples_per_insert=1.0, tolerance=40),
    )
    buffer.insert(_segments(10, 4))  # 36 frames
    assert not buffer.can_sample(8)
    with pytest.raises(RuntimeError, match="check can_sample"):
        buffer.sample(8)
    buffer.insert(_segments(10, 4, seed=1))
    assert buffer.can_sample(8)


def test_priorities_steer_sampling_and_weights_undo_the_bias():
    buffer = _buffer(capacity_frames=1000, prioritized=True, priority_exponent=1.0)
    buffer.insert(_segments(10, 4, done_p=0.0, truncated_p=0.0))
    batch = buffer.sample(36)
    favourite = batch.key[0]
    others = batch.key[batch.key != favourite]
    assert buffer.update_priorities(others, np.full(len(others), 0.01)) == len(others)
    buffer.update_priorities([favourite], [100.0])
    again = buffer.sample(200)
    assert np.mean(again.key == favourite) > 0.5
    # the favourite is overrepresented, so it weighs least; weights are at most 1
    assert again.weight[again.key == favourite].max() < again.weight.max() == 1.0
    beta, n, p = buffer.beta, buffer.transitions, again.weight  # (N * P)^-beta, normalised
    # one segment in slot 0: a key (serial * T + t) is its item in the tree
    probability = buffer._tree.get(again.key) / buffer._tree.total
    raw = (n * probability) ** -beta
    np.testing.assert_allclose(p[:, 0], raw / raw.max(), rtol=1e-5)


def test_stale_keys_do_not_touch_new_segments():
    buffer = _buffer(capacity_frames=9, prioritized=True)  # room for one segment
    buffer.insert(_segments(10, 1, done_p=0.0, truncated_p=0.0))
    old_keys = buffer.sample(4).key
    buffer.insert(_segments(10, 1, seed=1, done_p=0.0, truncated_p=0.0))
    assert buffer.update_priorities(old_keys, np.full(4, 50.0)) == 0
    assert buffer.update_priorities(buffer.sample(4).key, np.ones(4)) == 4


def test_dict_observations_are_stored_per_key():
    segments = _segments(6, 3)
    segments.obs = NamedArray(pos=segments.obs, mask=segments.obs[..., :1] > 2)
    buffer = _buffer(capacity_frames=100)
    buffer.insert(segments)
    batch = buffer.sample(10)
    assert batch.obs.pos.shape == (10, 2) and batch.next_obs.mask.dtype == bool
    np.testing.assert_array_equal(batch.obs.pos[:, 0], batch.action)


def test_the_fields_actor_callbacks_add_reach_each_transition_at_its_step():
    """A segment's ``extras`` (actor callbacks' ``segment_fields``) reached on-policy trainers
    only: a DQN or SAC trainer's callback found no ``extras`` in its batch."""
    segments = _segments(6, 3)
    segments.extras = NamedArray(bonus=segments.obs[..., :1] * 10, flag=segments.done.copy())
    buffer = _buffer(capacity_frames=100)
    buffer.insert(segments)
    batch = buffer.sample(10)
    assert batch.extras.bonus.shape == (10, 1) and batch.extras.flag.dtype == bool
    np.testing.assert_array_equal(batch.extras.bonus[:, 0], 10 * batch.action)  # its own step
    saved = buffer.state_dict()
    assert {"store/extras.bonus", "store/extras.flag"} <= set(saved)
    restored = _buffer(capacity_frames=100)
    restored.load_state_dict(saved)
    again = restored.sample(4)
    np.testing.assert_array_equal(again.extras.bonus[:, 0], 10 * again.action)


def test_segments_whose_extra_fields_differ_from_the_buffers_are_refused():
    """Transitions without the fields their trainer reads would be made up; a resumed buffer
    keeps its run's fields, as it keeps its segment length."""
    with_bonus = _segments(6, 3)
    with_bonus.extras = NamedArray(bonus=np.zeros((6, 3, 1), np.float32))
    buffer = _buffer(capacity_frames=100)
    buffer.insert(with_bonus)
    with pytest.raises(ConfigError, match=r"segments with the extra fields \[\] came to a "
                       r"replay buffer that holds \['bonus'\]"):  # fmt: skip
        buffer.insert(_segments(6, 3))
    plain = _buffer(capacity_frames=100)
    plain.insert(_segments(6, 3))
    assert plain.sample(4).extras is None
    with pytest.raises(ConfigError, match=r"\['bonus'\] came to a replay buffer that holds \[\]"):
        plain.insert(with_bonus)


def test_state_dict_is_plain_arrays_and_restores_the_buffer(tmp_path):
    config = dict(capacity_frames=60, prioritized=True, n_step=2)
    buffer = _buffer(**config)
    for i in range(3):
        buffer.insert(_segments(10, 3, seed=i, start=100 * i))
    batch = buffer.sample(16)
    buffer.update_priorities(batch.key, np.arange(16.0))
    np.savez(tmp_path / "replay.npz", **buffer.state_dict())
    with np.load(tmp_path / "replay.npz", allow_pickle=False) as saved:
        restored = _buffer(**config)
        restored.load_state_dict(dict(saved))
    for name, array in buffer.state_dict().items():
        np.testing.assert_array_equal(restored.state_dict()[name], array, err_msg=name)
    assert restored.size == buffer.size and restored.limiter.sampled == 16
    restored.insert(_segments(10, 1, seed=9, start=900))  # and it goes on
    assert restored.sample(8).obs.shape == (8, 2)


def test_a_buffer_saved_before_it_filled_is_written_at_the_size_it_holds():
    """A save wrote the whole preallocated storage: the 100k-frame Atari DQN buffer was a
    2.8 GB file after 7k frames. Only the filled slots are written now; a load gives back the
    buffer at its capacity, and it goes on filling and overwriting as before."""
    config = dict(capacity_frames=9 * 10, prioritized=True)  # 10 slots of 9 frames
    buffer = _buffer(**config)
    for i in range(3):
        buffer.insert(_segments(10, 1, seed=i, start=100 * i))
    state = buffer.state_dict()
    assert state["store/obs"].shape[0] == 3 and len(state["stamp"]) == 10
    restored = _buffer(**config)
    restored.load_state_dict(state)
    assert restored.size == buffer.size == 27 and restored._store["obs"].shape[0] == 10
    for name, array in state.items():
        np.testing.assert_array_equal(restored.state_dict()[name], array, err_msg=name)
    for i in range(3, 12):  # past the capacity: the oldest slots are overwritten
        restored.insert(_segments(10, 1, seed=i, start=100 * i))
    assert restored.size == 90 and restored.state_dict()["store/obs"].shape[0] == 10
    assert restored.sample(16).obs.shape == (16, 2)


@pytest.mark.parametrize("slots", [2, 4, 12])
def test_a_buffer_loaded_at_another_capacity_takes_the_new_one(slots):
    """``troupe run --resume DIR policies.P.replay.capacity_frames=N``: the resume said the
    change was made, and the buffer kept its saved capacity. Now it takes the new one, keeping
    the newest segments that fit, and inserts, samples and priorities go on."""
    config = dict(capacity_frames=9 * 6, prioritized=True)  # 6 slots of 9 frames
    buffer = _buffer(**config)
    for i in range(8):  # 8 segments into 6 slots: the first two are overwritten
        buffer.insert(_segments(10, 1, seed=i, start=100 * i, done_p=0.0, truncated_p=0.0))
    buffer.update_priorities([7 * 10 + 3], [50.0])  # key serial * T + t: the newest segment
    resized = _buffer(**{**config, "capacity_frames": 9 * slots})
    resized.load_state_dict(buffer.state_dict())
    kept = min(slots, 6)
    assert resized.size == 9 * kept and resized.transitions == 9 * kept
    assert resized._store["obs"].shape[0] == slots and resized.limiter.inserted == 72
    actions = resized.sample(400).action // 100  # which insert each sampled step came from
    assert set(np.unique(actions)) == set(range(8 - kept, 8))  # the newest that fit
    # its priority came along: the newest segment is now the last kept, numbered kept - 1
    raised = buffer._tree.get(np.array([(7 % 6) * 10 + 3]))
    assert resized._tree.get(np.array([(kept - 1) * 10 + 3])) == pytest.approx(raised)
    assert raised[0] == pytest.approx(50.0**0.6)
    for i in range(8, 8 + slots + 1):  # it fills and overwrites at its own capacity
        resized.insert(_segments(10, 1, seed=i, start=100 * i, done_p=0.0, truncated_p=0.0))
    assert resized.size == 9 * slots
    assert set(np.unique(resized.sample(400).action // 100)) == set(range(9, 9 + slots))


def test_a_buffer_larger_than_the_memory_left_is_refused_before_it_fills():
    """A capacity that cannot fit used to be taken (its pages are lazy) and the replay worker
    killed by the OOM killer once the buffer filled, hours in."""
    from api.errors import ConfigError
    from system.memory import available_bytes

    free = available_bytes()
    if free is None:
        pytest.skip("this platform does not say how much memory is left")
    frame = 2 * 4 + 8 + 4 + 1 + 1 + 8  # obs (2 float32), action, reward, done, truncated, version
    too_many = 2 * free // frame
    buffer = _buffer(capacity_frames=too_many)
    with pytest.raises(ConfigError, match=r"capacity_frames=\d+: the buffer \(obs \(2,\) float32 "
                       r"a frame\) needs [\d.]+ [GMk]B, and this process has"):  # fmt: skip
        buffer.insert(_segments(5, 2))
    assert buffer.size == 0
    small = _buffer(capacity_frames=1_000)
    small.insert(_segments(5, 2))
    assert small.size == 8


@pytest.mark.parametrize("capacity", [9 * 10, 9 * 40])  # as saved; resized at the resume
def test_a_resumed_buffer_is_refused_when_its_capacity_no_longer_fits(monkeypatch, capacity):
    """A buffer saved before it filled is laid out at its capacity again when it is loaded, and
    that was not checked against the memory left (only a new buffer's first insert was)."""
    import system.replay.buffer as buffer_module
    from api.errors import ConfigError

    buffer = _buffer(capacity_frames=9 * 10)
    buffer.insert(_segments(10, 2))
    state = buffer.state_dict()
    per_slot = 10 * (2 * 4 + 8 + 4 + 1 + 1 + 8 + 2 * 8 + 1)  # the fields, tree and flags
    monkeypatch.setattr(buffer_module, "available_bytes", lambda: 10 * per_slot - 1)
    with pytest.raises(ConfigError, match=r"capacity_frames=\d+: the buffer .* needs"):
        _buffer(capacity_frames=capacity).load_state_dict(state)
    monkeypatch.setattr(buffer_module, "available_bytes", lambda: 40 * per_slot * 2)
    restored = _buffer(capacity_frames=capacity)
    restored.load_state_dict(state)
    assert restored.size == 18 and restored._store["obs"].shape[0] == capacity // 9


def test_memory_left_is_the_machines_or_its_cgroups_whichever_is_smaller(tmp_path):
    from system.memory import available_bytes

    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: 6000000 kB\n")
    (proc / "self" / "cgroup").write_text("0::/docker/abc\n")
    assert available_bytes(proc, cgroup) == 6_000_000 * 1024  # no limit files: the machine's
    (cgroup / "docker").mkdir(parents=True)  # a limit set one level above the process's
    (cgroup / "docker" / "memory.max").write_text("2000000000\n")
    (cgroup / "docker" / "memory.current").write_text("500000000\n")
    assert available_bytes(proc, cgroup) == 1_500_000_000
    (cgroup / "docker" / "memory.max").write_text("max\n")
    assert available_bytes(proc, cgroup) == 6_000_000 * 1024
    (proc / "self" / "cgroup").write_text("4:memory:/job\n")  # cgroup v1
    (cgroup / "memory" / "job").mkdir(parents=True)
    (cgroup / "memory" / "job" / "memory.limit_in_bytes").write_text("1000000000\n")
    (cgroup / "memory" / "job" / "memory.usage_in_bytes").write_text("400000000\n")
    assert available_bytes(proc, cgroup) == 600_000_000
    assert available_bytes(tmp_path / "nowhere", tmp_path / "nowhere") is None


def test_only_a_tolerance_the_user_left_unset_fits_itself():
    from api.config import make_experiment
    from system.workers.replay_worker import buffer_config

    unset = buffer_config(make_experiment("cartpole-dqn"), "default").rate_limit
    given = make_experiment("cartpole-dqn", ["policies.default.replay.tolerance=5000"])
    assert unset.fitted and not buffer_config(given, "default").rate_limit.fitted
