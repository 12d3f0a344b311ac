"""The PettingZoo adapter: AEC turn-taking, pending rewards, agents leaving, the parallel API."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("pettingzoo", reason="needs the 'multiagent' extra")

from pettingzoo.classic.connect_four import connect_four

from api import environment, testing
from api.errors import RegistryError, UserError
from legacy.environment.pettingzoo_adapter import (
    PettingZooAECEnvironment,
    PettingZooParallelEnvironment,
)

GIFT = "pettingzoo_games:GiftGame"  # tests/legacy/pettingzoo_games.py, on sys.path under pytest
KAZ = "pettingzoo.butterfly.knights_archers_zombies.knights_archers_zombies:parallel_env"


@pytest.mark.parametrize("name", ["ConnectFour-v3", "TicTacToe-v3"])
def test_classic_games_pass_test_environment(name):
    report = testing.test_environment(name, steps=300)
    assert report.agent_count == 2 and report.episodes > 0


def test_parallel_game_passes_test_environment():
    report = testing.test_environment("KnightsArchersZombies-v11", steps=200)
    assert report.agent_count == 4
    assert report.observation_spaces[0] == "Box(-1.0, 1.0, (27, 5), float32)"  # cast from float64


def test_gift_game_with_a_quitter_passes_test_environment():
    env = PettingZooAECEnvironment(GIFT, players=3, moves=7, quitter=1)
    report = testing.test_environment(env, steps=100)
    assert report.episodes > 0


def test_only_the_player_to_move_gets_a_result_with_its_action_mask():
    env = environment.make("ConnectFour-v3")
    first = env.reset()
    assert first[1] is None and first[0].obs["action_mask"].tolist() == [1] * 7
    second = env.step([3, None])
    assert second[0] is None and second[1] is not None
    board = second[1].obs["observation"]
    assert board[5, 3, 1] == 1 and board[..., 0].sum() == 0  # the mover's view: theirs in [..., 1]
    with pytest.raises(ValueError, match="agent 1 \\('player_1'\\) acts on this step"):
        env.step([3, None])


def test_a_win_pays_the_loser_too_and_the_episode_then_refuses_to_step():
    env = environment.make("ConnectFour-v3")
    env.reset()
    results = None
    for column in [0, 1, 0, 1, 0, 1, 0]:  # player 0 stacks four in column 0
        mover = 0 if results is None else next(i for i, r in enumerate(results) if r is not None)
        actions = [None, None]
        actions[mover] = column
        results = env.step(actions)
    assert [r.reward for r in results] == [1.0, -1.0]
    assert all(r.done and not r.truncated for r in results)
    with pytest.raises(UserError, match="call reset"):
        env.step([0, None])


def test_rewards_for_players_not_moving_are_paid_with_their_next_result():
    env = PettingZooAECEnvironment(GIFT, players=2, moves=4)
    env.reset()
    r = env.step([2, None])  # player 0 gives 2 to player 1, whose turn it is
    assert r[0] is None and r[1].reward == 2.0
    r = env.step([None, 1])
    assert r[0].reward == 1.0
    r = env.step([0, None])
    assert r[1].reward == 0.0
    r = env.step([None, 2])  # the 4th move truncates the game; player 0 gets the 2 it was given
    assert [x.reward for x in r] == [2.0, 0.0]
    assert all(x.truncated and not x.done for x in r)


def test_an_agent_that_leaves_gets_one_final_result_and_then_none():
    env = PettingZooAECEnvironment(GIFT, players=3, moves=6, quitter=1)
    env.reset()
    r = env.step([1, None, None])  # 0 gives 1 to players 1 and 2; 1 moves next
    assert r[1].reward == 1.0
    totals = np.array([0.0, 1.0, 0.0])
    r = env.step([None, 2, None])  # 1 gives 2 to 0 and 2, then quits
    assert r[0] is None
    assert r[1].done and r[1].reward == 0.0  # its 1 came with its last turn
    assert not r[2].done and r[2].reward == 3.0  # 1 + 2, and it moves next
    totals += [0.0, 0.0, 3.0]
    while not all(x is None or x.done or x.truncated for x in r):
        mover = next(i for i, x in enumerate(r) if x is not None and not (x.done or x.truncated))
        actions = [None] * 3
        actions[mover] = 1
        r = env.step(actions)
        assert r[1] is None  # gone for good
        totals += [0.0 if x is None else x.reward for x in r]
    # moves 3-6 alternate 2, 0, 2, 0 with gifts of 1 to the other one still playing
    assert totals.tolist() == [4.0, 1.0, 5.0]


def test_returns_match_pettingzoos_own_accounting_on_random_games():
    """Troupe-side returns equal the cumulative rewards PettingZoo reports through ``last()``."""
    rng = np.random.default_rng(0)
    ours = PettingZooAECEnvironment("pettingzoo.classic.connect_four.connect_four:env")
    theirs = connect_four.env()
    for game in range(20):
        ours.seed(game)
        results = ours.reset()
        theirs.reset(seed=game)
        totals, expected = np.zeros(2), dict.fromkeys(theirs.possible_agents, 0.0)
        while theirs.agents:
            _, reward, term, trunc, _ = theirs.last()
            expected[theirs.agent_selection] += reward
            if term or trunc:
                theirs.step(None)
                continue
            mask = theirs.observe(theirs.agent_selection)["action_mask"]
            action = int(rng.choice(np.flatnonzero(mask)))
            theirs.step(action)
            mover = next(i for i, r in enumerate(results) if r is not None)
            actions = [None, None]
            actions[mover] = action
            results = ours.step(actions)
            totals += [0.0 if r is None else r.reward for r in results]
        assert totals.tolist() == list(expected.values())


def test_parallel_agents_act_together_and_leave_one_by_one():
    env = PettingZooParallelEnvironment(
        "pettingzoo.butterfly.knights_archers_zombies.knights_archers_zombies:parallel_env",
        max_cycles=60,
    )
    env.seed(1)
    results = env.reset()
    assert all(r is not None for r in results) and results[0].obs.dtype == np.float32
    steps, gone = 0, set()
    while any(r is not None and not (r.done or r.truncated) for r in results):
        actions = [None if r is None or r.done or r.truncated else 5 for r in results]
        results = env.step(actions)
        steps += 1
        for i, r in enumerate(results):
            if i in gone:
                assert r is None
            elif r is not None and (r.done or r.truncated):
                gone.add(i)
    assert steps == 60 and gone == {0, 1, 2, 3}  # standing still until the time limit


@pytest.mark.parametrize(
    ("box", "flat"),
    [
        (False, gym.spaces.MultiDiscrete([2, 3])),  # a Dict's keys in order: boost, pick
        (True, gym.spaces.Box(np.array([0, 0, -1]), np.array([1, 1, 1]), dtype=np.float32)),
    ],
)
def test_a_dict_or_tuple_action_is_acted_in_as_one_flat_space(box, flat):
    """An agent's Dict or Tuple action space was handed to the policy as it was, and every
    experiment refused it; the gymnasium adapter already flattened them."""
    env = PettingZooParallelEnvironment("pettingzoo_games:ChoiceGame", box=box)
    assert env.action_spaces == [flat, flat]
    report = testing.test_environment(env, steps=50)  # the game checks each action it gets
    assert report.episodes == 10
    env.reset()
    action = np.array([1, 2]) if not box else np.array([0.5, 0.5, 0.5], np.float32)
    results = env.step([action, action])
    assert [r.reward for r in results] == ([3.0, 3.0] if not box else [0.0, 0.0])


def test_missing_entry_point_names_the_problem():
    with pytest.raises(Exception, match="no_such_game"):
        PettingZooAECEnvironment("pettingzoo.classic:no_such_game")


# --------------------------------------------------------------------- any game by its id (28.3)
@pytest.mark.parametrize(
    "name, adapter, factory",
    [
        ("pettingzoo:classic/rps_v2", PettingZooAECEnvironment, "env"),  # classic: turn-based
        ("pettingzoo:classic/rps_v2#parallel", PettingZooParallelEnvironment, "parallel_env"),
        (
            "pettingzoo:butterfly/knights_archers_zombies_v11",
            PettingZooParallelEnvironment,
            "parallel_env",
        ),
        ("pettingzoo:butterfly/knights_archers_zombies_v11#aec", PettingZooAECEnvironment, "env"),
    ],
)
def test_any_game_is_an_environment_by_its_id(name, adapter, factory):
    from api import registry

    assert name in registry.environments
    spec = registry.environments.spec(name)
    assert spec.kwargs["env"].endswith(f":{factory}")
    env = environment.make(name)
    try:
        assert isinstance(env, adapter) and env.agent_count >= 2
    finally:
        env.close()


@pytest.mark.filterwarnings("error::DeprecationWarning")
def test_an_id_is_found_in_pettingzoo_s_registry_without_the_deprecated_module_path():
    """PettingZoo 1.27.0 deprecates importing ``pettingzoo.classic.rps_v2``, and says it will
    remove it: an id resolves through its registry, to the game's own module."""
    from legacy.environment.pettingzoo_ids import spec_of_id

    spec = spec_of_id("pettingzoo:classic/rps_v2")
    assert spec.kwargs == {"env": "pettingzoo.classic.rps.rps:env"}
    env = environment.make("pettingzoo:classic/rps_v2")
    env.close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the old path's, asked for here
