"""The ``troupe`` command line: list, test-env and a run's stop line, as a subprocess and
in-process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from api import environment, registry
from distributed.cli import main, parse_kwargs


def troupe(*args: str) -> subprocess.CompletedProcess:
    """Run the CLI the way a user does, in a fresh process, with wide output (no wrapping)."""
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "distributed.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")


def test_list_shows_every_section():
    result = troupe("list")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for heading in (
        "Environments (",
        "Gymnasium ids (",
        "Policies (",
        "Trainers (",
        "Experiments (",
    ):
        assert heading in out
    assert "GridGather-v0" in out and "agents gather coins in turns" in out
    assert "CartPole-v1, CartPole-v1" not in out and "CartPole-v0, CartPole-v1" in out
    assert "actor-critic" in out and "ppo" in out and "cartpole-ppo" in out


def test_list_shows_what_your_files_register_with_troupe_and_with_gymnasium(tmp_path):
    code = tmp_path / "switches.py"
    code.write_text(SWITCHES_ENV)
    result = troupe("list", "--import", str(code))
    assert result.returncode == 0, result.stderr
    own = result.stdout.split("Gymnasium ids (")[0]
    assert re.search(r"TroupeTestSwitches-v0 +│ gymnasium \(your code\)", own), own


def test_test_env_cartpole_passes():
    result = troupe("test-env", "CartPole-v1")
    assert result.returncode == 0, result.stderr
    assert "CartPole-v1: passed" in result.stdout
    assert "episodes finished" in result.stdout


def test_misspelled_name_gets_a_suggestion_and_no_traceback():
    result = troupe("test-env", "CartPol-v1")
    assert result.returncode == 1
    assert "error: unknown environment 'CartPol-v1'. Did you mean 'CartPole-v1'" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_test_env_passes_key_value_arguments(wide, capsys):
    code = main(["test-env", "GridGather-v0", "n_agents=3", "size=6", "--steps", "60"])
    out = capsys.readouterr().out
    assert code == 0
    assert "GridGather-v0: passed" in out
    assert "agents             3" in out and "Box(0.0, 1.0, (6, 6), float32)" in out
    assert "steps run          60" in out


def test_test_env_no_stepping(wide, capsys):
    assert main(["test-env", "GridGather-v0", "--no-stepping", "--seed", "3"]) == 0
    assert "not checked (test_stepping=False)" in capsys.readouterr().out


def test_broken_environment_fails_with_the_message_in_red(wide, capsys):
    environment.register("test-cli-broken", "legacy.environment.grid_gather:GridGatherEnvironment")
    try:
        code = main(["test-env", "test-cli-broken", "n_agents=0"])
    finally:
        registry.environments.unregister("test-cli-broken")
    err = capsys.readouterr().err
    assert code == 1
    assert "error: building environment 'test-cli-broken' raised ValueError: GridGather: " in err
    assert "n_agents must be at least 1, got 0" in err


def test_bad_argument_form_is_a_user_error(wide, capsys):
    assert main(["test-env", "GridGather-v0", "size"]) == 1
    assert "argument 'size' must look like key=value, e.g. size=8" in capsys.readouterr().err


def test_unknown_constructor_argument_is_reported(wide, capsys):
    assert main(["test-env", "GridGather-v0", "sise=6"]) == 1
    assert "got an unexpected keyword argument 'sise'" in capsys.readouterr().err


def test_parse_kwargs_reads_literals_else_strings():
    assert parse_kwargs(["size=8", "rate=0.5", "flag=True", "mode=hard", "shape=(2, 3)"]) == {
        "size": 8,
        "rate": 0.5,
        "flag": True,
        "mode": "hard",
        "shape": (2, 3),
    }


def test_key_value_text_reads_the_same_for_env_arguments_and_overrides():
    """One parser: ``troupe test-env ... flag=true`` and ``troupe run ... x=true`` agree."""
    from api.config import make_experiment

    kwargs = parse_kwargs(["flag=true", "off=FALSE", "nothing=none"])
    assert kwargs == {"flag": True, "off": False, "nothing": None}
    config = make_experiment("cartpole-ppo", ["policies.default.policy.args.shared_backbone=true"])
    assert config.policies["default"].policy.args["shared_backbone"] is True


def test_missing_subcommand_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["train", "CartPole-v1", "--no-panel"], "--no-panel (did you mean --no-display?)"),
        (["run", "cartpole-ppo", "--rundir", "x"], "(did you mean --run-dir?)"),
        (["status", "runs/x", "--bogus"], "troupe status: error: unrecognized arguments: --bogus"),
    ],
)
def test_an_unknown_option_is_named_with_its_subcommand_and_the_nearest_option(argv, says, capsys):
    """The usage shown is the subcommand's, not ``troupe [-h] [-v] COMMAND ...``, which
    lists none of the options the user was looking for."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = " ".join(capsys.readouterr().err.split())
    assert e.value.code == 2
    assert f"usage: troupe {argv[0]} " in err and says in err, err


