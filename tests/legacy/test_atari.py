"""Atari-v0 smoke tests: preprocessing, episodic life, reward clipping, and PPO on real frames.

They need the ``atari`` extra (``pip install -e '.[atari]'``; the ``test`` extra includes it) and
skip, saying so, without it. Each game here is short (random play, or a frame limit), so the
module runs in a few seconds.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from api import testing
from api.config import auto_actor_workers
from api.environment import make
from api.errors import UserError
from legacy.environment.atari import AreaResize, AtariEnvironment  # ale-py only when built
from legacy.experiments.atari import pong_ppo, pong_ppo_gpu
from legacy.experiments.by_algo import auto

pytest.importorskip("ale_py", reason="Atari tests need ale-py: pip install -e '.[atari]'")
pytest.importorskip("cv2", reason="Atari tests need opencv: pip install -e '.[atari]'")


def _play(env: AtariEnvironment, seed: int, steps: int):
    """Random actions (from ``seed``) for ``steps`` agent steps, resetting after each episode;
    returns every StepResult."""
    rng = np.random.default_rng(seed)
    env.seed(seed)
    results = [env.reset()[0]]
    for _ in range(steps):
        result = env.step([int(rng.integers(env.action_spaces[0].n))])[0]
        results.append(result)
        if result.done or result.truncated:
            results.append(env.reset()[0])
    return results


def test_pong_observations_are_stacked_84x84_uint8_frames_channel_first():
    env = make("Atari-v0", game="Pong")
    space = env.observation_spaces[0]
    assert space.shape == (4, 84, 84) and space.dtype == np.uint8
    env.seed(0)
    first = env.reset()[0].obs
    assert first.shape == (4, 84, 84) and first.dtype == np.uint8 and space.contains(first)
    assert all(np.array_equal(first[0], plane) for plane in first)  # a reset fills the stack
    previous = first
    for _ in range(5):
        obs = env.step([0])[0].obs
        assert obs.dtype == np.uint8 and np.array_equal(obs[:-1], previous[1:])
        previous = obs
    assert previous.std() > 0  # a real screen, not a blank one
    env.close()


def test_atari_passes_the_environment_check_with_episode_ends():
    report = testing.test_environment("Atari-v0", steps=120, env_kwargs=dict(game="Breakout"))
    assert report.episodes >= 1 and report.determinism_steps > 0


def test_a_lost_life_ends_the_episode_but_not_the_game():
    env = AtariEnvironment("Breakout", max_episode_frames=20_000)
    results = _play(env, seed=1, steps=600)
    ends = [r for r in results if r.done or r.truncated]
    game_end = next(i for i, r in enumerate(ends) if "game_return" in r.info)
    # Breakout has 5 lives: 4 episodes end on a lost life, the 5th ends the game.
    assert [r.info.get("lives") for r in ends[:game_end]] == [4, 3, 2, 1]
    assert all(r.done and not r.truncated for r in ends[: game_end + 1])
    env.close()

    whole = AtariEnvironment("Breakout", episodic_life=False, max_episode_frames=20_000)
    results = _play(whole, seed=1, steps=400)
    first_end = next(r for r in results if r.done or r.truncated)
    assert "game_return" in first_end.info  # no episode ended before the game did
    whole.close()


def test_a_whole_game_goes_on_after_a_lost_life_without_the_agent_pressing_fire():
    """Evaluation plays whole games: after a lost life Breakout waits for FIRE, which the reset
    presses in training. A greedy policy that had never needed it played on to the frame
    limit (here, a NOOP each step: 20,000 frames, then truncated)."""
    env = AtariEnvironment("Breakout", episodic_life=False, max_episode_frames=20_000)
    env.seed(3)
    env.reset()
    steps, result = 0, None
    while result is None or not (result.done or result.truncated):
        (result,) = env.step([0])  # NOOP
        steps += 1
    assert result.done and not result.truncated and env._ale.lives() == 0
    assert result.info["game_frames"] < 20_000 and steps < 5_000
    env.close()


def test_rewards_are_clipped_for_training_and_the_score_is_reported_unclipped():
    """Same seed and actions, so the same game twice: once clipped, once not."""
    kwargs = dict(game="SpaceInvaders", max_episode_frames=1600, episodic_life=False)
    clipped = _play(AtariEnvironment(clip_rewards=True, **kwargs), seed=2, steps=401)
    raw = _play(AtariEnvironment(clip_rewards=False, **kwargs), seed=2, steps=401)
    clipped_rewards = np.array([r.reward for r in clipped])
    raw_rewards = np.array([r.reward for r in raw])
    assert raw_rewards.max() > 1  # Space Invaders scores 5 to 30 a hit
    assert set(clipped_rewards) <= {-1.0, 0.0, 1.0}
    np.testing.assert_array_equal(clipped_rewards, np.sign(raw_rewards))
    end = next(i for i, r in enumerate(clipped) if "game_return" in r.info)
    assert clipped[end].info == raw[end].info
    assert clipped[end].info["game_return"] == raw_rewards[: end + 1].sum() > end / 10
    # every frame of the game: the agent steps' (4 each) and the no-op and FIRE ones at reset
    assert 4 * end < clipped[end].info["game_frames"] <= 4 * end + 32


def test_bad_arguments_are_named():
    with pytest.raises(UserError, match=r"frame_skip must be an int of 1 or more.*interpolation"):
        AtariEnvironment(frame_skip=0, interpolation="cubic")
    with pytest.raises(UserError, match=r"game='Pongg' is not an ALE game; did you mean 'Pong'"):
        AtariEnvironment(game="Pongg")


@pytest.mark.parametrize("recipe", [pong_ppo, pong_ppo_gpu])
def test_pong_ppo_trains_one_step_on_real_frames(recipe):
    """pong-ppo's own environment, policy and trainer, through the runtime's serial pipeline:
    real Pong frames into the Nature CNN and one PPO step (games cut short to end episodes).
    The GPU layout's policy (cuda, fused Adam) falls back to the CPU here when there is none."""
    config = recipe()
    config.environment.args["max_episode_frames"] = 200
    config.actors.segment_length = 16
    policy = config.policies["default"]
    policy.batch_segments = 2
    policy.trainer = dataclasses.replace(policy.trainer, args={**policy.trainer.args, "epochs": 1})
    report = testing.test_pipeline(experiment=config, trainer_steps=1, envs=2)
    assert report.trainer_steps["default"] >= 1 and report.episodes >= 1
    assert tuple(report.batch_shapes["default"]["obs"]) == (17, 2, 4, 84, 84)
    obs_shape = report.batch_shapes["default"]["obs"]
    assert tuple(obs_shape) == (17, 2, 4, 84, 84)