def test_a_pettingzoo_without_a_registry_finds_the_game_by_its_module(monkeypatch):
    """A PettingZoo without a registry: the game's module names its factories."""
    import pettingzoo

    from legacy.environment.pettingzoo_ids import spec_of_id

    monkeypatch.delattr(pettingzoo, "spec")
    with pytest.warns(DeprecationWarning):  # what 1.27 says of the old path
        spec = spec_of_id("pettingzoo:butterfly/knights_archers_zombies_v11")
    assert spec.kwargs == {"env": "pettingzoo.butterfly.knights_archers_zombies_v11:parallel_env"}
    with pytest.raises(RegistryError, match=r"cannot import pettingzoo\.classic\.no_such_game_v1"):
        spec_of_id("pettingzoo:classic/no_such_game_v1")
    with pytest.raises(RegistryError, match=r"connect_four_v3 has no parallel_env\(\)"):
        spec_of_id("pettingzoo:classic/connect_four_v3#parallel")


def test_a_game_by_id_passes_test_environment():
    report = testing.test_environment("pettingzoo:classic/rps_v2", steps=60)
    assert report.agent_count == 2 and report.episodes > 0


@pytest.mark.parametrize(
    "name, said",
    [
        ("pettingzoo:classic/no_such_game_v1", "'classic/no_such_game-v1' not found in registry"),
        ("pettingzoo:nofamily/rps_v2", "Namespace 'nofamily' not found in registry"),
        ("pettingzoo:classic/rps_v9", "version v9 for 'classic/rps' not found"),
        ("pettingzoo:classic/connect_four_v3#parallel", "has no parallel API .* #aec"),
        ("pettingzoo:classic/rps_v2#turns", "is no PettingZoo id"),
        ("pettingzoo:", "is no PettingZoo id"),
    ],
)
def test_a_wrong_id_is_one_clear_error(name, said):
    from api import registry
    from api.errors import RegistryError

    assert name not in registry.environments
    with pytest.raises(RegistryError, match=said):
        registry.environments.spec(name)


