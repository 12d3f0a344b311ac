"""Experiments as files (.yaml, .toml, .py), ``troupe show-config`` and the checks every
override passes before anything starts (and what only a constructor can refuse ending the run at
once), through the command line as a user runs it."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from algorithm.actor_critic_policies.policy import ActorCriticPolicy
from algorithm.ppo.trainer import PPOTrainer
from api.config import ExperimentConfig
from api.errors import ConfigError, UserError
from api.resolve import load_experiment

ROOT = Path(__file__).resolve().parents[2]


def troupe(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The CLI in a fresh process, so wide that rich wraps no table row."""
    env = {**os.environ, "COLUMNS": "3000", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "distributed.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=cwd,
    )


# --------------------------------------------------------------------- show-config
def _leaves(node, path=""):
    """Every leaf key path of a config dict, component arguments one by one."""
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaves(value, f"{path}.{key}" if path else key)
    elif path and not path.startswith("code."):
        yield path


def _rows(stdout: str) -> dict[str, list[str]]:
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 5 and cells[0] and cells[0] != "key":
            rows[cells[0]] = cells
    return rows


@pytest.mark.multiprocess
def test_show_config_prints_every_key_with_type_default_value_and_doc():
    result = troupe("show-config", "cartpole-ppo")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _rows(result.stdout)
    config = load_experiment("cartpole-ppo")
    expected = set(_leaves(config.to_dict()))
    # every argument the trainer's and the policy's constructors take, set or not
    for cls, path, skip in (
        (PPOTrainer, "policies.default.trainer.args", {"policy", "self"}),
        (ActorCriticPolicy, "policies.default.policy.args", {"observation_space", "action_space"}),
    ):  # fmt: skip
        params = inspect.signature(cls).parameters
        expected |= {f"{path}.{p}" for p in params if p not in skip and not p.startswith("*")}
    missing = sorted(k for k in expected if k not in rows and not k.endswith(".args"))
    assert not missing, f"keys not shown: {missing}"
    # every field of the config's own dataclasses has its type, default and doc
    for key, (_, type_, default, value, doc) in rows.items():
        assert type_ and default and value, (key, rows[key])
        if ".args." not in key:
            assert doc, f"{key} has no doc"
    lr = rows["policies.default.trainer.args.lr"]
    signature_default = inspect.signature(PPOTrainer).parameters["lr"].default
    assert lr[1:4] == [
        "float",
        repr(signature_default),
        repr(config.policies["default"].trainer.args["lr"]),
    ]
    assert "learning rate" in lr[4].lower()
    workers = rows["actors.workers"]
    assert workers[1] == "int" and workers[3] == str(config.actors.workers)


