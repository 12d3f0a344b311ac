"""The ``ppo`` experiment (``troupe train ENV``): the recipe, policy arguments and stop rule it
picks from an environment's spaces and gymnasium's registration."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from api.config import validate
from api.environment import Environment, StepResult, register
from api.errors import UserError
from api.registry import environments
from api.spaces import HybridBox
from legacy.experiments.auto import DEFAULT_TARGETS, ppo

BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
IMAGE = gym.spaces.Box(0, 255, (84, 84, 3), np.uint8)
DICT = gym.spaces.Dict({"position": BOX, "flag": gym.spaces.Discrete(2)})
SPACES = {
    "discrete": (BOX, gym.spaces.Discrete(3)),
    "multi-discrete": (BOX, gym.spaces.MultiDiscrete([3, 2])),
    "box": (BOX, gym.spaces.Box(-2.0, 2.0, (2,), np.float32)),
    "dict-box": (DICT, gym.spaces.Box(-1.0, 1.0, (1,), np.float32)),
    "image-box": (IMAGE, gym.spaces.Box(-1.0, 1.0, (1,), np.float32)),
    "image-discrete": (IMAGE, gym.spaces.Discrete(4)),
    "dict-action": (BOX, gym.spaces.Dict({"a": gym.spaces.Discrete(2)})),
    "unbounded-box": (BOX, gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)),
    "hybrid": (BOX, HybridBox([3], [-1.0], [1.0])),
    "text-key": (
        gym.spaces.Dict({"image": IMAGE, "goal": gym.spaces.Dict({"mission": gym.spaces.Text(8)})}),
        gym.spaces.Discrete(3),
    ),
}


class Spaces(Environment):
    """One agent with the spaces it is given; never stepped here."""

    def __init__(self, kind: str = "discrete", agents: int = 1):
        self.kind, self.agents = kind, agents

    @property
    def agent_count(self):
        return self.agents

    @property
    def observation_spaces(self):
        return [SPACES[self.kind][0]] * self.agents

    @property
    def action_spaces(self):
        return [SPACES[self.kind][1]] * self.agents

    def reset(self):
        return [StepResult(self.observation_spaces[0].sample())] * self.agents

    def step(self, actions):
        return self.reset()


@pytest.fixture(autouse=True)
def spaces_envs():
    for kind in SPACES:
        register(f"test-auto-{kind}", Spaces, kind=kind)
    yield
    for kind in SPACES:
        environments.unregister(f"test-auto-{kind}")


def _args(config):
    default = config.policies["default"]
    return default.policy.args, default.trainer.args


@pytest.mark.parametrize("kind", ["discrete", "multi-discrete", "image-discrete"])
def test_discrete_actions_get_the_cartpole_recipe_without_normalisation(kind):
    config = ppo(f"test-auto-{kind}")
    policy, trainer = _args(config)
    assert config.policies["default"].policy.type == "actor-critic"
    assert policy == {"hidden_sizes": [64, 64], "activation": "tanh"}
    assert trainer["lr"] == 2e-3 and trainer["epochs"] == 6 and trainer["minibatches"] == 2
    assert "lr_schedule" not in trainer
    assert config.stop.env_frames == 1_000_000
    assert validate(config) == []


def test_box_actions_on_vectors_get_the_continuous_recipe_with_normalisation():
    config = ppo("test-auto-box", frames=40_960)
    policy, trainer = _args(config)
    assert policy["normalize_obs"] is True and policy["normalize_returns"] is True
    assert trainer["lr_schedule"] == "linear" and trainer["entropy_coef"] == 0.0
    # the linear decay reaches zero at the frame budget: 8 segments of 128 steps a trainer step
    assert trainer["total_steps"] == 40_960 // (8 * 128)
    assert config.stop.env_frames == 40_960
    assert validate(config) == []


@pytest.mark.parametrize("kind", ["dict-box", "image-box"])
def test_box_actions_on_images_or_dicts_normalise_returns_only(kind):
    policy, trainer = _args(ppo(f"test-auto-{kind}"))
    assert policy["normalize_obs"] is False and policy["normalize_returns"] is True
    assert trainer["lr_schedule"] == "linear"


def test_continuous_runs_default_to_half_the_frames_of_discrete_ones():
    assert ppo("test-auto-box").stop.env_frames == 500_000
    assert ppo("test-auto-discrete", frames=1234).stop.env_frames == 1234


@pytest.mark.parametrize("algo", ["ppo", "impala", "dqn"])
def test_an_observation_no_policy_reads_is_refused_before_launch_naming_its_key(algo):
    """A MiniGrid-like ``mission`` Text failed every policy worker of the run instead."""
    from legacy.experiments import by_algo

    make = ppo if algo == "ppo" else getattr(by_algo, algo)
    with pytest.raises(
        UserError,
        match=r"observation key 'goal.mission' is a Text space, "
        r"which no built-in policy reads.*leave it out, from its "
        r"observation_spaces",
    ):  # fmt: skip  (its own: no gymnasium wrapper)
        make("test-auto-text-key")


def test_a_dict_action_space_is_refused_naming_what_is_handled():
    with pytest.raises(UserError, match="has a Dict action space; the ppo experiment handles"):
        ppo("test-auto-dict-action")


@pytest.mark.parametrize(
    "algo, kind, hint",
    [
        ("dqn", "multi-discrete", "MultiDiscrete actions; dqn acts in Discrete action spaces: use "
         "--algo ppo (or impala)"),
        ("sac", "discrete", "use --algo dqn (or ppo)"),
        ("dqn", "box", "use --algo sac (or ppo)"),
        ("dqn", "dict-action", "Dict actions; dqn acts in Discrete action spaces: no built-in "
         "algorithm does (ppo and impala take Discrete, MultiDiscrete, MultiBinary and Box)"),
    ],
)  # fmt: skip
def test_an_algorithm_refusing_the_actions_names_one_that_takes_them(algo, kind, hint):
    """MultiDiscrete actions under --algo dqn were told "use --algo dqn (or ppo)"."""
    from legacy.experiments import by_algo

    with pytest.raises(UserError) as caught:
        getattr(by_algo, algo)(f"test-auto-{kind}")
    assert hint in str(caught.value)


def test_agents_with_the_same_spaces_share_one_policy():
    """Issue 28: ``troupe train`` on a multi-agent game (parameter sharing, as RLlib users
    know it); before, anything with more than one agent was refused."""
    config = ppo("test-auto-discrete", env_args={"agents": 2})
    assert config.agent_policies == ["default", "default"] and list(config.policies) == ["default"]


def test_a_pettingzoo_id_makes_a_run_folder_name_without_separators():
    pytest.importorskip("pettingzoo", reason="needs the 'multiagent' extra")
    config = ppo("pettingzoo:classic/rps_v2", frames=1000)
    assert config.name == "pettingzoo-classic-rps_v2-ppo" and len(config.agent_policies) == 2


def test_a_users_environment_has_no_target_unless_given():
    config = ppo("test-auto-discrete")
    assert config.stop.eval_return is None
    assert config.stop.eval_return_source == (
        "none: test-auto-discrete is not a gymnasium id with a reward_threshold; give one with "
        "target="
    )
    config = ppo("test-auto-discrete", target=0.5)
    assert config.stop.eval_return == 0.5
    assert config.stop.eval_return_source == "given: target="


def test_a_gymnasium_threshold_is_the_target():
    config = ppo("CartPole-v1")
    assert config.stop.eval_return == 475.0
    assert config.stop.eval_return_source == "gymnasium's reward_threshold for CartPole-v1"
    assert ppo("CartPole-v1", target=200).stop.eval_return == 200


def test_pendulum_declares_no_threshold_and_gets_troupes_default():
    assert gym.spec("Pendulum-v1").reward_threshold is None
    config = ppo("Pendulum-v1")
    assert config.stop.eval_return == DEFAULT_TARGETS["Pendulum-v1"] == -300.0
    assert config.stop.eval_return_source == (
        "Troupe's default for Pendulum-v1, which declares no reward_threshold"
    )


def test_every_default_target_is_for_an_id_gymnasium_leaves_without_one():
    for env in DEFAULT_TARGETS:
        assert gym.spec(env).reward_threshold is None, env


def test_a_two_seat_board_game_trains_by_self_play_against_its_past():
    """Issue 28: ``troupe train pettingzoo:classic/tictactoe_v3`` is self-play from one
    command: the learner, a pool of its snapshots, a random legal player to be judged against."""
    pytest.importorskip("pettingzoo", reason="needs the 'multiagent' extra")
    config = ppo("pettingzoo:classic/tictactoe_v3", frames=5000)
    assert sorted(config.policies) == ["main", "past", "random"]
    assert (config.selfplay.learner, config.selfplay.opponent) == ("main", "past")
    assert config.policy_mapping.type == "self-play" and config.evaluation.policy == "main"
    assert config.policies["main"].policy.args["grid_channels"] == [32, 32]  # a 3x3 board
    assert (
        config.stop.env_frames == 5000 and config.name == "pettingzoo-classic-tictactoe_v3-selfplay"
    )
    from api.config import validate

    assert validate(config) == []


def test_sac_refuses_unbounded_actions_before_launch():
    """Every policy worker failed to build ("sac-policy squashes actions into the Box's
    bounds"), after the run had started; test-pipeline showed the raw ValueError."""
    from legacy.experiments import by_algo

    with pytest.raises(UserError, match=r"unbounded; sac squashes its actions.*--algo ppo"):
        by_algo.sac("test-auto-unbounded-box")
    assert by_algo.sac("test-auto-box").policies["default"].trainer.type == "sac"


def test_sac_takes_a_dict_observation_and_an_image():
    """A goal-conditioned task (Dict observation, Box actions) was refused by the sac
    experiment ("vector observations"), though sac-policy reads Dicts key by key; an image
    was refused too ("not images: use --algo ppo"). An image gets SAC-from-pixels settings."""
    from legacy.experiments import by_algo

    config = by_algo.sac("test-auto-dict-box")
    assert config.policies["default"].policy.type == "sac-policy" and validate(config) == []
    assert "shift_pad" not in config.policies["default"].policy.args
    pixels = by_algo.sac("test-auto-image-box")
    assert validate(pixels) == []
    default = pixels.policies["default"]
    assert default.policy.args["feature_dim"] == 50 and default.policy.args["shift_pad"] == 4
    assert default.trainer.args["tau"] == 0.01


class Counted(Spaces):
    """Counts how often it is made: a simulator can take minutes to start."""

    made = 0

    def __init__(self, kind: str = "discrete", agents: int = 1):
        super().__init__(kind, agents)
        Counted.made += 1


def test_the_environment_is_made_once_to_set_the_experiment_up():
    """``troupe train`` made the environment twice before its run started (once to tell a
    board game, once for its spaces): for one that takes 135 s to make, the controller started
    271 s after the command."""
    register("test-auto-counted", Counted)
    try:
        Counted.made = 0
        ppo("test-auto-counted")
        assert Counted.made == 1
    finally:
        environments.unregister("test-auto-counted")


class Mixed(Environment):
    """Agents of the kinds named, in order (keys of :data:`SPACES`); named where ``names``
    are given, as a PettingZoo environment's are."""

    def __init__(self, kinds=("discrete", "box"), names=None):
        self.kinds = list(kinds)
        if names is not None:
            self.agent_names = list(names)

    @property
    def agent_count(self):
        return len(self.kinds)

    @property
    def observation_spaces(self):
        return [SPACES[k][0] for k in self.kinds]

    @property
    def action_spaces(self):
        return [SPACES[k][1] for k in self.kinds]

    def reset(self):
        return [StepResult(space.sample()) for space in self.observation_spaces]

    def step(self, actions):
        return self.reset()


@pytest.fixture
def mixed():
    """Registers ``test-auto-mixed`` (agent 0 discrete, agent 1 in a Box)."""
    register("test-auto-mixed", Mixed)
    yield "test-auto-mixed"
    environments.unregister("test-auto-mixed")


def test_agents_whose_spaces_differ_get_a_policy_per_kind_with_its_recipe(mixed):
    """``troupe train`` refused agents whose spaces differ (a predator and its prey, a speaker
    and a listener), asking for an experiment written by hand. Each kind now gets a policy of
    its own, with its action space's recipe."""
    config = ppo(mixed, frames=200_000)
    assert config.agent_policies == ["agent0", "agent1"] and validate(config) == []
    chaser, runner = config.policies["agent0"], config.policies["agent1"]
    assert chaser.trainer.args["lr"] == 2e-3 and "lr_schedule" not in chaser.trainer.args
    assert runner.trainer.args["lr_schedule"] == "linear" and runner.policy.args["normalize_obs"]
    assert runner.trainer.args["total_steps"] == 200_000 // 1024
    per_step = config.actors.segment_length * chaser.batch_segments
    assert per_step == config.actors.segment_length * runner.batch_segments == 1024


def test_a_linear_decay_lasts_the_run_when_agents_share_a_policy():
    """Two agents in a Box sharing a policy give it two transitions a step: its learning rate
    reached zero half-way through the run."""
    config = ppo("test-auto-box", env_args={"agents": 2}, frames=102_400)
    default = config.policies["default"]
    per_step = default.batch_segments * config.actors.segment_length
    assert default.trainer.args["total_steps"] * per_step == 2 * 102_400


def test_a_policy_shared_by_n_agents_takes_n_times_the_transitions_a_step():
    """1,024 transitions a step whatever the agents: a policy three agents share stepped every
    341 environment steps, its samples 6.8 versions old (MPE's simple_spread_v3: a training
    return of -21.9 after 270 s, -15.1 at three times the batch). Now a step covers 1,024
    environment steps, up to 8 agents."""
    from legacy.experiments.auto import MAX_SHARED_BATCHES, PER_STEP

    for agents, batches in ((1, 1), (3, 3), (2 * MAX_SHARED_BATCHES, MAX_SHARED_BATCHES)):
        for env in ("test-auto-box", "test-auto-discrete"):
            config = ppo(env, env_args={"agents": agents}, frames=102_400)
            default = config.policies["default"]
            per_step = default.batch_segments * config.actors.segment_length
            assert per_step == batches * PER_STEP, (env, agents)


def test_kinds_are_named_after_the_agents_names_where_the_environment_has_them():
    register(
        "test-auto-named", Mixed, kinds=("discrete", "discrete", "box"),
        names=["adversary_0", "adversary_1", "agent_0"],
    )  # fmt: skip
    try:
        config = ppo("test-auto-named")
    finally:
        environments.unregister("test-auto-named")
    assert config.agent_policies == ["adversary", "adversary", "agent"]


@pytest.mark.parametrize(
    "algo, said",
    [
        ("dqn", "has Box actions (agent 1's); dqn acts in Discrete action spaces: use --algo "
         "ppo (or impala), which act in every agent's actions"),
        ("sac", "has Discrete actions (agent 0's); sac acts in Box action spaces: use --algo "
         "ppo (or impala), which act in every agent's actions"),
    ],
)  # fmt: skip
def test_an_algorithm_that_cannot_act_for_one_kind_names_it_and_one_that_can(mixed, algo, said):
    from legacy.experiments import by_algo

    with pytest.raises(UserError) as caught:
        getattr(by_algo, algo)(mixed)
    assert said in str(caught.value)


def test_impala_dqn_and_sac_give_each_kind_its_own_policy():
    from legacy.experiments import by_algo

    register("test-auto-two-boxes", Mixed, kinds=("box", "dict-box"))
    register("test-auto-two-discrete", Mixed, kinds=("discrete", "image-discrete"))
    try:
        configs = (
            by_algo.impala("test-auto-two-boxes"),
            by_algo.dqn("test-auto-two-discrete"),
            by_algo.sac("test-auto-two-boxes"),
        )
        assert all(validate(config) == [] for config in configs)
    finally:
        environments.unregister("test-auto-two-boxes")
        environments.unregister("test-auto-two-discrete")
    for config in configs:
        assert config.agent_policies == ["agent0", "agent1"]
        first, second = config.policies["agent0"], config.policies["agent1"]
        assert first is not second and first.policy.args is not second.policy.args
    impala = configs[0]
    assert impala.policies["agent0"].policy.args.get("normalize_obs") is True
    assert not impala.policies["agent1"].policy.args.get("normalize_obs")  # a Dict


def test_a_recipe_for_one_policy_refuses_agents_that_differ():
    from legacy.experiments.agent_kinds import agent_spaces

    register("test-auto-two-boxes", Mixed, kinds=("box", "dict-box"))
    try:
        with pytest.raises(UserError, match="use troupe train ENV --algo ppo"):
            agent_spaces("test-auto-two-boxes", None)
    finally:
        environments.unregister("test-auto-two-boxes")


@pytest.mark.parametrize(
    "via", ["environment.args.{key}={value}", "environment.args={{'{key}': {value}}}"]
)
def test_an_environment_argument_given_as_an_override_sets_the_experiment_up(via):
    """The recipe was set up from the environment's default arguments and the override applied
    after: ``troupe train GridGather-v0 environment.args.n_agents=3`` planned policies for 2
    agents and failed in its workers; ``--algo dqn`` of an environment whose Box actions were
    chosen by an argument was refused for its default's Discrete ones."""
    from api.resolve import load_experiment

    three = load_experiment("GridGather-v0", [via.format(key="n_agents", value=3)])
    assert three.agent_policies == ["default"] * 3 and three.environment.args["n_agents"] == 3
    boxed = via.format(key="kind", value="'box'")
    sac = load_experiment("sac", ["env=test-auto-discrete", boxed])
    assert sac.policies["default"].policy.type == "sac-policy"
    with pytest.raises(UserError, match="has Box actions; dqn acts in Discrete"):
        load_experiment("dqn", ["env=test-auto-discrete", boxed])


def test_choices_with_values_train_with_ppo_or_impala_and_other_algorithms_say_so():
    """A HybridBox (a Dict or Tuple of discrete and Box parts, as the adapters present it) is
    a Box to the code that carries actions; sac would have acted in it as continuous values."""
    from legacy.experiments import by_algo

    assert ppo("test-auto-hybrid").policies["default"].policy.type == "actor-critic"
    assert by_algo.impala("test-auto-hybrid").policies["default"].trainer.type == "impala"
    with pytest.raises(UserError, match=r"mix discrete choices and continuous values .* use --al"):
        by_algo.sac("test-auto-hybrid")
    with pytest.raises(UserError, match="HybridBox actions; dqn acts in Discrete action spaces: "
                       "use --algo ppo \\(or impala\\)"):  # fmt: skip
        by_algo.dqn("test-auto-hybrid")


def test_mappo_gives_each_policy_a_critic_of_the_whole_state():
    """`troupe train pettingzoo:mpe/simple_spread_v3 --algo mappo`: the game made with its
    global state beside each agent's observation, the actor reading the agent's own part; the
    rest is ppo's recipe."""
    pytest.importorskip("mpe2", reason="needs the 'mpe' extra")
    from legacy.experiments.by_algo import mappo

    config = mappo("pettingzoo:mpe/simple_spread_v3", frames=102_400)
    plain = ppo("pettingzoo:mpe/simple_spread_v3", frames=102_400)
    assert config.name == "pettingzoo-mpe-simple_spread_v3-mappo"
    assert config.environment.args["global_state"] is True
    policy, trainer = _args(config)
    assert policy == {**_args(plain)[0], "actor_keys": ["obs"]} and trainer == _args(plain)[1]
    assert config.policies["default"].batch_segments == plain.policies["default"].batch_segments
    validate(config)


def test_mappo_on_an_environment_without_a_global_state_says_what_trains_it():
    from legacy.experiments.by_algo import mappo

    with pytest.raises(UserError, match="'test-auto-discrete' is none: --algo ppo trains it"):
        mappo("test-auto-discrete")
    pytest.importorskip("pettingzoo", reason="needs the 'multiagent' extra")
    with pytest.raises(UserError, match=r"has no global state .*MPE's games have one"):
        mappo("pettingzoo:classic/rps_v2")


def test_mappo_runs_through_the_runtimes_workers():
    """`troupe test-pipeline ... --algo mappo`: the runtime's actor, policy and trainer workers
    wired together (serial mode) step the game with its state, act and train."""
    pytest.importorskip("mpe2", reason="needs the 'mpe' extra")
    from api.testing import test_pipeline as check_pipeline

    report = check_pipeline("pettingzoo:mpe/simple_spread_v3", algo="mappo")
    assert report.experiment == "pettingzoo-mpe-simple_spread_v3-mappo"
    assert report.trainer_steps == {"default": 3} and report.versions["default"] == [1, 2, 3]
    assert report.batch_shapes["default"]["obs"]["state"][-1] == 54