def test_a_family_that_left_pettingzoo_is_said_as_its_import_says(tmp_path, monkeypatch):
    """PettingZoo 1.27 moved MPE into a package of its own: `troupe train
    pettingzoo:mpe/simple_spread_v3` said "Namespace 'mpe' not found in registry" where the
    family's own import says to install mpe2. (A family of this test's, gone the same way.)"""
    import pettingzoo

    from api import registry
    from api.errors import RegistryError

    family = tmp_path / "gonefamily"
    family.mkdir()
    (family / "__init__.py").write_text(
        "raise ImportError('gonefamily has been moved into its own package: pip install gone2')"
    )
    monkeypatch.setattr(pettingzoo, "__path__", [*pettingzoo.__path__, str(tmp_path)])
    with pytest.raises(RegistryError) as caught:
        registry.environments.spec("pettingzoo:gonefamily/game_v1")
    assert str(caught.value) == (
        "'pettingzoo:gonefamily/game_v1': gonefamily has been moved into its own package: pip "
        "install gone2"
    )


def test_mpe_games_keep_their_pettingzoo_ids_and_are_made_from_mpe2():
    """PettingZoo (1.27 here) no longer has MPE, which moved to the mpe2 package, and its
    registry forgot the family:
    `troupe train pettingzoo:mpe/simple_spread_v3` said "install mpe2", and said it again
    with mpe2 installed. The id now makes mpe2's game (its parallel API; #aec the other)."""
    pytest.importorskip("mpe2", reason="needs the 'mpe' extra")
    from legacy.environment.pettingzoo_ids import spec_of_id

    spec = spec_of_id("pettingzoo:mpe/simple_spread_v3")
    assert spec.kwargs == {"env": "mpe2.simple_spread_v3:parallel_env"}
    aec = spec_of_id("pettingzoo:mpe/simple_spread_v3#aec")
    assert aec.kwargs == {"env": "mpe2.simple_spread_v3:env"}
    env = environment.make("pettingzoo:mpe/simple_spread_v3", N=2, max_cycles=4)
    try:
        assert isinstance(env, PettingZooParallelEnvironment) and env.agent_count == 2
        assert env.action_spaces == [gym.spaces.Discrete(5)] * 2
        env.seed(0)
        env.reset()
        steps = [env.step([1, 4]) for _ in range(4)]
        assert [r[0].truncated for r in steps] == [False, False, False, True]  # max_cycles
        assert steps[0][0].reward == steps[0][1].reward < 0  # local_ratio 0.5: no collisions
    finally:
        env.close()
    moving = environment.make("pettingzoo:mpe/simple_spread_v3", continuous_actions=True)
    assert moving.action_spaces[0] == gym.spaces.Box(0.0, 1.0, (5,), np.float32)
    moving.close()
    report = testing.test_environment("pettingzoo:mpe/simple_tag_v3", steps=60)
    assert report.agent_count == 4 and report.episodes > 0  # three chasers and a runner