def test_the_gpu_layout_sizes_its_actors_from_the_cores():
    """pong-ppo-gpu: pong-ppo's environment and network, with the GPU machine's layout, and as
    many actors as the cores its other roles leave (actors.workers=auto's rule)."""
    config, base = pong_ppo_gpu(), pong_ppo()
    policy = config.policies["default"]
    assert config.environment == base.environment
    assert policy.policy.type == base.policies["default"].policy.type
    assert policy.policy.args["device"] == "cuda" and policy.policy_workers == 2
    assert policy.policy.args["cuda_graphs"] is True  # ignored on the CPU
    assert policy.trainer.args["cuda_graphs"] is True  # plain padded minibatches on the CPU
    assert policy.batch_segments * config.actors.segment_length == 4096
    layout = {"policies": {"default": {"policy_workers": 2, "trainer": {"type": "ppo"}}}}
    layout["policies"]["default"]["trainer_workers"] = 1
    assert config.actors.workers == auto_actor_workers(layout)
    assert auto_actor_workers(layout, cores=16) == 12
    assert config.evaluation.max_fps is None


@pytest.mark.parametrize(
    "size_in, size_out", [((210, 160), (84, 84)), ((210, 160), (64, 48)), ((84, 84), (84, 84))]
)
def test_area_resize_gives_opencvs_area_interpolation(size_in, size_out):
    """AreaResize is INTER_AREA computed another way: at most one grey level apart where a sum
    lands on a rounding tie, and on nearly every pixel the same."""
    import cv2

    rng = np.random.default_rng(0)
    resize = AreaResize(size_in, size_out)
    for _ in range(5):
        image = rng.integers(0, 256, size_in, dtype=np.uint8)
        ours = resize(image)
        theirs = cv2.resize(image, size_out[::-1], interpolation=cv2.INTER_AREA)
        assert ours.shape == theirs.shape == size_out and ours.dtype == np.uint8
        diff = np.abs(ours.astype(int) - theirs)
        assert diff.max() <= 1 and (diff > 0).mean() < 0.01


def test_pong_frames_are_resized_as_opencv_resizes_them():
    import cv2

    env = AtariEnvironment(max_episode_frames=400)
    env.seed(3)
    env.reset()
    rng = np.random.default_rng(3)
    differing = 0
    for _ in range(300):
        env.step([int(rng.integers(6))])
        frame = np.maximum(env._pool[0], env._pool[-1])
        theirs = cv2.resize(frame, (84, 84), interpolation=cv2.INTER_AREA)
        diff = np.abs(env._resize(frame).astype(int) - theirs)
        assert diff.max() <= 1
        differing += int((diff > 0).sum())
        if env._episode_over:
            env.reset()
    assert differing <= 300 * 84 * 84 // 1000


