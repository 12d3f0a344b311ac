"""api.testing.test_environment: built-ins pass; each broken environment fails with its rule."""

from __future__ import annotations

import re

import broken_envs
import pytest

from api import environment, registry, testing
from api.errors import EnvironmentCheckError, RegistryError, UserError


@pytest.mark.parametrize("name", ["CartPole-v1", "Pendulum-v1", "GridGather-v0"])
def test_builtin_environments_pass(name):
    report = testing.test_environment(name, steps=300)
    assert report.name == name
    assert report.steps == 300
    assert report.episodes >= 1
    assert report.determinism_steps >= 1
    assert f"{name}: passed" in str(report)


def test_memory_cue_passes():
    pytest.importorskip("legacy.environment.memory_cue")
    report = testing.test_environment("MemoryCue-v0", steps=300)
    assert report.episodes >= 1


def test_gridgather_report_shows_both_agents():
    report = testing.test_environment("GridGather-v0", env_kwargs={"n_agents": 3, "size": 6})
    assert report.agent_count == 3
    assert len(report.mean_returns()) == 3
    text = str(report)
    assert "agents             3" in text
    assert "agent 2:" in text and "action space       Discrete(5)" in text


def test_no_stepping_checks_reset_only():
    report = testing.test_environment("GridGather-v0", test_stepping=False)
    assert report.steps == 0 and not report.stepped
    assert "not checked (test_stepping=False)" in str(report)


def test_function_is_not_collected_by_pytest():
    assert testing.test_environment.__test__ is False


def test_a_user_environment_registered_by_name_passes():
    environment.register("test-user-coinflip", broken_envs.CoinFlipEnv, episode_length=7)
    try:
        report = testing.test_environment("test-user-coinflip", steps=50)
    finally:
        registry.environments.unregister("test-user-coinflip")
    assert report.steps == 50 and report.episodes == 7
    assert report.determinism_steps == 7
    assert report.observation_spaces == ["Box(0.0, 1.0, (3,), float32)"]


def test_an_instance_is_checked_and_left_open():
    env = broken_envs.DictObs()
    report = testing.test_environment(env, steps=20)
    assert report.name == "DictObs" and report.episodes == 4


def test_env_that_keeps_answering_done_after_the_end_passes():
    testing.test_environment(broken_envs.StaysDoneAfterEnd())


def test_long_episodes_are_noted_not_failed():
    report = testing.test_environment(broken_envs.CoinFlipEnv(episode_length=1000), steps=30)
    assert report.episodes == 0
    assert report.notes == [
        "no episode ended within 30 steps, so stepping after the end and reset after it were "
        "not checked; pass a larger steps= to check them"
    ]