def test_an_mpe_game_misspelt_or_without_mpe2_is_one_clear_error(monkeypatch):
    pytest.importorskip("mpe2", reason="needs the 'mpe' extra")
    import sys

    from legacy.environment.pettingzoo_ids import spec_of_id

    with pytest.raises(RegistryError) as caught:
        spec_of_id("pettingzoo:mpe/simple_sprad_v3")
    assert str(caught.value) == (
        "'pettingzoo:mpe/simple_sprad_v3': mpe2 has no game mpe/simple_sprad_v3; did you mean "
        "pettingzoo:mpe/simple_spread_v3?"
    )
    monkeypatch.setitem(sys.modules, "mpe2.all_modules", None)  # as if not installed
    with pytest.raises(RegistryError, match=r"mpe2 package now, which is not installed .*"
                       r"pip install 'troupe-rl\[mpe\]'"):  # fmt: skip
        spec_of_id("pettingzoo:mpe/simple_spread_v3")


def test_a_wrong_id_where_an_experiment_is_named_gives_pettingzoos_reason():
    """`troupe run|test-pipeline pettingzoo:sisl/pursuit_v4` said only "unknown experiment or
    environment"; `troupe test-env` said which version there is."""
    from api.errors import RegistryError
    from api.resolve import load_experiment

    with pytest.raises(RegistryError) as caught:
        load_experiment("pettingzoo:classic/rps_v9")
    said = str(caught.value)
    assert "version v9 for 'classic/rps' not found" in said and "unknown experiment" not in said
    assert ".;" not in said


def test_a_games_tuple_observation_is_a_dict_keyed_by_position():
    """As the gymnasium adapter does: Troupe's encoders know Dicts, not Tuples (a game with one
    failed to build its policy); float64 boxes inside become float32 as elsewhere."""
    import gymnasium as gym

    from legacy.environment.pettingzoo_spaces import troupe_obs, troupe_space

    game = gym.spaces.Tuple([gym.spaces.Box(-1.0, 1.0, (2,), np.float64), gym.spaces.Discrete(3)])
    space = troupe_space(game)
    assert isinstance(space, gym.spaces.Dict) and list(space.spaces) == ["item0", "item1"]
    assert space["item0"].dtype == np.float32
    obs = troupe_obs((np.array([0.5, -0.25]), 2), space)
    assert obs["item0"].dtype == np.float32 and obs["item1"] == 2
    assert space.contains(obs)


def test_the_global_state_goes_beside_each_agents_observation():
    """MAPPO's critic input (``global_state=True``): each agent's observation becomes its own
    and the game's state, read once a step (MPE's state is the agents' observations side by
    side)."""
    pytest.importorskip("mpe2", reason="needs the 'mpe' extra")
    env = PettingZooParallelEnvironment("mpe2.simple_spread_v3:parallel_env", global_state=True)
    space = env.observation_spaces[0]
    assert list(space.spaces) == ["obs", "state"] and space["state"].shape == (54,)
    results = env.reset()
    for _ in range(3):
        for i, result in enumerate(results):
            assert space.contains(result.obs)
            assert np.array_equal(result.obs["state"][18 * i : 18 * (i + 1)], result.obs["obs"])
            assert result.obs["state"] is results[0].obs["state"]  # one read for all
        results = env.step([0, 1, 2])
    report = testing.test_environment(env, steps=60)
    assert report.observation_spaces[0].startswith(
        "Dict(obs: Box(-inf, inf, (18,), float32), state"
    )


def test_a_dict_observation_keeps_its_keys_and_its_mask_beside_the_state():
    env = PettingZooParallelEnvironment("pettingzoo_games:MaskedWalk", global_state=True)
    space = env.observation_spaces[1]
    assert list(space.spaces) == ["action_mask", "cell", "state"]  # gymnasium sorts them
    assert space["state"].dtype == np.float32  # the game's float64, as every box here
    env.seed(3)
    [_, b] = env.reset()
    assert b.obs["state"][1] == b.obs["cell"][0] and space.contains(b.obs)
    assert testing.test_environment(env, steps=50).episodes > 0


def test_a_game_without_a_global_state_is_refused_by_its_name():
    with pytest.raises(UserError) as e:
        PettingZooAECEnvironment(GIFT, global_state=True)
    assert str(e.value) == (
        f"global_state: PettingZoo environment '{GIFT}' has no global state (state_space and "
        "state()); MPE's games have one"
    )
    plain = PettingZooParallelEnvironment("pettingzoo_games:MaskedWalk")
    assert list(plain.observation_spaces[0].spaces) == ["action_mask", "cell"]  # as before
