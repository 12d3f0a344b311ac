"""Experiment config: building from dicts, whole-config validation, overrides."""

from __future__ import annotations

import pytest

from api import registry
from api.config import (
    ActorConfig,
    ComponentConfig,
    ExperimentConfig,
    PolicyConfig,
    StopConfig,
    apply_overrides,
    auto_actor_workers,
    check,
    make_experiment,
    validate,
)
from api.errors import ConfigError


class DummyPolicy:
    """Stands in for a registered policy; config validation only reads its signature."""

    def __init__(self, hidden: int = 64, lr: float = 3e-4):
        self.hidden = hidden


class DummyTrainer:
    """Stands in for a registered trainer."""

    def __init__(self, policy, epochs: int = 4):
        self.policy = policy


@pytest.fixture(autouse=True)
def dummy_components():
    registry.register_policy("test-dummy-policy", DummyPolicy)
    registry.register_trainer("test-dummy-trainer", DummyTrainer)
    yield
    registry.policies.unregister("test-dummy-policy")
    registry.trainers.unregister("test-dummy-trainer")


def valid_config() -> ExperimentConfig:
    return ExperimentConfig(
        name="gather",
        environment=ComponentConfig("GridGather-v0", {"size": 6}),
        policies={
            "default": PolicyConfig(
                policy=ComponentConfig("test-dummy-policy", {"hidden": 32}),
                trainer=ComponentConfig("test-dummy-trainer", {"epochs": 2}),
            )
        },
        stop=StopConfig(env_frames=10_000),
    )


def test_a_valid_config_has_no_errors():
    assert validate(valid_config()) == []
    assert check(valid_config()).name == "gather"


def test_from_dict_builds_nested_dataclasses():
    config = ExperimentConfig.from_dict(
        {"name": "x", "actors": {"workers": 3}, "policies": {"p": {"policy": {"type": "a"}}}}
    )
    assert isinstance(config.actors, ActorConfig) and config.actors.workers == 3
    assert isinstance(config.policies["p"], PolicyConfig)
    assert config.policies["p"].policy.type == "a"


def test_from_dict_round_trips_to_dict():
    config = valid_config()
    assert ExperimentConfig.from_dict(config.to_dict()) == config


def test_unknown_keys_are_reported_with_a_suggestion():
    with pytest.raises(ConfigError) as e:
        ExperimentConfig.from_dict({"nmae": "x", "actors": {"worker": 2}})
    assert e.value.errors == [
        "nmae: unknown key; did you mean 'name'?",
        "actors.worker: unknown key; did you mean 'workers'?",
    ]


def test_unknown_key_without_a_close_match_lists_valid_keys():
    with pytest.raises(ConfigError) as e:
        ExperimentConfig.from_dict({"stop": {"zzz": 1}})
    assert e.value.errors == [
        "stop.zzz: unknown key; valid keys: eval_return, confirm_windows, max_return, "
        "env_frames, trainer_steps, wall_seconds, stall_seconds, eval_return_source"
    ]


def test_wrong_types_name_the_key_expected_and_actual():
    with pytest.raises(ConfigError) as e:
        ExperimentConfig.from_dict(
            {"seed": "zero", "actors": {"workers": True}, "agent_policies": "p"}
        )
    assert e.value.errors == [
        "agent_policies: expected a list, got 'p'",
        "actors.workers: expected int, got bool True",
        "seed: expected int, got str 'zero'",
    ]


def test_a_max_return_below_the_target_is_refused():
    config = valid_config()
    config.stop.eval_return, config.stop.max_return = 475.0, 400.0
    assert "stop.max_return: 400.0 is below stop.eval_return (475.0): no window could reach it" in (
        validate(config)
    )
    config.stop.max_return = 500.0
    assert not [e for e in validate(config) if e.startswith("stop.")]


def test_an_int_is_accepted_where_a_float_is_declared():
    config = ExperimentConfig.from_dict({"stop": {"wall_seconds": 60}})
    assert config.stop.wall_seconds == 60.0 and isinstance(config.stop.wall_seconds, float)


def test_config_error_message_lists_every_error():
    error = ConfigError(["a: bad", "b: worse"])
    assert str(error) == "invalid experiment configuration (2 errors):\n  - a: bad\n  - b: worse"


