import numpy as np
import pytest

from api import testing
from legacy.environment.memory_cue import MemoryCueEnvironment


def test_memory_cue_keeps_the_environment_contract():
    testing.test_environment("MemoryCue-v0", env_kwargs={"delay": 2})


def _episode(env, choose):
    """Play one episode; ``choose(cue_obs, obs)`` picks each action. Returns (return, length)."""
    first = env.reset()[0]
    result, total, length = first, 0.0, 0
    while not (result.done or result.truncated):
        result = env.step([choose(first.obs, result.obs)])[0]
        total += result.reward
        length += 1
    return total, length


def test_remembering_the_cue_scores_plus_one():
    env = MemoryCueEnvironment(delay=3, seed=0)
    for _ in range(20):
        total, length = _episode(env, lambda cue, obs: int(np.argmax(cue[:2])))
        assert total == 1.0 and length == 3 + 2


def test_a_memoryless_policy_is_at_chance():
    env = MemoryCueEnvironment(delay=3, seed=1)
    always_zero = [_episode(env, lambda cue, obs: 0)[0] for _ in range(2000)]
    assert abs(np.mean(always_zero)) < 0.1


def test_only_the_first_observation_shows_the_cue_and_only_the_last_the_query():
    env = MemoryCueEnvironment(delay=2, seed=0)
    seen = [env.reset()[0].obs]
    result = env.step([0])[0]
    while not result.done:
        seen.append(result.obs)
        result = env.step([0])[0]
    assert seen[0][:2].sum() == 1 and seen[0][2] == 0
    assert all(not o.any() for o in seen[1:-1])
    assert seen[-1].tolist() == [0.0, 0.0, 1.0]


def test_seed_makes_cues_reproducible():
    a, b = MemoryCueEnvironment(seed=5), MemoryCueEnvironment()
    b.seed(5)
    cues = lambda env: [env.reset()[0].obs.tolist() for _ in range(10)]  # noqa: E731
    assert cues(a) == cues(b)


def test_negative_delay_is_refused():
    with pytest.raises(ValueError, match="delay must be 0 or more"):
        MemoryCueEnvironment(delay=-1)