@pytest.mark.multiprocess
def test_show_config_json_round_trips_to_the_experiment():
    result = troupe("show-config", "cartpole-ppo", "seed=7", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    shown = ExperimentConfig.from_dict(json.loads(result.stdout))
    assert isinstance(shown, ExperimentConfig)
    assert shown == load_experiment("cartpole-ppo", ["seed=7"])
    assert shown.seed == 7 and shown != load_experiment("cartpole-ppo")


# --------------------------------------------------------------------- experiment files
YAML = """\
environment:
  type: CartPole-v1
policies:
  default:
    policy: {type: actor-critic, args: {hidden_sizes: [32, 32]}}
    trainer: {type: ppo, args: {lr: 0.01, epochs: 2}}
    batch_segments: 4
actors: {workers: 1, envs_per_worker: 4, segment_length: 32}
stop: {env_frames: 3000}
seed: 5
"""

TOML = """\
seed = 5

[environment]
type = "CartPole-v1"

[policies.default]
batch_segments = 4
policy = {type = "actor-critic", args = {hidden_sizes = [32, 32]}}
trainer = {type = "ppo", args = {lr = 0.01, epochs = 2}}

[actors]
workers = 1
envs_per_worker = 4
segment_length = 32

[stop]
env_frames = 3000
"""

PYTHON = """\
from api.config import (ActorConfig, ComponentConfig, ExperimentConfig, PolicyConfig,
                        StopConfig)


def _config(seed):
    return ExperimentConfig(
        name="exp",
        environment=ComponentConfig("CartPole-v1"),
        policies={"default": PolicyConfig(
            policy=ComponentConfig("actor-critic", {"hidden_sizes": [32, 32]}),
            trainer=ComponentConfig("ppo", {"lr": 0.01, "epochs": 2}),
            batch_segments=4,
        )},
        actors=ActorConfig(workers=1, envs_per_worker=4, segment_length=32),
        stop=StopConfig(env_frames=3000),
        seed=seed,
    )


def experiment():
    return _config(5)


def other():
    return _config(6)
"""


@pytest.fixture
def files(tmp_path) -> Path:
    (tmp_path / "exp.yaml").write_text(YAML)
    (tmp_path / "exp.toml").write_text(TOML)
    (tmp_path / "exp.py").write_text(PYTHON)
    return tmp_path


def _comparable(config: ExperimentConfig) -> dict:
    """Everything but where the config came from (name, user code)."""
    data = config.to_dict()
    data.pop("code")
    data.pop("name")
    return data


def test_yaml_toml_and_python_files_resolve_to_the_same_experiment(files):
    configs = {s: load_experiment(str(files / f"exp{s}")) for s in (".yaml", ".toml", ".py")}
    first = configs[".yaml"]
    assert first.environment.type == "CartPole-v1"
    assert first.policies["default"].trainer.args == {"lr": 0.01, "epochs": 2}
    assert first.policies["default"].policy.args == {"hidden_sizes": [32, 32]}
    assert (first.actors.workers, first.actors.envs_per_worker, first.seed) == (1, 4, 5)
    assert first.stop.env_frames == 3000
    assert first.name == "exp"  # the file's stem
    for suffix, config in configs.items():
        assert _comparable(config) == _comparable(first), suffix
    # keys a file leaves out keep the config's defaults
    assert first.evaluation == dataclasses.replace(ExperimentConfig().evaluation)
    # a .py file goes to every worker: it is one of the run's imports
    assert str((files / "exp.py").resolve()) in configs[".py"].code.imports


def test_a_python_file_names_its_function_and_overrides_apply(files):
    other = load_experiment(f"{files / 'exp.py'}:other", ["actors.workers=2"])
    assert other.seed == 6 and other.actors.workers == 2


def test_a_files_wrong_types_come_with_everything_else_it_gets_wrong(tmp_path):
    """A value of the wrong type used to stop the check there: the misspelt and out-of-range
    trainer arguments came one launch later (as overrides, every error came at once)."""
    (tmp_path / "exp.yaml").write_text(
        "base: cartpole-ppo\n"
        "actors: {workers: two}\n"
        "policies: {default: {trainer: {args: {lr: -1, clip_eps: 0.2}}}}\n"
    )
    with pytest.raises(ConfigError) as e:
        load_experiment(str(tmp_path / "exp.yaml"))
    assert e.value.errors == [
        "actors.workers: expected int, got str 'two'",
        "policies.default.trainer.args.clip_eps: unknown key; did you mean 'clip'? "
        "(algorithm.ppo.trainer:PPOTrainer takes no 'clip_eps')",
        "policies.default.trainer.args.lr: must be more than 0, got -1",
    ]


def test_a_file_naming_its_recipe_under_another_word_is_pointed_to_base(tmp_path):
    """`experiment: cartpole-ppo` (other tools' word) listed every valid key, base not among
    them, and the errors of a config with no recipe under it."""
    (tmp_path / "exp.yaml").write_text("experiment: cartpole-ppo\nseed: 3\n")
    with pytest.raises(ConfigError) as e:
        load_experiment(str(tmp_path / "exp.yaml"))
    assert e.value.errors[0] == (
        "experiment: unknown key; to start from a recipe, write base: 'cartpole-ppo'"
    )


def test_yaml_reads_a_number_with_an_exponent_as_a_number(tmp_path):
    """PyYAML (YAML 1.1) read ``lr: 1e-3`` as the text '1e-3', refused as "expected float,
    got str": the user wrote a number, as TOML, JSON and an override read it."""
    (tmp_path / "exp.yaml").write_text(
        "base: cartpole-ppo\npolicies:\n  default:\n    trainer:\n      args:\n"
        "        lr: 1e-3\n        entropy_coef: 5E-3\n"
    )
    args = load_experiment(str(tmp_path / "exp.yaml")).policies["default"].trainer.args
    assert (args["lr"], args["entropy_coef"]) == (1e-3, 5e-3)


def test_a_misspelt_policy_under_a_base_is_pointed_to_the_one_it_was_meant_to_set(tmp_path):
    """``policies: {defualt: ...}`` adds a new policy beside the base's ``default``; it was told
    only that it needs a type and that the agents need a mapping."""
    (tmp_path / "exp.yaml").write_text(
        "base: cartpole-ppo\npolicies:\n  defualt:\n    trainer:\n      args:\n        lr: 0.001\n"
    )
    with pytest.raises(ConfigError) as e:
        load_experiment(str(tmp_path / "exp.yaml"))
    assert (
        "policies.defualt.policy.type: must name a registered policy ('defualt' is a new "
        "policy here: did you mean to set 'default'?)"
    ) in str(e.value)


def test_a_file_takes_away_what_its_base_has_with_an_empty_mapping_or_null(tmp_path):
    """Merging only adds: ``args: {}`` kept every argument of the recipe's trainer, and a
    population over ``base: cartpole-dqn`` kept the recipe's ``default`` beside its members,
    a policy no actor played (a trainer and a replay worker for nothing, never trained)."""
    (tmp_path / "bare.yaml").write_text(
        "base: cartpole-dqn\npolicies:\n  default:\n    trainer: {args: {}}\n"
        "stop: {eval_return: null}\n"
    )
    bare = load_experiment(str(tmp_path / "bare.yaml"))
    assert bare.policies["default"].trainer.args == {} and bare.stop.eval_return is None
    assert bare.policies["default"].trainer.type == "dqn"  # the rest of the mapping stays
    member = "{policy: {type: q-network}, trainer: {type: dqn, args: {lr: 0.001}}}"
    population = (
        f"base: cartpole-dqn\npolicies:\n  member0: {member}\n  member1: {member}\n"
        "actors: {workers: 2}\nevaluation: {workers: 2}\nstop: {eval_return: null}\n"
        "pbt: {members: [member0, member1], hyperparameters: {lr: [0.0001, 0.01]}}\n"
    )
    (tmp_path / "kept.yaml").write_text(population)
    with pytest.raises(ConfigError) as e:
        load_experiment(str(tmp_path / "kept.yaml"))
    assert e.value.errors == [
        "policies.default: not in pbt.members, so no actor plays it (each member plays its "
        "own); add it to pbt.members, or remove it (in a file with base:, default: null)"
    ]
    (tmp_path / "dropped.yaml").write_text(
        population.replace("policies:\n", "policies:\n  default: null\n")
    )
    assert sorted(load_experiment(str(tmp_path / "dropped.yaml")).policies) == [
        "member0",
        "member1",
    ]


def test_a_file_that_sets_its_own_target_is_not_said_to_have_its_recipes(tmp_path):
    """Over ``base: {experiment: ppo, env: CartPole-v1}``, a file with ``eval_return: null``
    started with "stop at: no evaluation target (gymnasium's reward_threshold for
    CartPole-v1)", and one with its own target said the same of it: the recipe's words."""
    base = "base: {experiment: ppo, env: CartPole-v1}\n"
    (tmp_path / "none.yaml").write_text(base + "stop: {eval_return: null}\n")
    (tmp_path / "own.yaml").write_text(base + "stop: {eval_return: 200}\n")
    (tmp_path / "kept.yaml").write_text(base + "stop: {env_frames: 5000}\n")
    assert load_experiment(str(tmp_path / "none.yaml")).stop.eval_return_source == ""
    own = load_experiment(str(tmp_path / "own.yaml")).stop
    assert own.eval_return_source == "given: stop.eval_return in own.yaml"
    kept = load_experiment(str(tmp_path / "kept.yaml")).stop  # the recipe's target, its words
    assert kept.eval_return_source == "gymnasium's reward_threshold for CartPole-v1"


def test_a_toml_file_that_writes_null_as_text_is_told_how_to_unset_the_key(tmp_path):
    """TOML has no null: a file over ``base: cartpole-ppo`` that unsets the target can only
    write it as text, and read ``expected float, got str 'None'``."""
    (tmp_path / "long.toml").write_text(
        'base = "cartpole-ppo"\n[stop]\neval_return = "None"\nenv_frames = 3000\n'
    )
    with pytest.raises(ConfigError) as e:
        load_experiment(str(tmp_path / "long.toml"))
    assert e.value.errors == [
        "stop.eval_return: got the text 'None', which is no null in a file: YAML and JSON write "
        "null; TOML has none, so leave the key out of the file and unset it on the command line "
        "(`stop.eval_return=None`), or write the file as YAML"
    ]
    (tmp_path / "long.toml").write_text('base = "cartpole-ppo"\n[stop]\nenv_frames = 3000\n')
    fixed = load_experiment(str(tmp_path / "long.toml"), ["stop.eval_return=None"])
    assert fixed.stop.eval_return is None and fixed.stop.env_frames == 3000
    (tmp_path / "named.toml").write_text('base = "cartpole-ppo"\nname = "null"\n')
    assert load_experiment(str(tmp_path / "named.toml")).name == "null"  # text where text goes


def test_what_a_base_gets_wrong_names_the_file_whose_base_it_is(tmp_path):
    """``base: cartpol-ppo`` said "unknown experiment or environment" and a missing base file
    "does not exist", neither naming the file that said so: in a chain of files, which?"""
    (tmp_path / "typo.yaml").write_text("base: cartpol-ppo\n")
    (tmp_path / "gone.yaml").write_text("base: missing.yaml\n")
    (tmp_path / "top.yaml").write_text("base: typo.yaml\n")
    (tmp_path / "args.yaml").write_text("base: {experiment: ppo, envv: Acrobot-v1}\n")
    said = {}
    for name in ("typo", "gone", "top", "args"):
        with pytest.raises(UserError) as e:
            load_experiment(str(tmp_path / f"{name}.yaml"))
        said[name] = str(e.value)
    typo, gone = tmp_path / "typo.yaml", tmp_path / "gone.yaml"
    assert said["typo"].startswith(f"{typo}: base: unknown experiment or environment 'cartpol-")
    assert "Did you mean experiment 'cartpole-ppo'" in said["typo"]
    assert said["gone"] == f"{gone}: base: experiment file {tmp_path}/missing.yaml does not exist"
    assert said["top"] == f"{tmp_path / 'top.yaml'}: base: {said['typo']}"  # the chain
    assert said["args"].startswith(f"{tmp_path / 'args.yaml'}: base: could not build experiment ")


def test_a_function_that_returns_no_config_is_named_with_what_it_returned(tmp_path):
    (tmp_path / "odd.py").write_text("def experiment():\n    return 42\n")
    with pytest.raises(UserError, match=r"odd.py:experiment\(\) returned int 42, not an Exp"):
        load_experiment(str(tmp_path / "odd.py"))


TAKES_ARGUMENTS = """\
from api.resolve import for_environment


def experiment(lr: float = 1e-3, env: str = "CartPole-v1", *, budget: int = 20_000):
    config = for_environment(env)
    config.policies["default"].trainer.args["lr"] = lr
    config.stop.env_frames = budget
    return config
"""


def test_a_python_files_function_takes_its_arguments_as_a_registered_experiment_does(tmp_path):
    """``troupe run my_exp.py lr=0.01`` for ``def experiment(lr=1e-3)`` was "lr: unknown
    key": a registered experiment's function took its arguments (``troupe run ppo
    env=Acrobot-v1``), a file's took none, and neither did a file's ``base:`` mapping."""
    (tmp_path / "exp.py").write_text(TAKES_ARGUMENTS)
    exp = str(tmp_path / "exp.py")
    config = load_experiment(exp, ["lr=0.01", "env=Acrobot-v1", "budget=5e3", "seed=4"])
    assert config.policies["default"].trainer.args["lr"] == 0.01
    assert config.environment.type == "Acrobot-v1" and config.stop.env_frames == 5000
    assert config.seed == 4  # a config key stays an override
    with pytest.raises(ConfigError, match=r"lrr: unknown key; did you mean 'lr' \(an argument of "
                       r"experiment '.*exp.py:experiment'\)\?"):  # fmt: skip
        load_experiment(exp, ["lrr=0.01"])
    (tmp_path / "on.yaml").write_text("base: {experiment: exp.py, lr: 0.02}\nseed: 2\n")
    based = load_experiment(str(tmp_path / "on.yaml"))
    assert based.policies["default"].trainer.args["lr"] == 0.02 and based.seed == 2
    assert str((tmp_path / "exp.py").resolve()) in based.code.imports  # workers import it too
    (tmp_path / "bad.yaml").write_text("base: {experiment: exp.py, lrr: 0.02}\n")
    with pytest.raises(UserError, match=r"bad.yaml: base: .*exp.py:experiment\(\) with \{'lrr'"):
        load_experiment(str(tmp_path / "bad.yaml"))


@pytest.mark.multiprocess
@pytest.mark.parametrize("suffix", [".yaml", ".toml", ".py"])
def test_show_config_json_of_a_file_is_what_run_resolves(files, suffix):
    result = troupe("show-config", str(files / f"exp{suffix}"), "seed=9", "--json", cwd=files)
    assert result.returncode == 0, result.stderr[-3000:]
    shown = ExperimentConfig.from_dict(json.loads(result.stdout))
    expected = load_experiment(str(files / f"exp{suffix}"), ["seed=9"])
    assert _comparable(shown) == _comparable(expected)
    assert shown.seed == 9 and shown.policies["default"].trainer.args["lr"] == 0.01


# --------------------------------------------------------------------- bad overrides
P = "policies.default."
BAD_OVERRIDES = [
    # (override, what the error must say: the key and the fix)
    ("nmae=x", ["nmae", "name"]),
    ("environment.typ=x", ["environment.typ", "'type'"]),
    (P + "policy.args.hiden_sizes=[8]", [P + "policy.args.hiden_sizes", "'hidden_sizes'"]),
    ("policies.default.trainer.args.lrr=0.1", ["policies.default.trainer.args.lrr", "'lr'"]),
    ("policies.default.batch_segmens=4", ["policies.default.batch_segmens", "'batch_segments'"]),
    ("actors.worker=2", ["actors.worker", "'workers'"]),
    ("evaluation.episods=3", ["evaluation.episods", "'episodes'"]),
    ("stop.env_frame=5", ["stop.env_frame", "'env_frames'"]),
    ("sed=1", ["sed", "'seed'"]),
    (P + "trainer.args.lr=abc", [P + "trainer.args.lr", "expected float", "'abc'"]),
    ("stop.env_frames=-5", ["stop.env_frames", "more than 0", "-5"]),
    ("trainer.lerning_rate=1e-3", ["trainer.lerning_rate", "policies.default.trainer.args.lr"]),
    # component arguments out of the range their class declares (arg_ranges)
    (P + "trainer.args.gamma=1.5", [P + "trainer.args.gamma: must be in [0, 1], got 1.5"]),
    (P + "trainer.args.lr=-1", [P + "trainer.args.lr: must be more than 0, got -1"]),
    (P + "trainer.args.clip=-0.2", [P + "trainer.args.clip: must be more than 0, got -0.2"]),
    (P + "trainer.args.epochs=0", [P + "trainer.args.epochs: must be at least 1, got 0"]),
    (P + "trainer.args.minibatches=0", [P + "trainer.args.minibatches: must be at least 1"]),
    (P + "policy.args.hidden_sizes=[64,0]",
     [P + "policy.args.hidden_sizes: every entry must be at least 1, got [64, 0]"]),
]  # fmt: skip


@pytest.mark.multiprocess
@pytest.mark.parametrize(("override", "expected"), BAD_OVERRIDES, ids=[b[0] for b in BAD_OVERRIDES])
def test_a_bad_override_fails_before_anything_starts(tmp_path, override, expected):
    result = troupe("run", "cartpole-ppo", override, "--no-display", cwd=tmp_path)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    out = result.stdout + result.stderr
    assert "invalid experiment configuration" in out, out[-3000:]
    for text in expected:
        assert text in out, f"{text!r} not in: {out[-3000:]}"
    assert "Traceback" not in out
    # no run folder, so no controller and no worker was started
    assert not (tmp_path / "runs").exists(), list((tmp_path / "runs").rglob("*"))
    assert "run folder:" not in out


@pytest.mark.parametrize(
    ("experiment", "override", "expected"),
    [
        ("cartpole-dqn", "tau=0", "tau: must be in (0, 1], got 0"),
        ("cartpole-dqn", "target_update_every=0", "target_update_every: must be at least 1, got 0"),
        ("pendulum-sac", "tau=1.5", "tau: must be in (0, 1], got 1.5"),
        ("pendulum-sac", "initial_alpha=0", "initial_alpha: must be more than 0, got 0"),
        ("cartpole-ppo", "gae_lambda=-0.1", "gae_lambda: must be in [0, 1], got -0.1"),
    ],
)
def test_off_policy_trainer_arguments_are_range_checked_too(experiment, override, expected):
    with pytest.raises(ConfigError) as e:
        load_experiment(experiment, [P + "trainer.args." + override])
    assert e.value.errors == [P + "trainer.args." + expected]


def test_evaluation_environment_arguments_are_checked_as_the_environment_s_own():
    """``evaluation.env_args`` go to the evaluation actors' environments: a misspelt one ended
    the run in the evaluation actor's constructor."""
    config = load_experiment("cartpole-ppo", ["evaluation.env_args.max_episode_steps=20"])
    assert config.evaluation.env_args == {"max_episode_steps": 20}
    assert config.environment.args.get("max_episode_steps") != 20  # training's stay its own
    for override, expected in (
        ("max_episode_step=20", "evaluation.env_args.max_episode_step: unknown key for "
                                "'CartPole-v1'; did you mean 'max_episode_steps'?"),
        ("max_episode_steps=ten", "evaluation.env_args.max_episode_steps: expected int or None, "
                                  "got str 'ten'"),
    ):  # fmt: skip
        with pytest.raises(ConfigError) as e:
            load_experiment("cartpole-ppo", [f"evaluation.env_args.{override}"])
        assert e.value.errors == [expected]


def test_a_misspelt_gymnasium_argument_fails_the_check():
    with pytest.raises(ConfigError, match="max_episode_step"):
        load_experiment("cartpole-ppo", ["environment.args.max_episode_step=100"])


@pytest.mark.parametrize(
    "override, expected",
    [
        ("max_episode_steps=ten", "max_episode_steps: expected int or None, got str 'ten'"),
        ("max_episode_steps=1.5", "max_episode_steps: expected int or None, got float 1.5"),
        ("max_episode_steps=0", "max_episode_steps: must be at least 1, got 0"),
        ("disable_env_checker=1", "disable_env_checker: expected bool, got int 1"),
        ("sutton_barto_reward=yes", "sutton_barto_reward: expected bool, got str 'yes'"),
    ],
)
def test_a_gymnasium_argument_of_the_wrong_type_fails_the_check(override, expected):
    """`environment.args.max_episode_steps=ten` passed the check; every worker then failed
    building the environment ("Expect the max_episode_steps to be an integer"), exit 1."""
    with pytest.raises(ConfigError) as e:
        load_experiment("cartpole-ppo", ["environment.args." + override])
    assert e.value.errors == ["environment.args." + expected]


def test_gymnasium_arguments_the_environment_takes_pass_the_check():
    config = load_experiment(
        "cartpole-ppo",
        ["environment.args.max_episode_steps=100", "environment.args.sutton_barto_reward=True"],
    )
    assert config.environment.args["max_episode_steps"] == 100


@pytest.mark.multiprocess
def test_a_constructor_refusing_its_arguments_in_a_worker_ends_the_run_at_once(tmp_path):
    """What only the constructor can judge (here a linear schedule without total_steps) fails
    in the trainer worker: the run ends on that error, naming it, with no restart."""
    result = troupe(
        "run", "cartpole-ppo", P + "trainer.args.lr_schedule=linear", "stop.eval_return=None",
        "--no-display", cwd=tmp_path,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()  # it passed the check: workers were started
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "failed", summary
    assert "ValueError: lr_schedule='linear' needs total_steps" in summary["failure"], summary
    workers = json.loads((run_dir / "workers.json").read_text())
    assert sum(w["restarts"] for w in workers.values()) == 0, workers


def test_a_replay_beta_past_one_is_refused():
    """An importance exponent above 1 over-corrects; ``replay.beta=2`` was accepted."""
    with pytest.raises(ConfigError) as e:
        load_experiment("cartpole-dqn", [P + "replay.beta=2"])
    assert e.value.errors == [
        P + "replay.beta: must be in [0, 1] (1: full importance correction), got 2.0"
    ]


def test_a_file_whose_base_is_set_up_on_its_own_environment_imports_that_first(tmp_path):
    """``base: {experiment: ppo, env: Corridor-v0}`` beside ``code: {imports: [my_envs.py]}``,
    where ``my_envs.py`` registers Corridor-v0: the base was resolved before the file's imports
    ran, so "unknown environment 'Corridor-v0'" for a file that says where it is."""
    corridor = (ROOT / "tests" / "distributed" / "user_code" / "corridor.py").read_text()
    code = corridor.split('if __name__ == "__main__":')[0]
    (tmp_path / "my_envs.py").write_text(code + 'register("Corridor-v0", Corridor, length=6)\n')
    (tmp_path / "exp.yaml").write_text(
        "base: {experiment: ppo, env: Corridor-v0}\n"
        "code: {imports: [my_envs.py]}\n"
        "stop: {env_frames: 5000}\n"
    )
    shown = troupe("show-config", str(tmp_path / "exp.yaml"), "--json", cwd=tmp_path.parent)
    assert shown.returncode == 0, shown.stderr
    config = json.loads(shown.stdout)
    assert config["environment"]["type"] == "Corridor-v0"
    assert config["code"]["imports"] == [str(tmp_path / "my_envs.py")]
    assert config["stop"]["env_frames"] == 5000