def test_validate_lists_every_error_at_once():
    errors = validate(ExperimentConfig(actors=ActorConfig(workers=0, on_env_error="ignore")))
    assert errors == [
        "actors.on_env_error: must be 'raise' or 'reset', got 'ignore'",  # its type: a mode
        "name: must be set",
        "environment.type: must name a registered environment",
        "policies: at least one policy is needed",
        "actors.workers: must be at least 1, got 0",
        "stop: set at least one of eval_return, env_frames, trainer_steps, wall_seconds",
    ]


def test_validate_checks_names_and_arguments_against_the_registry():
    config = valid_config()
    config.environment = ComponentConfig("GridGathr-v0", {})
    config.policies["default"].policy.args = {"hiden": 8}
    config.agent_policies = ["default", "other"]
    errors = validate(config)
    assert len(errors) == 3
    # the closest name first (with ale-py installed, Atari ids such as Gravitar-v0 follow it)
    assert errors[0].startswith(
        "environment.type: unknown environment 'GridGathr-v0'. Did you mean 'GridGather-v0'"
    )
    assert errors[1] == (
        "policies.default.policy.args.hiden: unknown key; did you mean 'hidden'? "
        "(test_config:DummyPolicy takes no 'hiden')"
    )
    assert errors[2] == ("agent_policies[1]: unknown policy 'other'; policies are ['default']")


def test_a_policy_no_agent_plays_is_refused_before_the_run():
    """Every worker that built it crashed on a bare StopIteration, restarted 5 times each."""
    from api.config import make_experiment
    from api.errors import ConfigError

    with pytest.raises(ConfigError, match=r"policies.blue: no agent plays it; name it in "):
        make_experiment("gather-2p-ppo", ["agent_policies=['red','red']"])
    assert validate(make_experiment("gather-2p-ppo")) == []


class RangedPolicy:
    """A policy whose numeric arguments have declared intervals."""

    arg_ranges = {"gamma": "[0, 1]", "lr": "(0, inf)", "layers": "[1, inf)", "seed": "[0, inf)"}

    def __init__(self, gamma: float = 0.9, lr: float = 1e-3, layers=(8,), seed: int | None = None):
        self.gamma = gamma


def test_component_arguments_outside_their_declared_interval_name_key_and_range():
    registry.register_policy("test-ranged-policy", RangedPolicy)
    try:
        config = valid_config()
        policy = config.policies["default"].policy
        policy.type, policy.args = "test-ranged-policy", {"gamma": 1.5, "lr": 0, "layers": [4, 0]}
        assert validate(config) == [
            "policies.default.policy.args.gamma: must be in [0, 1], got 1.5",
            "policies.default.policy.args.lr: must be more than 0, got 0",
            "policies.default.policy.args.layers: every entry must be at least 1, got [4, 0]",
        ]
        # the edges are in range, None is no value, and a wrong type is the type check's
        policy.args = {"gamma": 1, "lr": 1e-9, "layers": [1], "seed": None}
        assert validate(config) == []
        policy.args = {"gamma": "high"}
        assert validate(config) == [
            "policies.default.policy.args.gamma: expected float, got str 'high'"
        ]
    finally:
        registry.policies.unregister("test-ranged-policy")


class Sloppy(RangedPolicy):
    """Declares an interval that is not one."""

    arg_ranges = {"gamma": "0..1"}


def test_a_malformed_declared_interval_is_reported_as_the_components_fault():
    registry.register_policy("test-sloppy-policy", Sloppy)
    try:
        config = valid_config()
        config.policies["default"].policy = ComponentConfig("test-sloppy-policy", {"gamma": 0.5})
        assert validate(config) == [
            "policies.default.policy.type: arg_ranges['gamma']: not an interval: '0..1'; "
            "write e.g. '[0, 1]' or '(0, inf)'"
        ]
    finally:
        registry.policies.unregister("test-sloppy-policy")


def test_check_raises_with_every_error():
    with pytest.raises(ConfigError) as e:
        check(ExperimentConfig())
    assert "name: must be set" in e.value.errors
    assert str(e.value).startswith("invalid experiment configuration (4 errors):")