# --------------------------------------------------------------------- broken environments
BROKEN = [
    (
        broken_envs.WrongObsShape,
        0,
        "obs",
        "[agent 0, field 'obs'] reset(): obs has shape (4,), expected (3,) as declared by "
        "observation_spaces[0]; return arrays of the declared shape or fix the space",
    ),
    (
        broken_envs.WrongObsDtype,
        0,
        "obs",
        "[agent 0, field 'obs'] reset(): obs has dtype float64, expected float32 as declared by "
        "observation_spaces[0]; cast with .astype(np.float32) or declare the space with "
        "dtype=np.float64",
    ),
    (
        broken_envs.ObsOutOfBounds,
        0,
        "obs",
        "[agent 0, field 'obs'] reset(): obs lies outside observation_spaces[0] = "
        "Box(0.0, 1.0, (3,), float32): values range from 2.0 to 2.0, bounds are low=0.0 high=1.0",
    ),
    (
        broken_envs.ObsNotAnArray,
        0,
        "obs",
        "[agent 0, field 'obs'] reset(): obs is a list, expected a numpy array of shape (3,) and "
        "dtype float32; return np.asarray(obs, dtype=np.float32)",
    ),
    (
        broken_envs.WrongAgentCount,
        None,
        "observation_spaces",
        "[field 'observation_spaces'] observation_spaces has 1 spaces but agent_count is 2; "
        "declare one space per agent",
    ),
    (
        broken_envs.WrongResultCount,
        None,
        "results",
        "[field 'results'] step 1 returned 2 results but agent_count is 1; return exactly one "
        "entry per agent (None for an agent that does not act)",
    ),
    (
        broken_envs.NonScalarReward,
        0,
        "reward",
        "[agent 0, field 'reward'] step 1: reward must be one number (a Python or numpy scalar, "
        "or an array of shape () or (1,)), got an array of shape (2,) and dtype float64; make "
        "a vector reward one number in the environment (a weighted sum)",
    ),
    (
        broken_envs.NanReward,
        0,
        "reward",
        "[agent 0, field 'reward'] step 1: reward is nan; rewards must be finite numbers",
    ),
    (
        broken_envs.IntDone,
        0,
        "done",
        "[agent 0, field 'done'] step 1: done must be a bool (Python or numpy), got int 0",
    ),
    (
        broken_envs.InfoNotDict,
        0,
        "info",
        "[agent 0, field 'info'] step 1: info must be a dict, got NoneType",
    ),
    (
        broken_envs.ResetGivesNothing,
        None,
        "results",
        "[field 'results'] reset() returned None for every agent; at least one agent must get a "
        "first observation",
    ),
    (
        broken_envs.ResultNotStepResult,
        0,
        None,
        "[agent 0] step 1 returned a tuple, expected an api.environment.StepResult or None",
    ),
    (
        broken_envs.StepsAfterDone,
        0,
        "done",
        "[agent 0, field 'done'] step() called after the episode ended at step 5, without "
        "reset(), returned a fresh result (done=False, truncated=False); the environment must "
        "refuse to step after the episode ended (raise an exception) and require reset(), or "
        "keep returning done/truncated results",
    ),
    (
        broken_envs.TwoAgentsRevived,
        0,
        "done",
        "[agent 0, field 'done'] step 2 returned a result with done=False and truncated=False "
        "for an agent that was already done or truncated in this episode; return None (or keep "
        "done=True) for agents that are out of the episode",
    ),
    (
        broken_envs.StepRaises,
        None,
        None,
        "step 3: StepRaises.step() raised ValueError: boom at step 3",
    ),
    (
        broken_envs.SeedRaises,
        None,
        None,
        "seed(0): SeedRaises.seed() raised NotImplementedError: no seeding here",
    ),
    (
        broken_envs.DictObsMissingKey,
        0,
        "obs",
        "[agent 0, field 'obs'] reset(): obs has keys ['hint'], but the Dict space declares "
        "['action_mask', 'hint'] (missing: ['action_mask'], undeclared: [])",
    ),
    (
        broken_envs.DictObsWrongLeafShape,
        0,
        "obs.action_mask",
        "[agent 0, field 'obs.action_mask'] reset(): obs.action_mask has shape (3,), expected "
        "(2,) as declared by observation_spaces[0]; return arrays of the declared shape or fix "
        "the space",
    ),
    (  # a run of it once waited forever: every policy worker dropped every request it got
        broken_envs.DictObsKeyNotAName,
        0,
        "obs",
        "[agent 0, field 'obs'] observation_spaces[0] is a Dict with the key 'coin-hint' (in "
        "obs), which cannot name a field of the observations sent to policy workers: use a "
        "Python identifier that does not start with '_' (e.g. 'agent_pos')",
    ),
    (
        broken_envs.NoFramesPerStep,
        None,
        "frames_per_step",
        "[field 'frames_per_step'] frames_per_step must be a whole number of 1 or more, got 0",
    ),
]


@pytest.mark.parametrize(
    "env_class, agent, field, message", BROKEN, ids=[b[0].__name__ for b in BROKEN]
)
def test_broken_environment_is_caught(env_class, agent, field, message):
    with pytest.raises(EnvironmentCheckError) as e:
        testing.test_environment(env_class())
    assert str(e.value) == message
    assert (e.value.agent, e.value.field) == (agent, field)


def test_the_report_says_how_many_emulator_frames_a_step_covers():
    pytest.importorskip("ale_py", reason="Atari needs the atari extra: pip install -e '.[atari]'")
    report = testing.test_environment("Atari-v0", steps=8)
    assert report.frames_per_step == 4
    assert "frames per step    4 (emulator frames)" in str(report)
    assert "frames per step" not in str(testing.test_environment(broken_envs.CoinFlipEnv()))