def test_a_run_prints_its_stop_rule_and_where_the_target_came_from():
    from api.resolve import load_experiment
    from distributed.launch.run_lines import stop_rule

    assert stop_rule(load_experiment("Pendulum-v1").stop) == (
        "stop at: greedy evaluation return -300 (Troupe's default for Pendulum-v1, which "
        "declares no reward_threshold), or 500000 env frames"
    )
    overridden = load_experiment("Pendulum-v1", ["stop.eval_return=-200"])
    assert stop_rule(overridden.stop) == (
        "stop at: greedy evaluation return -200 (given: stop.eval_return=-200), or 500000 env "
        "frames"
    )
    assert stop_rule(load_experiment("cartpole-ppo", ["stop.wall_seconds=30.5"]).stop) == (
        "stop at: greedy evaluation return 475, or 500000 env frames, or 30.5 seconds"
    )
    pbt = load_experiment("cartpole-pbt", ["pbt.target_return=400"])
    assert stop_rule(pbt.stop, pbt_target=400.0) == (
        "stop at: a PBT member's score 400, or 3000000 env frames, or 1200 seconds"
    )


def test_a_target_source_a_python_experiment_outdated_is_not_said(tmp_path):
    """A file's function that set ``eval_return = None`` over the sac recipe's target started
    with "no evaluation target (Troupe's default for Pendulum-v1, which declares no
    reward_threshold)"."""
    from api.resolve import load_experiment
    from distributed.launch.run_lines import stop_rule

    (tmp_path / "exp.py").write_text(
        "from api.resolve import for_environment\n"
        "def experiment():\n"
        "    config = for_environment('Pendulum-v1', algo='sac')\n"
        "    config.stop.eval_return = None\n"
        "    return config\n"
    )
    assert stop_rule(load_experiment(str(tmp_path / "exp.py")).stop) == (
        "stop at: 100000 env frames"
    )
    untargeted = load_experiment("GridGather-v0", ["target=3"])
    assert stop_rule(untargeted.stop).startswith("stop at: greedy evaluation return 3 (given:")


def test_a_run_of_several_policies_says_which_agents_each_plays():
    from distributed.launch.run_lines import seats_line

    assert seats_line(["adversary", "adversary", "agent"]) == (
        "policies: adversary plays agents 0 and 1, agent plays agent 2"
    )
    assert seats_line(["red", "blue", "red", "red"]) == (
        "policies: red plays agents 0, 2 and 3, blue plays agent 1"
    )
    assert seats_line([]) is None and seats_line(["default", "default"]) is None


def test_a_frame_budget_below_one_trainer_step_is_warned_about(tmp_path, caplog):
    """`troupe train CartPole-v1 frames=100` stopped as asked (exit 0) having trained nothing:
    the run now says so before it starts. A budget of one step or more says nothing."""
    import json
    import logging

    from distributed.launch.run import prepare
    from system import run_folder
    from system.run import folder_lock
    from system.run.report import METRICS_FILE

    with caplog.at_level(logging.WARNING, logger="distributed.launch.budget"):
        for frames, folder in ((100, "short"), (1024, "enough")):
            config, run_dir = prepare("cartpole-ppo", [f"stop.env_frames={frames}"],
                                      str(tmp_path / folder), None)  # fmt: skip
            folder_lock.release(run_dir)
    (record,) = caplog.records
    assert record.getMessage() == (
        "stop.env_frames=100 ends the run before policy 'default' trains once: a trainer step "
        "takes 1024 frames (batch_segments 16 x actors.segment_length 64)"
    )
    # a resume counts what is left: its budget raised by less than a step trains nothing more
    caplog.clear()
    (run_dir / run_folder.CONFIG).write_text(json.dumps(config.to_dict()))
    (run_dir / METRICS_FILE).write_text('{"wall_s": 14.4, "env_frames": 3810}\n')
    with caplog.at_level(logging.WARNING, logger="distributed.launch.budget"):
        for frames in (4000, 4834):
            prepare(None, [f"stop.env_frames={frames}"], None, str(run_dir))
            folder_lock.release(run_dir)
    (record,) = [r for r in caplog.records if r.name == "distributed.launch.budget"]
    assert record.getMessage() == (
        "stop.env_frames=4000 ends the run 190 frames after this resume (it has 3810), before "
        "policy 'default' trains once: a trainer step takes 1024 frames (batch_segments 16 x "
        "actors.segment_length 64)"
    )