def test_apply_overrides_parses_literals_and_strings():
    config = apply_overrides(
        valid_config(),
        [
            "actors.workers=4",
            "environment.args.size=7",
            "stop.wall_seconds=1.5",
            "stop.env_frames=None",
            "name=renamed",
            "actors.on_env_error=reset",
        ],
    )
    assert config.actors.workers == 4
    assert config.environment.args == {"size": 7}
    assert config.stop.wall_seconds == 1.5 and config.stop.env_frames is None
    assert config.name == "renamed" and config.actors.on_env_error == "reset"


def test_apply_overrides_reports_bad_paths_with_suggestions():
    with pytest.raises(ConfigError) as e:
        apply_overrides(valid_config(), ["actor.workers=3", "novalue"])
    assert e.value.errors == [
        "actor.workers: no key 'actor'; did you mean 'actors'?",
        "novalue: an override must look like key.path=value",
    ]


def test_a_key_written_without_its_section_is_pointed_to_its_full_path():
    """``replay.batch_size=32`` was told "did you mean 'selfplay'?" (the spelling nearest
    'replay' among the top-level keys), not the key the user meant."""
    with pytest.raises(ConfigError) as e:
        apply_overrides(
            make_experiment("cartpole-dqn"), ["replay.batch_size=32", "trainer.args.lr=0.1"]
        )
    assert e.value.errors == [
        "replay.batch_size: no key 'replay'; did you mean policies.default.replay.batch_size?",
        "trainer.args.lr: no key 'trainer'; did you mean policies.default.trainer.args.lr?",
    ]


def test_apply_overrides_reports_unknown_leaf_keys():
    with pytest.raises(ConfigError) as e:
        apply_overrides(valid_config(), ["actors.wokers=3"])
    assert e.value.errors == ["actors.wokers: unknown key; did you mean 'workers'?"]


def test_policy_of_agent_uses_the_only_policy_or_the_mapping():
    config = valid_config()
    assert config.policy_of_agent(1) == "default"
    config.agent_policies = ["default", "default"]
    assert config.policy_of_agent(0) == "default"


def test_auto_actor_workers_take_the_cores_the_other_roles_leave():
    data = make_experiment("cartpole-ppo").to_dict()
    assert auto_actor_workers(data, cores=16) == 13  # 1 policy, 1 trainer, 1 for the rest
    data["policies"]["default"]["policy_workers"] = 2
    data["policies"]["default"]["trainer_workers"] = 3
    assert auto_actor_workers(data, cores=16) == 10
    assert auto_actor_workers(data, cores=2) == 1  # never none


def test_actors_workers_auto_is_resolved_when_the_overrides_are_applied(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(8)))
    config = make_experiment(
        "cartpole-ppo", ["actors.workers=auto", "policies.default.policy_workers=2"]
    )
    assert config.actors.workers == 4  # 8 cores less 2 policy workers, 1 trainer, 1 for the rest
    with pytest.raises(ConfigError, match=r"actors\.workers: expected int, got str 'many'"):
        make_experiment("cartpole-ppo", ["actors.workers=many"])


def test_trainer_threads_must_be_at_least_one():
    with pytest.raises(
        ConfigError, match=r"policies\.default\.trainer_threads: must be at least 1"
    ):
        make_experiment("cartpole-ppo", ["policies.default.trainer_threads=0"])


@pytest.mark.parametrize("experiment", ["cartpole-ppo", "cartpole-impala"])
def test_a_learning_rate_schedule_is_one_of_the_two_before_launch(experiment):
    """``lr_schedule`` is a ``Literal`` in the trainers' signatures: another name is refused by
    the config check (not by the trainer's constructor in a worker), listing both."""
    with pytest.raises(ConfigError, match="expected 'constant' or 'linear', got str 'cosine'"):
        make_experiment(experiment, ["policies.default.trainer.args.lr_schedule=cosine"])
    linear = ["policies.default.trainer.args.lr_schedule=linear",
              "policies.default.trainer.args.total_steps=10"]  # fmt: skip
    assert make_experiment(experiment, linear).policies["default"].trainer.args["lr_schedule"] == (
        "linear"
    )


@pytest.mark.parametrize("experiment", ["cartpole-ppo", "cartpole-impala"])
def test_a_training_precision_is_float32_or_bfloat16_before_launch(experiment):
    with pytest.raises(ConfigError, match="expected 'float32' or 'bfloat16', got str 'fp16'"):
        make_experiment(experiment, ["policies.default.trainer.args.precision=fp16"])
    bf16 = make_experiment(experiment, ["policies.default.trainer.args.precision=bfloat16"])
    assert bf16.policies["default"].trainer.args["precision"] == "bfloat16"