def test_exceptions_from_the_environment_are_chained():
    with pytest.raises(EnvironmentCheckError) as e:
        testing.test_environment(broken_envs.StepRaises())
    assert isinstance(e.value.__cause__, ValueError)


def test_unseeded_observations_are_caught_at_reset():
    with pytest.raises(EnvironmentCheckError) as e:
        testing.test_environment(broken_envs.NonDeterministic())
    assert (e.value.agent, e.value.field) == (0, "obs")
    assert re.fullmatch(
        r"\[agent 0, field 'obs'\] not deterministic: reset\(\) gave a different obs in a replay "
        r"with the same seed \(0\) and actions \(first run: \[.*\], replay: \[.*\]\); seed\(\) "
        r"must seed every random generator the environment uses, so the same seed and actions "
        r"replay the same episode",
        str(e.value),
    )


def test_unseeded_rewards_are_caught_at_the_step_that_differs():
    with pytest.raises(EnvironmentCheckError) as e:
        testing.test_environment(broken_envs.RandomReward())
    assert (e.value.agent, e.value.field) == (0, "reward")
    assert str(e.value).startswith(
        "[agent 0, field 'reward'] not deterministic: step 1 gave a different reward in a replay "
        "with the same seed (0) and actions (first run: "
    )


def test_unknown_name_gets_the_registry_suggestion():
    with pytest.raises(RegistryError, match=r"Did you mean 'GridGather-v0'[? ]"):
        testing.test_environment("GridGathr-v0")


def test_env_kwargs_with_an_instance_is_a_user_error():
    with pytest.raises(UserError, match="env_kwargs apply only when test_environment builds"):
        testing.test_environment(broken_envs.CoinFlipEnv(), env_kwargs={"episode_length": 3})


def test_something_that_is_not_an_environment_is_a_user_error():
    with pytest.raises(UserError, match="a gymnasium env is checked by its id"):
        testing.test_environment(42)


def test_constructor_failure_is_reported_as_a_check_error():
    environment.register("test-bad-ctor", broken_envs.ConstructorRaises)
    try:
        with pytest.raises(EnvironmentCheckError) as e:
            testing.test_environment("test-bad-ctor")
    finally:
        registry.environments.unregister("test-bad-ctor")
    assert str(e.value) == (
        "building environment 'test-bad-ctor' raised FileNotFoundError: no such file: missing.cfg"
    )


def test_a_run_reads_spaces_that_disagree_with_the_agent_count_as_a_named_error():
    """What a run reads first (the controller's probe, ``troupe train``'s set-up from the
    spaces): an environment declaring two agents and one space each used to be met as
    ``zip() argument 2 is longer than argument 1``, or a worker's index error."""
    from api.env_check import declared_spaces
    from api.resolve import load_experiment
    from system.run import builders

    environment.register("WrongAgentCount-v0", broken_envs.WrongAgentCount)
    try:
        said = (
            "environment 'WrongAgentCount-v0': [field 'observation_spaces'] observation_spaces "
            "has 1 spaces but agent_count is 2; declare one space per agent (troupe test-env "
            "checks the whole contract)"
        )
        with pytest.raises(EnvironmentCheckError) as caught:
            declared_spaces(broken_envs.WrongAgentCount(), "WrongAgentCount-v0")
        assert str(caught.value) == said
        with pytest.raises(EnvironmentCheckError, match=re.escape(said)):
            load_experiment("WrongAgentCount-v0")  # troupe run/train ENV: before any process
        config = load_experiment("cartpole-ppo", ["environment.type=WrongAgentCount-v0"])
        with pytest.raises(EnvironmentCheckError, match=re.escape(said)):
            builders.probe_spaces(config)  # the controller's, and every worker's
        coin = declared_spaces(broken_envs.CoinFlipEnv(), "CoinFlip")
        assert [len(s) for s in coin] == [1, 1]
    finally:
        registry.environments.unregister("WrongAgentCount-v0")