def test_a_target_set_for_another_episode_length_is_warned_about(tmp_path, caplog):
    """`troupe run cartpole-ppo environment.args.max_episode_steps=100` kept gymnasium's 475,
    set for episodes of 500 steps: out of reach, the run went to its frame budget unwarned. A
    target of one's own, or the id's own length, says nothing."""
    import logging

    from distributed.launch.run import prepare
    from system.run import folder_lock

    runs = [
        ["environment.args.max_episode_steps=100"],
        ["environment.args.max_episode_steps=100", "stop.eval_return=95"],
        ["environment.args.max_episode_steps=500"],
        # the target is judged on evaluation's episodes: their length is what counts
        ["evaluation.env_args.max_episode_steps=50"],
        ["environment.args.max_episode_steps=100", "evaluation.env_args.max_episode_steps=500"],
    ]
    with caplog.at_level(logging.WARNING, logger="distributed.launch.budget"):
        for i, overrides in enumerate(runs):
            _, run_dir = prepare("cartpole-ppo", overrides, str(tmp_path / str(i)), None)
            folder_lock.release(run_dir)
    said = [record.getMessage() for record in caplog.records]
    assert said == [
        "stop.eval_return=475 is gymnasium's reward_threshold for CartPole-v1, set for episodes "
        f"of 500 steps; with {where}.max_episode_steps={steps} it may be out of reach, or "
        "too easy: give a target of its own (stop.eval_return=...), or None to run to the budget"
        for where, steps in (("environment.args", 100), ("evaluation.env_args", 50))
    ]


def test_a_replay_resume_with_less_than_a_round_of_segments_left_is_warned_about(tmp_path, caplog):
    """`troupe run --resume RUN stop.env_frames=<59 more>` of cartpole-dqn stopped on the
    actors' first segments (1568 frames on) before its trainer was up: exit 0, nothing more
    trained, nothing said. It is now said; a round of segments or more says nothing."""
    import json
    import logging

    from distributed.launch.run import prepare
    from system import run_folder
    from system.run import folder_lock
    from system.run.report import METRICS_FILE

    config, run_dir = prepare("cartpole-dqn", [], str(tmp_path / "run"), None)
    folder_lock.release(run_dir)
    (run_dir / run_folder.CONFIG).write_text(json.dumps(config.to_dict()))
    (run_dir / METRICS_FILE).write_text('{"wall_s": 14.4, "env_frames": 8641}\n')
    with caplog.at_level(logging.WARNING, logger="distributed.launch.budget"):
        for frames in (8700, 8641 + 512):
            prepare(None, [f"stop.env_frames={frames}"], None, str(run_dir))
            folder_lock.release(run_dir)
    (record,) = [r for r in caplog.records if r.name == "distributed.launch.budget"]
    assert record.getMessage() == (
        "stop.env_frames=8700 ends the run 59 frames after this resume (it has 8641), less than "
        "one segment from each actor (512 frames: actors.workers 1 x envs_per_worker 32 x "
        "segment_length 16): it may stop before policy 'default' trains again"
    )