def test_a_changed_type_whose_recipe_args_stay_says_how_to_clear_them():
    """``policies.default.policy.type=my-policy`` on cartpole-ppo kept the actor-critic's
    ``hidden_sizes``, each refused as an unknown key with no word on why they were there."""
    from api.resolve import load_experiment

    registry.register_policy("hint-dummy-policy", DummyPolicy)
    try:
        retype = "policies.default.policy.type=hint-dummy-policy"
        with pytest.raises(ConfigError) as e:
            load_experiment("cartpole-ppo", [retype])
        assert e.value.errors[-1].startswith("policies.default.policy.args: what the recipe gave")
        assert "'policies.default.policy.args={}'" in e.value.errors[-1]
        config = load_experiment("cartpole-ppo", [retype, "policies.default.policy.args={}"])
        assert config.policies["default"].policy.args == {}
        with pytest.raises(ConfigError) as e:  # args given: their own errors, no hint
            load_experiment("cartpole-ppo", [retype, "policies.default.policy.args={'x': 1}"])
        assert not any("what the recipe gave" in line for line in e.value.errors)
    finally:
        registry.policies.unregister("hint-dummy-policy")


def test_a_list_or_mapping_read_as_text_says_why():
    """``pbt.members=[a,b]`` said "expected a list, got '[a,b]'", which looks like one."""
    with pytest.raises(ConfigError) as e:
        make_experiment("cartpole-pbt", ["pbt.members=[a,b]"])
    assert e.value.errors[0] == (
        "pbt.members: expected a list, got '[a,b]' (read as text: it is no Python literal; "
        "quote the strings in it, e.g. ['a', 'b'], and the whole key=value for the shell)"
    )
    with pytest.raises(ConfigError, match=r"expected a list, got 3$"):  # no hint: not text
        make_experiment("cartpole-ppo", ["callbacks=3"])


def test_budgets_written_as_1e6_are_whole_numbers():
    """``stop.env_frames=1e6`` (and ``env_frames: 1e6`` in a file, ``frames=1e6`` for an
    environment id) was refused: "expected int, got float 1000000.0". A fraction still is."""
    from api.resolve import load_experiment

    config = make_experiment("cartpole-ppo", ["stop.env_frames=1e6", "actors.workers=2.0"])
    assert config.stop.env_frames == 1_000_000 and type(config.stop.env_frames) is int
    assert type(config.actors.workers) is int
    config = load_experiment("CartPole-v1", ["frames=2e5"])
    assert config.stop.env_frames == 200_000 and type(config.stop.env_frames) is int
    with pytest.raises(ConfigError, match=r"stop\.env_frames: expected int, got float 2000\.5"):
        make_experiment("cartpole-ppo", ["stop.env_frames=2000.5"])
    with pytest.raises(ConfigError, match=r"a whole number of at least 1; got 1500\.5"):
        load_experiment("CartPole-v1", ["frames=1500.5"])


def test_imports_given_with_a_config_leave_the_callers_config_as_it_was():
    """``load_experiment(config, imports=[...])`` appended the imports to the ``code`` of the
    config the caller passed in: a config built once and launched twice with other imports
    carried the first launch's into the second."""
    from api.resolve import load_experiment

    config = make_experiment("cartpole-ppo")
    before = list(config.code.imports)
    loaded = load_experiment(config, imports=["colorsys"])
    assert config.code.imports == before
    assert loaded.code.imports == [*before, "colorsys"]
    assert load_experiment(config, imports=["sched"]).code.imports == [*before, "sched"]