def test_steps_match_gymnasiums_atari_preprocessing():
    """The same game, seed and actions through gymnasium's ``AtariPreprocessing`` (frame skip,
    max-pool of the last two screens, 84x84 area resize), the reference this environment
    re-implements for speed: the same rewards and, each step, the same newest frame within
    AreaResize's one grey level."""
    import gymnasium as gym

    ours = AtariEnvironment(
        noop_max=0, episodic_life=False, clip_rewards=False, fire_on_reset=False
    )
    reference = gym.wrappers.AtariPreprocessing(
        gym.make(ours.gym_id, frameskip=1, repeat_action_probability=0.0), noop_max=0
    )
    ours.seed(5)
    first = ours.reset()[0].obs[-1]
    assert np.abs(first.astype(int) - reference.reset(seed=5)[0]).max() <= 1
    rng = np.random.default_rng(5)
    rewards = 0.0
    for _ in range(400):  # random play loses a point every ~60 steps, a game in ~1,000
        action = int(rng.integers(6))
        result = ours.step([action])[0]
        frame, reward, terminated, truncated, _ = reference.step(action)
        assert not (terminated or truncated or result.done or result.truncated)
        assert result.reward == reward
        diff = np.abs(result.obs[-1].astype(int) - frame)
        assert diff.max() <= 1 and (diff > 0).mean() < 0.01
        rewards += reward
    assert rewards < 0  # points were played, so the frames moved
    ours.close()
    reference.close()


def test_area_resize_refuses_to_enlarge():
    with pytest.raises(ValueError, match="downscales only"):
        AreaResize((84, 84), (100, 84))


def test_troupe_train_of_an_atari_id_gets_the_atari_recipe():
    """`troupe train ALE/Breakout-v5` used to set up PPO from the raw 210x160 RGB spaces (a
    few dozen frames/s, no preprocessing); an Atari id now gets pong-ppo's recipe for its game,
    with the id's sticky actions."""

    breakout = auto("ALE/Breakout-v5")
    assert breakout.environment.type == "Atari-v0" and breakout.name == "ale-breakout-v5-ppo"
    assert breakout.environment.args["game"] == "Breakout"
    assert breakout.environment.args["repeat_action_probability"] == 0.25  # v5's protocol
    assert breakout.evaluation.workers == 0 and breakout.stop.eval_return is None
    assert "give one with target= (a greedy game's score)" in breakout.stop.eval_return_source
    assert breakout.policies["default"].trainer.args == pong_ppo().policies["default"].trainer.args

    pong = auto("PongNoFrameskip-v4", {"noop_max": 10}, frames=1_024_000)
    assert pong.environment.args["repeat_action_probability"] == 0.0  # the v4 protocol
    assert pong.environment.args["noop_max"] == 10
    assert pong.stop.eval_return == 18.0 and pong.stop.env_frames == 1_024_000
    assert pong.policies["default"].trainer.args["total_steps"] == 2_000  # 512 a step
    invaders = auto("ALE/SpaceInvaders-v5", target=5.0)
    assert invaders.environment.args["game"] == "SpaceInvaders"
    assert invaders.stop.eval_return == 5.0 and invaders.evaluation.workers == 1
    sticky = auto("ALE/Pong-v5", {"repeat_action_probability": 0.0, "frameskip": 3})
    assert sticky.environment.args["repeat_action_probability"] == 0.0
    assert sticky.environment.args["frame_skip"] == 3  # the id's argument, as Atari-v0 names it
    with pytest.raises(UserError, match="Atari-v0, which has no 'mode'"):
        auto("ALE/Pong-v5", {"mode": 1})
    ram = auto("ALE/Pong-v5", {"obs_type": "ram"}, frames=1000)  # 128 bytes: a vector
    assert ram.environment.type == "ALE/Pong-v5" and ram.name == "ale-pong-v5-ppo"