def test_show_config_shows_what_train_runs_with_an_algo(capsys):
    """`troupe show-config ENV` showed only what `troupe train ENV` runs (PPO); `--algo` shows
    the config `troupe train ENV --algo ALGO` would run."""
    import json

    assert main(["show-config", "CartPole-v1", "--algo", "dqn", "--json"]) == 0
    config = json.loads(capsys.readouterr().out)
    assert config["name"] == "cartpole-v1-dqn"
    assert config["policies"]["default"]["trainer"]["type"] == "dqn"
    assert main(["show-config", "CartPole-v1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "cartpole-v1-ppo"


def test_train_takes_the_launcher_image_and_secure_options_of_run(monkeypatch):
    """`troupe.train(ENV, launcher="docker")` ran in containers; `troupe train ENV --launcher
    docker` was refused as an unrecognised argument, and so were --image and --secure."""
    from distributed.launch import run_commands

    seen = {}
    monkeypatch.setattr(run_commands, "run_run", lambda args, console: seen.update(vars(args)))
    argv = ["train", "CartPole-v1", "--launcher", "docker", "--image", "mine:1", "--secure"]
    main([*argv, "frames=1000"])
    assert (seen["launcher"], seen["image"], seen["secure"]) == ("docker", "mine:1", True)
    assert seen["experiment"] == "auto" and seen["resume"] is None  # ppo, or a preset
    main(["train", "CartPole-v1"])
    assert (seen["launcher"], seen["image"], seen["secure"]) == ("local", None, False)


def test_show_config_shows_the_keys_under_a_key(capsys):
    """`troupe show-config cartpole-ppo` printed some 400 lines, through which a user looked
    for one key."""
    import json

    argv = ["show-config", "cartpole-ppo", "--key", "lr", "--key", "stop.env_frames", "--json"]
    assert main([*argv, "stop.env_frames=1e5"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown == {"policies.default.trainer.args.lr": 0.002, "stop.env_frames": 100000}
    assert main(["show-config", "cartpole-ppo", "--key", "trainer"]) == 0
    out = capsys.readouterr().out
    assert "policies.default.trainer.args.clip = 0.2" in out and "stop." not in out
    assert main(["show-config", "cartpole-ppo", "--key", "lrr"]) == 1
    said = " ".join(capsys.readouterr().err.split())
    assert "no key of this experiment is or holds 'lrr'; did you mean 'lr'" in said
    assert main(["show-config", "cartpole-ppo", "--key", "ainer"]) == 1  # parts whole, not cut


def test_show_config_takes_a_key_without_a_value_as_a_key_to_show(capsys):
    """`troupe show-config cartpole-ppo lr` was refused: "lr: an override must look like
    key.path=value"; a word without '=' can only be a key to show."""
    import json

    argv = ["show-config", "cartpole-ppo", "lr", "stop.env_frames", "stop.env_frames=1e5"]
    assert main([*argv, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown == {"policies.default.trainer.args.lr": 0.002, "stop.env_frames": 100000}


def test_show_config_suggests_our_name_for_another_librarys(capsys):
    """`--key learning_rate` found nothing and suggested nothing: the suggestion matched
    spellings alone, not the names other libraries use (which `troupe train` already knew)."""
    assert main(["show-config", "cartpole-ppo", "--key", "learning_rate"]) == 1
    said = " ".join(capsys.readouterr().err.split())
    assert "holds 'learning_rate'; did you mean 'lr'?" in said
    assert main(["show-config", "cartpole-ppo", "--key", "trainer.args.ent_coef"]) == 1
    said = " ".join(capsys.readouterr().err.split())
    assert "did you mean 'trainer.args.entropy_coef'?" in said


def test_test_pipeline_checks_what_train_runs_with_an_algo(capsys):
    """`troupe test-pipeline ENV --algo dqn` checks the pipeline `troupe train ENV --algo dqn`
    runs (it refused --algo: only `troupe train` and show-config took it)."""
    assert main(["test-pipeline", "Blackjack-v1", "--algo", "dqn", "--trainer-steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "pipeline ok (experiment 'blackjack-v1-dqn')" in out
    assert re.search(r"policy 'default' \(dqn\): \d+ trainer steps", out)


NESTED_TUPLE_ENV = """
import gymnasium as gym


class Hands(gym.Env):
    \"\"\"A Tuple in a Tuple: (a hand of (card, position), a seat); reward for action 1.\"\"\"

    hand = gym.spaces.Tuple([gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,))])
    observation_space = gym.spaces.Tuple([hand, gym.spaces.Discrete(4)])
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), float(action), self.t >= 20, False, {}


gym.register("TroupeTestHands-v0", entry_point=Hands)
"""


@pytest.mark.parametrize("algo", ["ppo", "impala", "dqn"])
def test_a_tuple_inside_a_tuple_observation_trains(algo, tmp_path, capsys):
    """Nested Tuples (a Dict in a Dict once keyed) were refused by the encoders, and the actors'
    lanes could not stack a dict inside a dict."""
    import gymnasium as gym

    from api import registry

    code = tmp_path / "hands.py"
    code.write_text(NESTED_TUPLE_ENV)
    argv = ["test-pipeline", "TroupeTestHands-v0", "--import", str(code), "--algo", algo]
    try:
        assert main([*argv, "--trainer-steps", "2"]) == 0, capsys.readouterr()
    finally:  # each case's file registers the id afresh
        gym.registry.pop("TroupeTestHands-v0", None)
        registry.environments.unregister("TroupeTestHands-v0")
    assert f"pipeline ok (experiment 'troupetesthands-v0-{algo}')" in capsys.readouterr().out


SWITCHES_ENV = """
import gymnasium as gym
import numpy as np


class Switches(gym.Env):
    \"\"\"Four switches to set as the observation says; each action must be in the space.\"\"\"

    observation_space = gym.spaces.MultiBinary(4)
    action_space = gym.spaces.MultiBinary([2, 2])

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.want = 0, self.np_random.integers(0, 2, 4).astype(np.int8)
        return self.want, {}

    def step(self, action):
        assert self.action_space.contains(action), f"not a MultiBinary([2, 2]) action: {action!r}"
        reward = float(np.mean(np.asarray(action).reshape(-1) == self.want))
        self.t, self.want = self.t + 1, self.np_random.integers(0, 2, 4).astype(np.int8)
        return self.want, reward, self.t >= 20, False, {}


gym.register("TroupeTestSwitches-v0", entry_point=Switches)
"""


@pytest.mark.parametrize("algo", ["ppo", "impala", "dqn"])
def test_multi_binary_actions_are_taken_by_the_actor_critic_algorithms(algo, tmp_path, capsys):
    """A MultiBinary action space had no built-in algorithm: the actor-critic policy now acts
    in it as two-way choices; dqn (Discrete only) says which algorithms do."""
    import gymnasium as gym

    from api import registry

    code = tmp_path / "switches.py"
    code.write_text(SWITCHES_ENV)
    argv = ["test-pipeline", "TroupeTestSwitches-v0", "--import", str(code), "--algo", algo]
    try:
        rc = main([*argv, "--trainer-steps", "2"])
    finally:
        gym.registry.pop("TroupeTestSwitches-v0", None)
        registry.environments.unregister("TroupeTestSwitches-v0")
    out, err = capsys.readouterr()
    if algo == "dqn":
        assert rc != 0 and "MultiBinary actions; dqn acts in Discrete" in err
        assert "use --algo ppo (or impala)" in err
    else:
        assert rc == 0, out + err
        assert f"pipeline ok (experiment 'troupetestswitches-v0-{algo}')" in out


PARTS_ENV = """
import gymnasium as gym
import numpy as np


class Parts(gym.Env):
    \"\"\"A Dict of discrete parts, or a Tuple of Box parts; each action must be in the space.\"\"\"

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    def __init__(self, boxes=False):
        self.action_space = (
            gym.spaces.Tuple((gym.spaces.Box(-1, 1, (2,)), gym.spaces.Box(0, 1, (1,))))
            if boxes else
            gym.spaces.Dict({"move": gym.spaces.Discrete(3, start=1),
                             "fire": gym.spaces.MultiBinary(2)})
        )

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        assert self.action_space.contains(action), f"not one of {self.action_space}: {action!r}"
        self.t += 1
        return np.zeros(2, np.float32), 1.0, self.t >= 20, False, {}


gym.register("TroupeTestParts-v0", entry_point=Parts)
gym.register("TroupeTestBoxParts-v0", entry_point=Parts, kwargs={"boxes": True})
"""


@pytest.mark.parametrize(
    "algo, boxes, ok",
    [("ppo", False, True), ("impala", False, True), ("dqn", False, False),
     ("ppo", True, True), ("sac", True, True)],
)  # fmt: skip
def test_dict_and_tuple_actions_of_one_kind_are_taken(algo, boxes, ok, tmp_path, capsys):
    """Every experiment refused a Dict or Tuple action space; one of only discrete parts is now
    acted in as a MultiDiscrete, one of only Box parts as a Box, and the environment (which
    asserts it) gets each action in its own shape."""
    import gymnasium as gym

    from api import registry

    code = tmp_path / "parts.py"
    code.write_text(PARTS_ENV)
    env = "TroupeTestBoxParts-v0" if boxes else "TroupeTestParts-v0"
    argv = ["test-pipeline", env, "--import", str(code), "--algo", algo]
    try:
        rc = main([*argv, "--trainer-steps", "2"])
    finally:
        for name in ("TroupeTestParts-v0", "TroupeTestBoxParts-v0"):
            gym.registry.pop(name, None)
            registry.environments.unregister(name)
    out, err = capsys.readouterr()
    if ok:
        assert rc == 0, out + err
        assert f"pipeline ok (experiment '{env.lower()}-{algo}')" in out
    else:
        assert rc != 0 and "MultiDiscrete actions; dqn acts in Discrete" in err, out + err


def test_algo_with_an_experiment_says_it_takes_an_environment(capsys):
    """`--algo dqn` on `cartpole-ppo` read the experiment as an environment ("unknown
    environment 'cartpole-ppo'")."""
    assert main(["test-pipeline", "cartpole-ppo", "--algo", "dqn"]) != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "'cartpole-ppo' is an experiment, with its own algorithm: `troupe run cartpole-ppo`" in (
        err
    )
    assert "--algo and algo= take an environment id" in err


def test_train_of_an_experiment_says_troupe_run_runs_it(capsys):
    """`troupe train cartpole-ppo` said "unknown environment 'cartpole-ppo'"."""
    assert main(["train", "cartpole-ppo", "--no-display"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "'cartpole-ppo' is an experiment, with its own algorithm: `troupe run cartpole-ppo`" in (
        err
    )


def test_test_pipeline_from_python_takes_an_algo():
    """`troupe.test_pipeline(ENV)` checked PPO only; `troupe test-pipeline ENV --algo dqn` had
    no Python form but building the experiment by hand."""
    from api import testing
    from api.errors import PipelineCheckError

    report = testing.test_pipeline("Blackjack-v1", algo="dqn", trainer_steps=2)
    assert report.experiment == "blackjack-v1-dqn" and report.trainers == {"default": "dqn"}
    assert report.trainer_steps["default"] >= 2
    with pytest.raises(PipelineCheckError, match="give the environment alone"):
        testing.test_pipeline(experiment="cartpole-ppo", algo="dqn")


def test_runs_started_in_the_same_second_get_folders_of_their_own(tmp_path, monkeypatch):
    """A sweep of `troupe.train(..., background=True)` calls: the default folder is named to
    the second, and the second run was refused ("run folder ... is not empty")."""
    from distributed.launch import run
    from system.run import folder_lock

    monkeypatch.chdir(tmp_path)
    same_second = Path("runs") / "cartpole-ppo-20261203-134146"  # every call in one second
    monkeypatch.setattr(run, "default_run_dir", lambda experiment: same_second)
    overrides = ["stop.eval_return=None", "stop.env_frames=5000"]
    folders = []
    try:
        for _ in range(3):
            folders.append(run.prepare("cartpole-ppo", overrides, None, None)[1])
            (folders[-1] / "config.json").write_text("{}")  # as a started run leaves it
    finally:
        for folder in folders:
            folder_lock.release(folder)
    assert [f.name for f in folders] == [
        "cartpole-ppo-20261203-134146",
        "cartpole-ppo-20261203-134146-2",
        "cartpole-ppo-20261203-134146-3",
    ]


def test_a_port_out_of_range_is_refused_before_a_run_folder_is_made(tmp_path):
    """``--metrics-port 99999`` ended in the controller's ``bind()`` traceback, a run folder
    left behind."""
    for port in ("99999", "-1", "http"):
        result = troupe("run", "cartpole-ppo", "--run-dir", str(tmp_path / "r"),
                        f"--metrics-port={port}")  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert f"'{port}': a port number from 0 to 65535" in result.stderr
        assert not (tmp_path / "r").exists()


def test_a_taken_metrics_port_is_refused_before_a_run_folder_is_made(tmp_path, capsys):
    """A second run on a port the first serves failed in its controller and left a folder
    that ``--run-dir`` refused ("not empty") and ``--resume`` too ("no config.json")."""
    import socket

    import troupe
    from api.errors import UserError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        folder = tmp_path / "r"
        assert (
            main(["run", "cartpole-ppo", "--run-dir", str(folder), f"--metrics-port={port}"]) == 1
        )
        said = " ".join(capsys.readouterr().err.split())
        assert f"cannot serve metrics on port {port}: Address already in use" in said, said
        with pytest.raises(UserError, match=f"cannot serve metrics on port {port}"):
            troupe.train("cartpole-ppo", run_dir=folder, metrics_port=port)
        assert not folder.exists()


def test_eval_of_no_episodes_is_refused_before_anything_starts(tmp_path):
    """``troupe eval RUN --episodes 0`` started the workers, then ended in numpy's "zero-size
    array" traceback; ``troupe.evaluate(run, episodes=0)`` too."""
    import troupe as troupe_api
    from api.errors import UserError

    for flag, value in (("--episodes", "0"), ("--episodes", "-3"), ("--envs", "0")):
        result = troupe("eval", str(tmp_path), flag, value)
        assert result.returncode == 2, result.stderr
        assert f"argument {flag}: must be at least 1, got {value}" in result.stderr
    with pytest.raises(UserError, match="episodes must be a whole number of at least 1, got 0"):
        troupe_api.evaluate(tmp_path, episodes=0)


@pytest.mark.parametrize(
    "argv",
    [
        ["eval", "RUN", "--video", "v.gif", "--video-episodes", "-2"],
        ["test-env", "CartPole-v1", "--steps", "-5"],  # it passed, having stepped nothing
        ["test-pipeline", "cartpole-ppo", "--trainer-steps", "0"],  # "pipeline ok", no step
        ["test-pipeline", "cartpole-ppo", "--episodes", "-1"],
    ],
)
def test_counts_below_one_are_refused_by_the_check_and_eval_commands(argv, capsys):
    from distributed.cli import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    assert "must be at least 1, got" in capsys.readouterr().err


def test_video_episodes_without_a_video_is_refused(tmp_path):
    """It was ignored without a word."""
    result = troupe("eval", str(tmp_path), "--video-episodes", "3")
    assert result.returncode == 1, result.stderr
    assert "--video-episodes is for the video: name its file with --video" in result.stdout + (
        result.stderr
    )


@pytest.mark.parametrize("name", ["clip", "clip.webm"])
def test_a_video_file_of_no_known_format_is_refused_before_anything_is_played(tmp_path, name):
    """``--video clip`` played every episode (a whole Pong game), then ended in imageio's
    ``KeyError: None``. The folder here holds no run at all: the name is refused first."""
    result = troupe("eval", str(tmp_path), "--video", str(tmp_path / name))
    assert result.returncode == 1, result.stderr
    said = " ".join((result.stdout + result.stderr).split())
    assert f"--video {tmp_path / name}: name a .mp4 or .gif file" in said, said
    assert "Traceback" not in said and not list(tmp_path.iterdir())


def test_one_string_for_a_list_of_overrides_or_imports_is_refused_in_one_line(tmp_path):
    """`troupe.train("cartpole-ppo", "seed=3")` was read a character at a time: six errors,
    "s: an override must look like key.path=value", ...; `imports="my.py"`: "cannot import
    module 'm'"."""
    import troupe as troupe_api
    from api.config import make_experiment
    from api.errors import ConfigError

    folder = tmp_path / "r"
    with pytest.raises(ConfigError, match=r"overrides: a list of strings, not one string: write "
                                          r"\['seed=3'\]"):  # fmt: skip
        troupe_api.train("cartpole-ppo", "seed=3", run_dir=folder)
    with pytest.raises(ConfigError, match=r"imports: a list .* write \['my.py'\]"):
        troupe_api.train("cartpole-ppo", imports="my.py", run_dir=folder)
    with pytest.raises(ConfigError, match=r"overrides: a list of strings"):
        make_experiment("cartpole-ppo", "seed=3")
    assert not folder.exists()


def test_train_from_python_refuses_a_bad_algo_or_port_before_a_run_folder_is_made(tmp_path):
    """`troupe.train(ENV, algo=...)` and `metrics_port=` say what is wrong at once, as the
    command line's `--algo` and `--metrics-port` do."""
    import troupe as troupe_api
    from api.errors import UserError

    folder = tmp_path / "r"
    refusals = [
        ({"experiment": "CartPole-v1", "algo": "a2c"}, "algo 'a2c': one of auto, ppo, impala"),
        ({"experiment": "cartpole-ppo", "algo": "dqn"}, "'cartpole-ppo' is an experiment"),
        ({"resume": tmp_path, "algo": "dqn"}, "a resumed run keeps its own: drop algo"),
        ({"algo": "dqn"}, "algo=dqn sets an algorithm up on an environment: name its id"),
        ({"experiment": "CartPole-v1", "metrics_port": 70000}, "metrics_port 70000: a port"),
        ({"experiment": "CartPole-v1", "metrics_port": "9100"}, "metrics_port '9100': a port"),
    ]
    for kwargs, message in refusals:
        run_dir = None if "resume" in kwargs else folder
        with pytest.raises(UserError, match=re.escape(message)):
            troupe_api.train(**kwargs, run_dir=run_dir)
    assert not folder.exists()


def test_train_from_python_takes_settings_as_keywords(tmp_path, monkeypatch):
    """`troupe.train("CartPole-v1", target=400)` was a TypeError ("unexpected keyword argument
    'target'") where `troupe train CartPole-v1 target=400` runs: each keyword is the override
    its command line would be, values as Python wrote them."""
    import troupe as troupe_api
    from api.errors import ConfigError
    from distributed.launch import run

    seen = {}

    def prepare(experiment, overrides, *args, **kwargs):
        seen.update(experiment=experiment, overrides=overrides)
        raise KeyboardInterrupt  # nothing to start: what it was given is the point

    monkeypatch.setattr(run, "prepare", prepare)
    with pytest.raises(KeyboardInterrupt):
        troupe_api.train(
            "CartPole-v1",
            ["seed=3"],
            target=400.0,
            frames=100_000,
            env_args={"max_episode_steps": 50},
            note="it's",
            run_dir=tmp_path / "r",
        )
    assert seen["overrides"] == [
        "seed=3", "target=400.0", "frames=100000", "env_args={'max_episode_steps': 50}",
        "note=\"it's\"",
    ]  # fmt: skip
    from api.config.load import parse_value

    assert [parse_value(o.split("=", 1)[1]) for o in seen["overrides"][1:]] == [
        400.0, 100_000, {"max_episode_steps": 50}, "it's"
    ]  # fmt: skip
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="traget: unknown key; did you mean 'target'"):
        troupe_api.train("CartPole-v1", traget=400, run_dir=tmp_path / "r2")
    # train()'s own keyword misspelt was read as a config key (environment.args.runs_dir?)
    with pytest.raises(ConfigError, match=r"did you mean train\(\)'s own run_dir=\?"):
        troupe_api.train("CartPole-v1", runs_dir=tmp_path / "r3")
    assert not (tmp_path / "r3").exists()


TRAIN_WITH_AN_ALGO = """
import json, sys
import troupe

result = troupe.train("CartPole-v1", ["stop.env_frames=3000", "stop.eval_return=None"],
                      algo="dqn", metrics_port=0, run_dir=sys.argv[1])
config = json.loads((result.run_dir / "config.json").read_text())
endpoints = json.loads((result.run_dir / "endpoints.json").read_text())
print("RESULT", result.exit_code, config["name"], config["policies"]["default"]["trainer"]["type"],
      endpoints.get("metrics", "none"))
"""


@pytest.mark.multiprocess
def test_train_from_python_takes_an_algo_and_a_metrics_port(tmp_path):
    """`troupe train ENV --algo dqn --metrics-port 0` had no Python form: `troupe.train` took
    neither (a TypeError for `algo=`)."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN_WITH_AN_ALGO)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    result = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], env=env,
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stdout[-2000:] + result.stderr[-2000:]
    code, name, trainer, metrics = lines[0].split()[1:]
    assert (code, name, trainer) == ("0", "cartpole-v1-dqn", "dqn")
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", metrics), metrics


def test_output_piped_into_a_reader_that_stops_early_ends_quietly():
    """``troupe show-config EXP --json | head -1`` printed a BrokenPipeError traceback."""
    cli = [sys.executable, "-m", "distributed.cli", "show-config", "cartpole-ppo", "--json"]
    process = subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # the reader is gone before the first line comes
    assert process.wait(timeout=120) == 141  # 128 + SIGPIPE, as a shell reports such a writer
    assert process.stderr.read() == b""


def test_an_image_for_a_local_run_is_refused(tmp_path):
    """``troupe run cartpole-ppo --image foo:bar`` ran locally, the image ignored."""
    result = troupe("run", "cartpole-ppo", "--image", "foo:bar", "--run-dir", str(tmp_path / "r"))
    assert result.returncode == 1, result.stderr
    assert "--image is the worker image of --launcher docker" in result.stdout + result.stderr
    assert not (tmp_path / "r").exists()


def test_resume_refuses_another_experiment_named_beside_it(tmp_path, capsys):
    """``troupe run pong-ppo --resume RUN`` of a cartpole-ppo run resumed CartPole and never
    said that the Pong it named was ignored, where ``troupe.train`` refuses both at once."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text('{"name": "cartpole-ppo"}')
    assert main(["run", "pong-ppo", "--resume", str(run_dir)]) == 1
    said = " ".join(capsys.readouterr().err.split())
    assert (
        f"--resume {run_dir} continues its own experiment, 'cartpole-ppo', not 'pong-ppo'" in said
    )


def test_a_folder_of_a_run_that_failed_before_it_started_is_said_to_be_one(tmp_path):
    """Such a folder (a launch record, no config.json) was refused as "not empty; pick another
    --run-dir or --resume it", and the resume then refused it for its missing config.json."""
    from api.errors import UserError
    from distributed.launch.run import prepare

    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "launch.json").write_text("{}")
    with pytest.raises(UserError, match="holds a run that failed before it started") as e:
        prepare("cartpole-ppo", [], str(folder), None)
    assert "--resume" not in str(e.value) and "logs/controller.log" in str(e.value)
    (folder / "config.json").write_text("{}")  # a run that started: resume it, or another folder
    with pytest.raises(UserError, match="is not empty; pick another --run-dir or --resume it"):
        prepare("cartpole-ppo", [], str(folder), None)