def test_frames_and_target_stand_for_the_stop_keys_of_any_experiment():
    """``troupe.train("cartpole-ppo", frames=30000)`` was refused ("frames: unknown key; did
    you mean 'name'?"): ``frames=`` and ``target=`` worked only where the experiment's function
    took them, as ``troupe train ENV``'s does."""
    from api.resolve import load_experiment

    config = load_experiment("cartpole-ppo", ["frames=3e4", "target=400"])
    assert (config.stop.env_frames, config.stop.eval_return) == (30_000, 400)
    assert type(config.stop.env_frames) is int
    assert load_experiment("cartpole-ppo", ["target=None"]).stop.eval_return is None
    assert load_experiment(config, ["frames=5000"]).stop.env_frames == 5000  # a config too
    with pytest.raises(ConfigError) as e:
        load_experiment("cartpole-ppo", ["frames=0", "target=high"])
    assert e.value.errors == [
        "frames: env frames to train at most, a whole number of at least 1; got 0",
        "target: the greedy return to reach, a number; got 'high'",
    ]


@pytest.mark.parametrize(
    ("override", "said"),
    [
        (
            "frames=abc",
            "frames: env frames to train at most, a whole number of at least 1; got 'abc'",
        ),
        ("frames=0", "frames: env frames to train at most, a whole number of at least 1; got 0"),
        ("target=high", "target: the greedy return to reach, a number; got 'high'"),
    ],
)
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_an_environments_frames_and_target_are_checked(override, said, algo):
    """``frames=abc`` reached dqn's arithmetic ("unsupported operand type(s) for //"), and
    ``frames=0`` became the default budget in silence."""
    from api.resolve import load_experiment

    with pytest.raises(ConfigError) as e:
        load_experiment(algo if algo == "dqn" else "CartPole-v1",
                        [*(["env=CartPole-v1"] if algo == "dqn" else []), override])  # fmt: skip
    assert e.value.errors == [said]


@pytest.mark.parametrize(
    ("target", "override", "said"),
    [
        ("CartPole-v1", "frams=100", "frams: unknown key; did you mean 'frames' (an argument of "
         "experiment 'ppo')?"),
        ("dqn", "taget=100", "taget: unknown key; did you mean 'target' (an argument of "
         "experiment 'dqn')?"),
    ],
)  # fmt: skip
def test_a_misspelt_experiment_argument_is_suggested(target, override, said):
    """``frams=`` is near ``frames``, an argument of the experiment's function and no config
    key: the config's error listed its top-level keys and suggested nothing."""
    from api.resolve import load_experiment

    with pytest.raises(ConfigError) as e:
        load_experiment(target, [override, *(["env=CartPole-v1"] if target == "dqn" else [])])
    assert e.value.errors == [said]
    with pytest.raises(ConfigError, match=r"seeed: unknown key; did you mean 'seed'\?"):
        load_experiment(target, ["seeed=1", *(["env=CartPole-v1"] if target == "dqn" else [])])


def test_an_environment_argument_given_as_a_top_level_key_is_pointed_to_its_place():
    """``troupe train CartPole-v1 max_episode_steps=100`` listed the config's sections alone,
    and ``troupe train GridGather-v0 n_agent=3`` suggested the experiment's ``target``."""
    from api.resolve import load_experiment

    with pytest.raises(ConfigError) as e:
        load_experiment("CartPole-v1", ["max_episode_steps=100"])
    assert e.value.errors[0].endswith(
        "(an argument of environment 'CartPole-v1'? give it as "
        "environment.args.max_episode_steps=...)"
    )
    with pytest.raises(ConfigError) as e:
        load_experiment("GridGather-v0", ["n_agent=3"])
    assert "target" not in e.value.errors[0]
    assert e.value.errors[0].endswith("(or environment.args.n_agents?)")
    with pytest.raises(ConfigError) as e:  # a registered environment names its arguments
        load_experiment("GridGather-v0", ["zzz=3"])
    assert "an argument of environment" not in e.value.errors[0]


@pytest.mark.parametrize("target", ["CartPole-v1", "dqn"])
def test_target_none_leaves_no_target(target):
    """The experiment function took ``target=None`` for "not given" and kept gymnasium's 475:
    ``troupe train CartPole-v1 target=None`` stopped on its target all the same."""
    from api.resolve import load_experiment

    env = ["env=CartPole-v1"] if target == "dqn" else []
    config = load_experiment(target, [*env, "target=None", "frames=1000"])
    assert config.stop.eval_return is None and config.stop.env_frames == 1000
    assert config.stop.eval_return_source == "given: stop.eval_return=None"
    assert load_experiment(target, [*env, "target=100"]).stop.eval_return == 100
    assert load_experiment(target, env).stop.eval_return == 475  # gymnasium's, when not given