def test_impala_and_dqn_on_an_atari_id_get_the_atari_recipes():
    """`troupe train ALE/Pong-v5 --algo impala|dqn` set the network up from the raw 210x160
    RGB screen with CartPole's numbers; they now play through Atari-v0 as `--algo ppo` does,
    with the IMPALA paper's and the RL Zoo's Atari settings."""
    from api.config import validate
    from legacy.experiments.by_algo import dqn, impala

    ppo_env = auto("ALE/Pong-v5").environment
    vtrace = impala("ALE/Pong-v5")
    assert vtrace.name == "ale-pong-v5-impala" and vtrace.environment == ppo_env
    policy = vtrace.policies["default"]
    assert policy.policy.type == "actor-critic" and policy.trainer.type == "impala"
    assert vtrace.actors.segment_length * policy.batch_segments == 20 * 32
    assert policy.trainer.args["total_steps"] == 10_000_000 // 640
    assert vtrace.stop.eval_return == 18.0 and validate(vtrace) == []

    q = dqn("ALE/Breakout-v5", frames=2_000_000)
    assert q.name == "ale-breakout-v5-dqn" and q.environment.args["game"] == "Breakout"
    assert q.evaluation.workers == 0 and q.stop.env_frames == 2_000_000
    default = q.policies["default"]
    assert default.policy.type == "q-network" and default.trainer.type == "dqn"
    assert default.policy.args["epsilon"]["decay_frames"] == 200_000  # 10% of the frames
    replay = default.replay
    assert replay.capacity_frames == replay.min_size == 100_000 and replay.save_every_s is None
    assert validate(q) == []  # 100k frames are whole segments: min_size can be reached
    ram = dqn("ALE/Pong-v5", {"obs_type": "ram"}, frames=1000)  # 128 bytes: the vector recipe
    assert ram.environment.type == "ALE/Pong-v5" and ram.name == "ale-pong-v5-dqn"


@pytest.mark.parametrize("algo", ["impala", "dqn"])
def test_the_atari_impala_and_dqn_recipes_train_on_real_frames(algo):
    """Each recipe's environment, network and trainer through the serial pipeline (games cut
    short, a small buffer for DQN): real frames into the Nature CNN, and trainer steps."""
    from legacy.experiments import by_algo

    config = getattr(by_algo, algo)("ALE/Pong-v5", {"max_episode_frames": 200}, frames=10_000)
    config.actors.segment_length = 16
    policy = config.policies["default"]
    policy.batch_segments = 2
    policy.replay.capacity_frames, policy.replay.min_size = 1_024, 64
    report = testing.test_pipeline(experiment=config, trainer_steps=2, envs=2)
    assert report.trainer_steps["default"] >= 2 and report.episodes >= 1
    assert tuple(report.batch_shapes["default"]["obs"])[-3:] == (4, 84, 84)


def test_greedy_evaluation_of_an_atari_game_plays_whole_games_at_their_score():
    """Training plays lives with clipped rewards; evaluation played them too, so a greedy
    Breakout return was the bricks of one life, counted 1 each, and target= was no score."""
    from system.run.builders import env_factory

    invaders = auto("ALE/SpaceInvaders-v5", target=300.0)
    assert invaders.evaluation.env_args == {"episodic_life": False, "clip_rewards": False}
    for config in (pong_ppo(), pong_ppo_gpu(), auto("ALE/Breakout-v5")):
        assert config.evaluation.env_args == invaders.evaluation.env_args
    # a window of a Pong version that has lost too much to reach 18 ends there
    assert pong_ppo().stop.max_return == pong_ppo_gpu().stop.max_return == 21.0
    assert auto("ALE/Pong-v5").stop.max_return == 21.0 and invaders.stop.max_return is None
    invaders.environment.args["max_episode_frames"] = 4000  # a short game for the test
    train, greedy = env_factory(invaders)(0), env_factory(invaders, evaluation=True)(0)
    assert (train.episodic_life, train.clip_rewards) == (True, True)
    played = _play(greedy, seed=2, steps=2000)
    end = next(i for i, r in enumerate(played) if r.done or r.truncated)
    assert "game_return" in played[end].info  # the first episode is the whole game
    assert sum(r.reward for r in played[: end + 1]) == played[end].info["game_return"] > 1
    train.close()
    greedy.close()


@pytest.mark.parametrize("made", ["make('Atari-v0', game='Pong')", "make('ALE/Pong-v5')"])
def test_making_a_game_prints_no_banner(made):
    """ALE printed "A.L.E: Arcade Learning Environment (version ...)" and "[Powered by Stella]"
    from every process that made a game: an actor's, the policy worker's and the trainer's probe
    of the spaces, through the live panel."""
    import subprocess
    import sys

    code = "from api.environment import make; "
    code += f"env = {made}; env.reset(); env.close(); print('made')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "made", done.stderr[-2000:]
    assert "A.L.E" not in done.stderr and "Stella" not in done.stderr, done.stderr
