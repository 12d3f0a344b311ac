"""Built-in environments: the gymnasium adapter and GridGather."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from api import environment, registry
from api.env_check import reward_problem
from api.errors import UserError
from legacy.environment.grid_gather import MOVES, GridGatherEnvironment
from legacy.environment.gym_adapter import GymnasiumEnvironment, register_gymnasium_ids


# --------------------------------------------------------------------- gymnasium adapter
def test_adapter_has_one_agent_and_the_gymnasium_spaces():
    env = GymnasiumEnvironment("CartPole-v1")
    assert env.agent_count == 1
    assert env.observation_spaces == [env.gym_env.observation_space]
    assert env.action_spaces == [gym.spaces.Discrete(2)]


def test_adapter_reset_and_step_return_one_result():
    env = GymnasiumEnvironment("CartPole-v1")
    [first] = env.reset()
    assert first.obs.shape == (4,) and first.reward == 0.0 and not first.done
    [result] = env.step([0])
    assert result.reward == 1.0 and isinstance(result.reward, float)
    assert isinstance(result.done, bool) and isinstance(result.truncated, bool)


class _Rewarding(gym.Env):
    """Returns ``reward`` from every step, as the test sets it."""

    observation_space = gym.spaces.Box(0, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)
    reward = None

    def reset(self, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), self.reward, False, False, {}


@pytest.mark.filterwarnings("ignore:.*The reward returned by:UserWarning")
@pytest.mark.parametrize(
    ("reward", "expected"),
    [(np.array([2.5]), 2.5), (np.array(1.5, np.float32), 1.5), (np.int64(3), 3.0), (True, 1.0)],
)
def test_adapter_takes_a_reward_of_one_number_in_any_form(gym_id_of_this_file, reward, expected):
    """An array of shape (1,) keeps the contract; numpy 2 refuses ``float()`` of it, so the
    adapter crashed at every step of such an environment, restart after restart."""
    gym.register(gym_id_of_this_file, entry_point=_Rewarding)
    env = GymnasiumEnvironment(gym_id_of_this_file)
    env.reset()
    env._env.unwrapped.reward = reward
    [result] = env.step([0])
    assert result.reward == expected and type(result.reward) is float


@pytest.mark.filterwarnings("ignore:.*The reward returned by:UserWarning")
def test_adapter_leaves_a_vector_reward_for_the_actor_to_refuse(gym_id_of_this_file):
    gym.register(gym_id_of_this_file, entry_point=_Rewarding)
    env = GymnasiumEnvironment(gym_id_of_this_file)
    env.reset()
    env._env.unwrapped.reward = np.array([1.0, 2.0])
    [result] = env.step([0])
    assert "reward must be one number" in reward_problem(result.reward)


def test_adapter_says_how_many_emulator_frames_an_ale_id_steps():
    """An ALE id through the adapter (``obs_type='ram'``) steps 4 emulator frames an agent step
    (``-v5``), 1 for a ``NoFrameskip`` id, as its ``frameskip`` says; any other id: 1."""
    pytest.importorskip("ale_py", reason="Atari needs the atari extra: pip install -e '.[atari]'")
    frames = {
        gym_id: GymnasiumEnvironment(gym_id, obs_type="ram", **kwargs).frames_per_step
        for gym_id, kwargs in (("ALE/Pong-v5", {}), ("PongNoFrameskip-v4", {}),
                               ("ALE/Breakout-v5", {"frameskip": 3}))
    }  # fmt: skip
    assert frames == {"ALE/Pong-v5": 4, "PongNoFrameskip-v4": 1, "ALE/Breakout-v5": 3}
    assert GymnasiumEnvironment("CartPole-v1").frames_per_step == 1


def test_adapter_keeps_terminated_and_truncated_apart():
    env = GymnasiumEnvironment("CartPole-v1", max_episode_steps=3)
    env.reset()
    results = [env.step([0])[0] for _ in range(3)]
    assert results[-1].truncated and not results[-1].done

    env = GymnasiumEnvironment("CartPole-v1")
    env.reset()
    result = env.step([1])[0]
    while not (result.done or result.truncated):
        result = env.step([1])[0]  # always pushing right topples the pole
    assert result.done and not result.truncated


def test_adapter_seed_applies_to_the_next_reset_only():
    env = GymnasiumEnvironment("CartPole-v1")
    env.seed(7)
    a = env.reset()[0].obs
    b = env.reset()[0].obs
    env.seed(7)
    assert np.array_equal(env.reset()[0].obs, a)
    assert not np.array_equal(a, b)


def test_adapter_seed_seeds_action_sampling():
    env = GymnasiumEnvironment("Pendulum-v1")
    env.seed(3)
    first = [env.action_spaces[0].sample() for _ in range(3)]
    env.seed(3)
    assert np.array_equal(first, [env.action_spaces[0].sample() for _ in range(3)])


def test_adapter_refuses_to_step_without_a_running_episode():
    env = GymnasiumEnvironment("CartPole-v1", max_episode_steps=1)
    with pytest.raises(UserError, match="no episode is running"):
        env.step([0])
    env.reset()
    env.step([0])
    with pytest.raises(UserError, match=r"call reset\(\) to start a new episode"):
        env.step([0])


def test_adapter_wants_exactly_one_action():
    env = GymnasiumEnvironment("CartPole-v1")
    env.reset()
    with pytest.raises(ValueError, match="takes a list of one action; got 2 actions"):
        env.step([0, 1])


def test_adapter_renders_only_with_a_render_mode():
    assert GymnasiumEnvironment("CartPole-v1").render() is None
    pytest.importorskip("pygame", reason="gymnasium's classic-control renderer needs pygame")
    env = GymnasiumEnvironment("Pendulum-v1", render_mode="rgb_array")
    env.reset()
    frame = env.render()
    assert frame.ndim == 3 and frame.shape[2] == 3
    env.close()


def test_adapter_reports_missing_optional_dependencies():
    if importlib.util.find_spec("Box2D") is not None:
        pytest.skip("Box2D is installed here")
    with pytest.raises(UserError, match="'LunarLander-v3' needs a package that is not installed"):
        GymnasiumEnvironment("LunarLander-v3")


def test_an_environment_whose_module_cannot_be_imported_names_it():
    """gymnasium's jax (phys2d/, tabular/) and shimmy ids raise a plain ImportError, which
    ended a run in a traceback."""
    gym.register("TroupeTestMissing-v0", entry_point="troupe_no_such_module:Env")
    try:
        with pytest.raises(UserError, match="needs a package that is not installed: No module "
                           "named 'troupe_no_such_module'") as e:  # fmt: skip
            GymnasiumEnvironment("TroupeTestMissing-v0")
        assert str(e.value).endswith(  # where the workers run in containers, too
            "(a worker image gets it with troupe image build --pip PACKAGE; MuJoCo and Box2D "
            "tasks with --extras mujoco or --extras box2d)"
        )
    finally:
        del gym.registry["TroupeTestMissing-v0"]


class _Still(gym.Env):
    """A gymnasium env of this file's, registered with gymnasium by the tests below."""

    observation_space = gym.spaces.Box(0, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, True, False, {}


@pytest.fixture
def gym_id_of_this_file():
    """Its name, registered with gymnasium by the test, and removed from both registries."""
    name = "TroupeTestStill-v0"
    yield name
    gym.registry.pop(name, None)
    registry.environments.unregister(name)


def test_a_gymnasium_id_registered_after_troupe_listed_gymnasiums_is_known(gym_id_of_this_file):
    """A script's ``gym.register`` after the registry's first lookup (which registered
    gymnasium's ids then) was an unknown environment."""
    registry.environments.names()  # the plugin has run
    gym.register(gym_id_of_this_file, entry_point=_Still)
    assert not registry.environments.registered(gym_id_of_this_file)
    assert gym_id_of_this_file in registry.environments  # resolved late
    spec = registry.environments.spec(gym_id_of_this_file)
    assert spec.kwargs == {"gym_id": gym_id_of_this_file}
    assert spec.requires == (str(Path(__file__).resolve()),)  # what registers it, for workers
    env = environment.make(gym_id_of_this_file)
    assert env.reset()[0].obs.shape == (1,)
    # it travels with a run that builds it, as the user's own registrations do, and only then
    from api.code import attach_user_code
    from api.resolve import load_experiment

    assert spec not in registry.user_specs()
    config = attach_user_code(load_experiment("ppo", [f"env={gym_id_of_this_file}"]))
    (shipped,) = [r for r in config.code.registrations if r.name == gym_id_of_this_file]
    assert shipped.requires == [str(Path(__file__).resolve())]
    assert shipped.entry_point == "legacy.environment.gym_adapter:GymnasiumEnvironment"
    other = attach_user_code(load_experiment("ppo", ["env=CartPole-v1"]))
    assert all(r.name != gym_id_of_this_file for r in other.code.registrations)


def test_gymnasiums_own_ids_need_nothing_imported_and_a_users_id_its_file(gym_id_of_this_file):
    gym.register(gym_id_of_this_file, entry_point=_Still)
    register_gymnasium_ids()  # the blanket registration, after gym.register this time
    spec = registry.environments.spec(gym_id_of_this_file)
    assert spec.requires == (str(Path(__file__).resolve()),)
    cartpole = registry.environments.spec("CartPole-v1")
    assert cartpole.requires == ()


def test_adapter_sees_a_tuple_observation_as_a_dict_keyed_by_position():
    """Blackjack observes ``(player sum, dealer card, usable ace)``: a Tuple space, which
    Troupe's encoders and wire checks do not take, so ``troupe train Blackjack-v1`` failed to
    build its policy. Keyed by position it is a Dict of Discretes, which they do."""
    env = GymnasiumEnvironment("Blackjack-v1")
    (space,) = env.observation_spaces
    assert isinstance(space, gym.spaces.Dict)
    assert list(space.spaces) == ["item0", "item1", "item2"]
    assert [s.n for s in space.spaces.values()] == [32, 11, 2]
    env.seed(3)
    (first,) = env.reset()
    plain = gym.make("Blackjack-v1")
    expected, _ = plain.reset(seed=3)
    assert first.obs == dict(zip(space.spaces, expected, strict=True))
    assert space.contains(first.obs)
    (after,) = env.step([0])  # stick: the episode ends, the observation keeps its keys
    assert after.done and space.contains(after.obs)


def test_positions_keep_their_order_past_ten_and_nested_spaces_convert():
    from api.spaces import dict_of_tuples, from_positions

    bit = gym.spaces.Discrete(2)
    space = gym.spaces.Tuple([bit] * 11 + [gym.spaces.Dict({"inner": gym.spaces.Tuple([bit])})])
    converted = dict_of_tuples(space)
    assert list(converted.spaces)[:3] == ["item00", "item01", "item02"]
    assert list(converted.spaces)[-1] == "item11"  # sorted as Dict spaces sort: the same order
    obs = from_positions((*range(11), {"inner": (1,)}), converted)
    assert [obs[k] for k in list(converted.spaces)[:11]] == list(range(11))
    assert obs["item11"] == {"inner": {"item0": 1}}
    assert from_positions(obs, converted) == obs  # a dict already keyed stays as it is
    box = gym.spaces.Box(0, 1, (2,))
    assert dict_of_tuples(box) is box  # no Tuple, nothing converted
    keyed = gym.spaces.Dict({"a": box})
    assert dict_of_tuples(keyed) is keyed


def test_every_gymnasium_id_is_registered_through_the_adapter():
    register_gymnasium_ids()  # a second call is harmless: known ids are skipped
    # gymnasium's and ALE's own ids (other tests in this process register ids of their own, and
    # an explicit registration of an id keeps its own description)
    builtin = [
        gym_id
        for gym_id, gym_spec in gym.registry.items()
        if str(gym_spec.entry_point).startswith(("gymnasium.", "ale_py"))
    ]
    assert "CartPole-v1" in builtin
    for gym_id in builtin:
        spec = registry.environments.spec(gym_id)
        assert spec.kwargs == {"gym_id": gym_id}
        assert spec.description == "gymnasium"
    assert isinstance(environment.make("Acrobot-v1"), GymnasiumEnvironment)


def test_an_id_registered_with_gymnasium_later_is_never_shipped_as_user_code():
    """A test module's ``gym.register`` after the plugins loaded, then another call of the blanket
    registration, made that id a user registration: every later run's config shipped it to
    workers (and two tests comparing configs failed, depending on collection order)."""
    registry.environments.names()  # the plugins are loaded
    gym.register("LateRegistered-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv")
    try:
        register_gymnasium_ids()
        assert registry.environments.spec("LateRegistered-v0").description == "gymnasium"
        assert "LateRegistered-v0" not in [s.name for s in registry.user_specs()]
    finally:
        registry.environments.unregister("LateRegistered-v0")
        del gym.registry["LateRegistered-v0"]


# --------------------------------------------------------------------- GridGather
def acting(results) -> list[int]:
    return [i for i, r in enumerate(results) if r is not None]


def greedy_action(obs: dict) -> int:
    """Step toward the nearest coin along a legal move (stay when none is left)."""
    size = obs["coins"].shape[0]
    me = np.rint(obs["position"] * (size - 1)).astype(int)
    coins = np.argwhere(obs["coins"] > 0)
    if len(coins) == 0:
        return 0
    target = coins[np.abs(coins - me).sum(axis=1).argmin()]
    legal = np.flatnonzero(obs["action_mask"])
    distances = [np.abs(me + MOVES[a] - target).sum() for a in legal]
    return int(legal[int(np.argmin(distances))])


def test_gridgather_is_registered_and_builds():
    env = environment.make("GridGather-v0", n_agents=3)
    assert isinstance(env, GridGatherEnvironment) and env.agent_count == 3


def test_gridgather_spaces_are_dicts_with_an_action_mask():
    env = GridGatherEnvironment(size=4)
    space = env.observation_spaces[0]
    assert isinstance(space, gym.spaces.Dict)
    assert set(space.spaces) == {"position", "coins", "others", "action_mask"}
    assert space["coins"].shape == (4, 4) and space["action_mask"].n == 5
    assert env.action_spaces[0] == gym.spaces.Discrete(5)


def test_gridgather_agents_act_in_turns():
    env = GridGatherEnvironment(n_agents=3, max_steps=9)
    env.seed(0)
    results = env.reset()
    assert acting(results) == [0]
    turns = []
    for _ in range(8):
        actions = [0 if r is not None else None for r in results]
        results = env.step(actions)
        turns.append(acting(results))
    assert turns == [[1], [2], [0], [1], [2], [0], [1], [2]]


def test_gridgather_truncates_every_agent_at_max_steps():
    env = GridGatherEnvironment(n_agents=2, max_steps=3)
    results = env.reset()
    for _ in range(3):
        results = env.step([0 if r is not None else None for r in results])
    assert all(r.truncated and not r.done for r in results)
    assert all("coins_collected" in r.info for r in results)
    with pytest.raises(UserError, match="no episode is running"):
        env.step([0, None])


def test_gridgather_greedy_agents_collect_every_coin_and_finish():
    env = GridGatherEnvironment(n_agents=2, size=5, n_coins=5, max_steps=200)
    env.seed(1)
    results = env.reset()
    returns = np.zeros(2)
    while not all(r is not None and (r.done or r.truncated) for r in results):
        results = env.step([None if r is None else greedy_action(r.obs) for r in results])
        returns += [0.0 if r is None else r.reward for r in results]
    assert all(r.done and not r.truncated for r in results)
    assert returns.sum() == 5
    assert sum(r.info["coins_collected"] for r in results) == 5


def test_gridgather_mask_forbids_leaving_the_grid_and_illegal_moves_do_nothing():
    env = GridGatherEnvironment(n_agents=1, size=3, n_coins=1)
    env.seed(0)
    obs = env.reset()[0].obs
    for _ in range(3):  # walk to the top-left corner
        for action in (1, 3):
            if obs["action_mask"][action]:
                obs = env.step([action])[0].obs
    assert obs["position"].tolist() == [0.0, 0.0]
    assert obs["action_mask"].tolist() == [1, 0, 1, 0, 1]
    assert env.step([1])[0].obs["position"].tolist() == [0.0, 0.0]


def test_gridgather_needs_an_action_from_the_agent_on_turn():
    env = GridGatherEnvironment()
    env.reset()
    with pytest.raises(ValueError, match="it is agent 0's turn but its action is None"):
        env.step([None, 0])
    with pytest.raises(ValueError, match="takes 2 actions"):
        env.step([0])
    with pytest.raises(ValueError, match=r"action 9 is not in 0\.\.4"):
        env.step([9, None])


def test_gridgather_seed_makes_boards_reproducible():
    a, b = GridGatherEnvironment(), GridGatherEnvironment()
    a.seed(5)
    b.seed(5)
    obs_a, obs_b = a.reset()[0].obs, b.reset()[0].obs
    assert all(np.array_equal(obs_a[k], obs_b[k]) for k in obs_a)
    a.seed(6)
    assert not np.array_equal(a.reset()[0].obs["coins"], obs_a["coins"])


def test_gridgather_constructor_lists_every_bad_argument():
    with pytest.raises(ValueError) as e:
        GridGatherEnvironment(n_agents=0, size=1)
    assert str(e.value) == (
        "GridGather: n_agents must be at least 1, got 0; size must be at least 2, got 1"
    )
    with pytest.raises(ValueError, match="do not fit on a 2x2 grid"):
        GridGatherEnvironment(n_agents=2, size=2, n_coins=3)


def test_gridgather_renders_an_rgb_board():
    env = GridGatherEnvironment(size=4)
    env.reset()
    frame = env.render()
    assert frame.shape == (4, 4, 3) and frame.dtype == np.uint8


class _OldGymApi(gym.Env):
    """Written for gym before 0.26: reset returns obs alone (unless ``new_reset``), step 4."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, new_reset: bool = False):
        self.new_reset = new_reset

    def reset(self, seed=None, options=None):
        obs = np.zeros(2, np.float32)
        return (obs, {}) if self.new_reset else obs

    def step(self, action):
        return np.zeros(2, np.float32), 1.0, False, {}


@pytest.mark.parametrize("new_reset, call, got", [(False, "reset()", "ndarray"),
                                                   (True, "step()", "a tuple of 4")])  # fmt: skip
def test_adapter_says_an_environment_keeps_gym_s_old_api(monkeypatch, new_reset, call, got):
    """It failed with "'numpy.float32' object is not iterable" (a 2-element observation
    unpacked as (obs, info)), which named nothing of the cause."""
    spec = gym.envs.registration.EnvSpec(
        "TroupeTestOldApi-v0", entry_point=_OldGymApi, kwargs={"new_reset": new_reset},
        disable_env_checker=True,
    )  # fmt: skip
    monkeypatch.setitem(gym.registry, "TroupeTestOldApi-v0", spec)
    env = GymnasiumEnvironment("TroupeTestOldApi-v0")
    with pytest.raises(UserError) as e:
        env.reset()
        env.step([0])
    said = str(e.value)
    assert said.startswith(f"TroupeTestOldApi-v0: {call} returned {got}, not gymnasium's"), said
    assert "Gym before 0.26" in said
