"""One short real run from a .yaml experiment file, then what a user does with it: their own
callbacks saw the run, ``troupe.load_policy(run).act`` plays as ``troupe eval`` does, and
``troupe eval --video`` writes a playable video.

The run trains CartPole through a user file (``user_env.py`` beside the .yaml, named in its
``code.imports``) that registers a gymnasium id wrapping CartPole, whose last ``info`` of every
episode carries a unique number, and a ``recorder`` callback writing every hook to a file.
The unique numbers tell one evaluation episode from another in the callback's windows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
EVAL_EPISODES = 4
"""evaluation.episodes: the size of one evaluation window."""

USER_FILE = """\
import itertools
import json
import os

import gymnasium as gym

from api.registry import register_callback, register_environment

_numbers = itertools.count()


class Numbered(gym.Wrapper):
    \"\"\"CartPole whose last info of an episode has a number no other episode has.\"\"\"

    def __init__(self, log, **kwargs):
        super().__init__(gym.make("CartPole-v1", **kwargs))
        self.log = log

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            info = {**info, "uid": float(os.getpid() * 1_000_000 + next(_numbers))}
            with open(self.log, "a") as f:
                f.write(json.dumps(info["uid"]) + "\\n")
        return obs, reward, terminated, truncated, info


class Recorder:
    \"\"\"Writes every hook it receives, one JSON line each.\"\"\"

    def __init__(self, path):
        self.path = path

    def _write(self, **record):
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\\n")

    def on_episode_end(self, episode):
        self._write(hook="on_episode_end", episode=episode)

    def on_train_result(self, policy, stats):
        self._write(hook="on_train_result", policy=policy, steps=stats["steps"])

    def on_evaluation(self, mean_return, episodes):
        self._write(hook="on_evaluation", mean_return=mean_return, episodes=episodes)


gym.register("NumberedCartPole-v0", entry_point=Numbered)
register_environment(
    "NumberedCartPole-v0",
    "legacy.environment.gym_adapter:GymnasiumEnvironment",
    gym_id="NumberedCartPole-v0",
)
register_callback("recorder", Recorder)
"""

EXPERIMENT = """\
environment:
  type: NumberedCartPole-v0
  args: {{log: {episodes_log}}}
policies:
  default:
    policy: {{type: actor-critic, args: {{hidden_sizes: [32, 32]}}}}
    trainer: {{type: ppo, args: {{lr: 0.005, epochs: 4, minibatches: 2}}}}
    batch_segments: 8
actors: {{workers: 1, envs_per_worker: 8, segment_length: 64}}
evaluation: {{workers: 1, envs_per_worker: 2, episodes: {eval_episodes}}}
stop: {{env_frames: 12000}}
checkpoint: {{every: 5}}
seed: 3
callbacks:
  - {{type: recorder, args: {{path: {hooks_log}}}}}
code:
  imports: [user_env.py]
"""


def troupe(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "distributed.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
    )


@pytest.fixture(autouse=True)
def _registry_left_as_found():
    """``troupe.load_policy`` and ``troupe.evaluate`` import the run's user code in this
    process, as they must to build it: it registers ``NumberedCartPole-v0`` with gymnasium and
    with us, and ``recorder``. A later test's ``make_experiment`` would ship those names to its
    workers as that test's user code (a gymnasium id joins ours when gymnasium's are listed)."""
    import gymnasium as gym

    from api import registry

    registry.environments.names()  # loads the plugins first: the built-ins are part of what is kept
    kept = {kind: (dict(reg._specs), set(reg._user)) for kind, reg in registry.REGISTRIES.items()}
    gym_ids = set(gym.registry)
    yield
    for gym_id in set(gym.registry) - gym_ids:
        del gym.registry[gym_id]
    for kind, (specs, user) in kept.items():
        reg = registry.REGISTRIES[kind]
        reg._specs.clear()
        reg._specs.update(specs)
        reg._user.clear()
        reg._user.update(user)


def _lines(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """``troupe run exp.yaml``; what the hooks and the environments wrote during it."""
    folder = tmp_path_factory.mktemp("byo")
    (folder / "user_env.py").write_text(USER_FILE)
    (folder / "exp.yaml").write_text(
        EXPERIMENT.format(
            episodes_log=json.dumps(str(folder / "episodes.jsonl")),
            hooks_log=json.dumps(str(folder / "hooks.jsonl")),
            eval_episodes=EVAL_EPISODES,
        )
    )
    result = troupe("run", "exp.yaml", "--run-dir", "runs/exp", "--no-display", cwd=folder)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {
        "folder": folder,
        "run_dir": folder / "runs" / "exp",
        "hooks": _lines(folder / "hooks.jsonl"),
        "episode_uids": _lines(folder / "episodes.jsonl"),  # read now: eval adds to it later
    }


@pytest.mark.multiprocess
def test_a_yaml_experiment_runs_as_written(trained):
    run_dir = trained["run_dir"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "env_frames", summary
    config = json.loads((run_dir / "config.json").read_text())
    assert config["name"] == "exp"
    assert config["environment"]["type"] == "NumberedCartPole-v0"
    assert config["policies"]["default"]["trainer"]["args"]["lr"] == 0.005
    assert config["evaluation"]["episodes"] == EVAL_EPISODES
    assert config["seed"] == 3
    assert any((run_dir / "checkpoints" / "default").glob("v*"))


@pytest.mark.multiprocess
def test_user_callbacks_receive_every_hook(trained):
    hooks = trained["hooks"]
    by_hook: dict[str, list] = {}
    for h in hooks:
        by_hook.setdefault(h["hook"], []).append(h)
    assert set(by_hook) == {"on_episode_end", "on_train_result", "on_evaluation"}, set(by_hook)
    uids = set(trained["episode_uids"])
    for h in by_hook["on_episode_end"]:
        episode = h["episode"]
        assert episode["episode_length"] >= 1
        assert episode["policy/default/episode_return"] == pytest.approx(episode["episode_return"])
        assert episode["episode_info/uid"] in uids  # a real episode of the run's environments
    trained_uids = [h["episode"]["episode_info/uid"] for h in by_hook["on_episode_end"]]
    assert len(trained_uids) == len(set(trained_uids)), "an episode reached on_episode_end twice"
    steps = [h["steps"] for h in by_hook["on_train_result"]]
    assert {h["policy"] for h in by_hook["on_train_result"]} == {"default"}
    assert steps == sorted(set(steps)), f"trainer steps repeated or out of order: {steps}"


@pytest.mark.multiprocess
def test_on_evaluation_is_called_once_per_window_of_fresh_episodes(trained):
    """Each call gets one window: ``evaluation.episodes`` episodes none of which an earlier
    call saw, and the mean of exactly those returns."""
    calls = [h for h in trained["hooks"] if h["hook"] == "on_evaluation"]
    assert calls, "no evaluation window completed in the run"
    uids = set(trained["episode_uids"])
    seen: list[float] = []
    for call in calls:
        episodes = call["episodes"]
        assert len(episodes) == EVAL_EPISODES
        returns = [e["episode_return"] for e in episodes]
        assert call["mean_return"] == pytest.approx(np.mean(returns))
        window = [e["episode_info/uid"] for e in episodes]
        assert set(window) <= uids
        assert not set(window) & set(seen), f"call {calls.index(call)} repeats episodes {window}"
        seen += window
    assert len(seen) == len(set(seen))
    # and no episode skipped: the windows are the evaluation actor's first episodes, in order
    # (its uids count up from 0 in its process; one evaluation worker, never restarted)
    (pid,) = {int(u) // 1_000_000 for u in seen}
    assert [int(u) - pid * 1_000_000 for u in seen] == list(range(len(seen)))
    evaluated = [u for u in trained["episode_uids"] if int(u) // 1_000_000 == pid]
    assert len(calls) == len(seen) // EVAL_EPISODES <= len(evaluated) // EVAL_EPISODES


def _play(policy, seed: int, episodes: int) -> list[float]:
    """Greedy episodes one after another in one environment, each from its own seed, as an
    evaluation actor with one environment plays them (system.eval_quota.episode_seed)."""
    from system.eval_quota import episode_seed

    env = policy.make_env()
    returns = []
    try:
        for i in range(episodes):
            env.seed(episode_seed(seed, i))
            (result,), state, total = env.reset(), None, 0.0
            while not (result.done or result.truncated):
                action, state = policy.act(result.obs, state)
                (result,) = env.step([action])
                total += float(np.asarray(result.reward).reshape(-1)[0])
            returns.append(total)
    finally:
        env.close()
    return returns


@pytest.mark.multiprocess
def test_load_policy_act_reproduces_evaluate(trained):
    """``troupe eval`` with one environment plays its episodes in one environment, each seeded
    from its evaluation actor's seed and its number; ``act`` on the same environment and
    seeds must give the very same returns (greedy both)."""
    import troupe
    from system.run.plan import ActorPlan

    run_dir = trained["run_dir"]
    episodes = 6
    result = troupe.evaluate(run_dir, episodes=episodes, envs=1)
    policy = troupe.load_policy(run_dir)
    assert policy.version == result.versions["default"]
    said = f"LoadedPolicy('default', version {policy.version}, of experiment 'exp' on "
    assert repr(policy) == said + "'NumberedCartPole-v0')"  # not <... object at 0x7f...>
    # the first environment of evaluation actor 0, which SerialRun builds for troupe eval
    seed = ActorPlan("eval/0", index=0, evaluation=True).seed(policy.config)
    returns = _play(policy, seed, episodes)
    assert result.episodes == episodes
    assert np.mean(returns) == pytest.approx(result.mean_return, abs=1e-9)
    assert min(returns) == result.min_return and max(returns) == result.max_return
    # and from the checkpoint file itself
    (checkpoint,) = sorted((run_dir / "checkpoints" / "default").glob("v*"))[-1:]
    again = troupe.load_policy(checkpoint)
    assert _play(again, seed, episodes) == returns
    _another_seed_plays_other_episodes_as_exactly(trained, policy)


def _starts(policy, seed: int, episodes: int) -> list[tuple[float, ...]]:
    """The first observation of each episode :func:`_play` plays from ``seed``."""
    from system.eval_quota import episode_seed

    env = policy.make_env()
    try:
        starts = []
        for i in range(episodes):
            env.seed(episode_seed(seed, i))
            (result,) = env.reset()
            starts.append(tuple(np.asarray(result.obs, dtype=float).ravel()))
        return starts
    finally:
        env.close()


def _another_seed_plays_other_episodes_as_exactly(trained, policy) -> None:
    """``troupe eval`` replayed the run's own episode seeds, with no way to ask for others: a
    second opinion on a run played the starts its evaluation actor had played. (Part of the
    test above: the run's user code registers its names once in a process.)"""
    import dataclasses

    import troupe as api
    from api.errors import UserError
    from system.run.plan import ActorPlan

    run_dir = trained["run_dir"]
    result = api.evaluate(run_dir, episodes=6, envs=1, seed=1234)
    plan = ActorPlan("eval/0", index=0, evaluation=True)
    seed = plan.seed(dataclasses.replace(policy.config, seed=1234))
    returns = _play(policy, seed, 6)
    assert np.mean(returns) == pytest.approx(result.mean_return, abs=1e-9)
    # other starts (their returns may be the same: a solved CartPole scores 500 from each)
    assert _starts(policy, seed, 6) != _starts(policy, plan.seed(policy.config), 6)
    cli = troupe("eval", str(run_dir), "--episodes", "6", "--envs", "1", "--seed", "1234",
                 "--json", cwd=trained["folder"], timeout=300)  # fmt: skip
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert json.loads(cli.stdout.strip().splitlines()[-1])["mean_return"] == result.mean_return
    with pytest.raises(UserError, match="seed must be a whole number of at least 0, got -1"):
        api.evaluate(run_dir, seed=-1)


@pytest.mark.multiprocess
def test_eval_video_writes_a_playable_mp4(trained, tmp_path):
    imageio = pytest.importorskip("imageio.v3")
    out = tmp_path / "out.mp4"
    result = troupe(
        "eval", str(trained["run_dir"]), "--episodes", "2", "--video", str(out),
        cwd=trained["folder"], timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "greedy episodes of default, played for it (returns " in result.stdout, result.stdout
    printed = result.stdout.split("(returns ")[1].split(")")[0]
    returns = json.loads(printed)
    assert len(returns) == 2  # as many as --episodes asked (issue 28: it used to be one)
    frames = imageio.imread(out, index=None)
    # one frame after each reset and one per step: a CartPole step earns 1
    assert frames.shape[0] == sum(int(r) + 1 for r in returns), (frames.shape, returns)
    assert "XDG_RUNTIME_DIR" not in result.stdout + result.stderr  # no foreign noise
    assert frames.ndim == 4 and frames.shape[-1] == 3 and frames.shape[1] > 100
    assert frames.std() > 1.0  # a drawing, not a blank


@pytest.mark.multiprocess
def test_train_resume_continues_a_run_as_troupe_run_resume_does(trained, tmp_path):
    """``troupe.train(resume=RUN)`` continues a copy of the run from its own config: a budget
    the run has spent is refused before anything starts, a raised one is trained to, in the
    background, followed by ``new_metrics`` reads that together hold every record. (In a
    script of its own: the run's user file registers its environment when first imported.)"""
    import troupe
    from api.errors import UserError

    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(trained["run_dir"]), str(copy)], check=True)
    (copy / ".troupe.lock").unlink(missing_ok=True)
    frames = json.loads((copy / "summary.json").read_text())["env_frames"]
    before = len((copy / "metrics.jsonl").read_text().splitlines())  # the first part's records
    with pytest.raises(UserError, match="pass either resume=RUN_DIR or an experiment"):
        troupe.train("cartpole-ppo", resume=copy)
    script = (
        "import sys, time, troupe\n"
        "from api.errors import UserError\n"
        "try:\n"
        "    troupe.train(resume=sys.argv[1])\n"
        "except UserError as e:\n"
        "    print('REFUSED', e)\n"
        "r = troupe.train(resume=sys.argv[1], overrides=[f'stop.env_frames={sys.argv[2]}'],\n"
        "                 background=True)\n"
        "try:\n"  # a second controller on the folder, from this same process
        "    troupe.train(resume=sys.argv[1], background=True)\n"
        "except UserError as e:\n"
        "    print('BUSY', e)\n"
        "polled, reads = [], 0\n"  # followed as it trains: each read only what is new
        "while r.running:\n"
        "    polled += r.new_metrics(['env_frames'])\n"
        "    reads += 1\n"
        "    time.sleep(0.2)\n"
        "r.wait()\n"
        "polled += r.new_metrics(['env_frames'])\n"
        "whole = r.metrics(['env_frames'])\n"
        "tail = r.metrics(['env_frames'], last=1)\n"
        "print('FOLLOWED', reads, len(whole), polled == whole, whole[-1:] == tail)\n"
        "print('LATEST', r.latest == r.metrics(last=1)[0])\n"  # the last is written too
        "print('EXIT', r.exit_code, r.summary['env_frames'])\n"
    )
    target = frames + 3000
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", script, str(copy), str(target)],
        capture_output=True, text=True, timeout=300, env=env, cwd=trained["folder"],
    )  # fmt: skip
    out = result.stdout[-3000:] + result.stderr[-3000:]
    refused = f"REFUSED nothing to resume in {copy}: the run already reached stop.env_frames=12000"
    assert refused in out
    assert f"BUSY run folder {copy} is in use by a run this process" in out
    followed = result.stdout.split("FOLLOWED ")[-1].split()
    # read more than once, and the reads hold the resumed part's records after the first's (a
    # fixed count of records raced the run: 3,000 frames can take under a second here)
    assert int(followed[0]) > 1 and int(followed[1]) > before, (before, out)
    assert followed[2:4] == ["True", "True"], out
    assert "LATEST True" in result.stdout, out
    said = result.stdout.split("EXIT ")[-1].split()
    assert said[0] == "0" and int(said[1]) >= target, out
    (record,) = [json.loads(line) for line in (copy / "resumes.jsonl").read_text().splitlines()]
    assert record["changed"]["stop.env_frames"] == [12000, target]
    assert "still training" not in out  # it waited: nothing to say at its exit


@pytest.mark.multiprocess
def test_a_script_that_ends_before_its_background_run_says_it_waits_for_it(tmp_path):
    """Python waits at exit for a child process: a script that forgot ``wait()`` sat silent
    until its run ended, as if hung."""
    script = (
        "import troupe\n"
        "if __name__ == '__main__':\n"
        "    troupe.train('cartpole-ppo', ['stop.eval_return=None', 'stop.env_frames=3000',\n"
        "                 'evaluation.workers=0'], run_dir='runs/bg', background=True)\n"
        "    print('LEFT')\n"
    )
    (tmp_path / "bg.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "bg.py"], capture_output=True, text=True,
                            timeout=300, env=env, cwd=tmp_path)  # fmt: skip
    out = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0 and "LEFT" in result.stdout, out
    said = " ".join(result.stderr.split())
    assert "troupe: the background run in runs/bg is still training; waiting for it" in said, out
    summary = json.loads((tmp_path / "runs" / "bg" / "summary.json").read_text())
    assert summary["stop_reason"] == "env_frames", summary


def test_load_policy_act_takes_a_gymnasium_tuple_as_the_run_saw_it():
    """A run of Blackjack-v1 saw its Tuple observations as Dicts keyed by position; a user
    playing the loaded policy on gymnasium's own env passes raw tuples, which failed with an
    IndexError deep in the encoder."""
    import gymnasium as gym

    from algorithm.actor_critic_policies.policy import ActorCriticPolicy
    from api.spaces import dict_of_tuples
    from distributed.api import LoadedPolicy

    raw = gym.make("Blackjack-v1")
    space = dict_of_tuples(raw.observation_space)
    policy = LoadedPolicy(ActorCriticPolicy(space, raw.action_space, seed=1), None, "default", 0)
    obs, _ = raw.reset(seed=5)
    assert isinstance(obs, tuple)
    action, _ = policy.act(obs)
    same, _ = policy.act(dict(zip(space.spaces, obs, strict=True)))
    assert raw.action_space.contains(int(action)) and action == same


def test_load_policy_act_takes_a_tuple_inside_a_tuple():
    import gymnasium as gym

    from algorithm.actor_critic_policies.policy import ActorCriticPolicy
    from api.spaces import dict_of_tuples
    from distributed.api import LoadedPolicy

    hand = gym.spaces.Tuple([gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,))])
    raw = gym.spaces.Tuple([hand, gym.spaces.Discrete(4)])
    space = dict_of_tuples(raw)
    policy = LoadedPolicy(ActorCriticPolicy(space, gym.spaces.Discrete(2), seed=1), None, "d", 0)
    raw.seed(3)
    obs = raw.sample()
    action, _ = policy.act(obs)
    keyed = {"item0": {"item0": obs[0][0], "item1": obs[0][1]}, "item1": obs[1]}
    same, _ = policy.act(keyed)
    assert int(action) in (0, 1) and action == same


def test_load_policy_act_names_an_observation_its_policy_cannot_take():
    """A raw Atari frame given to a policy of preprocessed ones ended in torch's "expected
    input[1, 210, 160, 3] to have 4 channels, but got 210 channels instead", deep in the
    network; a dict without one of its keys in a KeyError from a NamedArray."""
    import gymnasium as gym

    from algorithm.actor_critic_policies.policy import ActorCriticPolicy
    from api.errors import UserError
    from distributed.api import LoadedPolicy

    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    pixels = LoadedPolicy(ActorCriticPolicy(frames, gym.spaces.Discrete(6), seed=1), None, "p", 0)
    raw_frame = np.zeros((210, 160, 3), np.uint8)
    with pytest.raises(UserError, match=r"policy 'p' cannot take this observation: observation "
                                        r"has shape \(210, 160, 3\), declared \(4, 84, 84\)"
                                        r".*make_env\(\) makes one"):  # fmt: skip
        pixels.act(raw_frame)
    with pytest.raises(UserError, match=r"has dtype float32, declared uint8"):
        pixels.act(np.zeros((4, 84, 84), np.float32))
    assert 0 <= int(pixels.act(np.zeros((4, 84, 84), np.uint8))[0]) < 6

    keyed = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (3,)), "flag": gym.spaces.Discrete(3)})
    policy = LoadedPolicy(ActorCriticPolicy(keyed, gym.spaces.Discrete(2), seed=1), None, "d", 0)
    with pytest.raises(UserError, match=r"observation has fields \['pos'\]; missing \['flag'\]"):
        policy.act({"pos": np.zeros(3, np.float32)})
    # what a user's own code hands over as it is: a list of floats, a plain int
    assert int(policy.act({"pos": [0.1, 0.2, 0.3], "flag": 2})[0]) in (0, 1)


EVALUATED_APART = """
import json, sys
import numpy as np
import troupe

run = sys.argv[1]
result = troupe.train("cartpole-ppo", ["stop.eval_return=None", "stop.env_frames=30000",
                                       "evaluation.env_args.max_episode_steps=20"], run_dir=run)
records = result.metrics(["episode_length", "eval/episode_length"])
greedy = troupe.evaluate(run, episodes=4, envs=2)
policy = troupe.load_policy(run)
lengths = []
for evaluation in (True, False):
    env = policy.make_env(evaluation=evaluation)
    (step,), state, n = env.reset(), None, 0
    while not (step.done or step.truncated) and n < 600:
        action, state = policy.act(step.obs, state)
        (step,), n = env.step([action]), n + 1
    lengths.append(n)
print("RESULT", json.dumps({
    "code": result.exit_code,
    "train": max(r["episode_length"] for r in records if r.get("episode_length")),
    "eval": max(r["eval/episode_length"] for r in records if r.get("eval/episode_length")),
    "troupe_eval": [greedy.min_return, greedy.max_return],
    "troupe_eval_args": greedy.env_args,
    "make_env": lengths,
}))
"""


@pytest.mark.multiprocess
def test_evaluation_plays_its_own_environment_arguments(tmp_path):
    """``evaluation.env_args`` (CartPole cut at 20 steps here) reach the run's evaluation
    actors, ``troupe eval`` and ``make_env(evaluation=True)``; training plays on as before."""
    script = tmp_path / "apart.py"
    script.write_text(EVALUATED_APART)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], env=env,
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stdout[-2000:] + result.stderr[-2000:]
    said = json.loads(lines[0].removeprefix("RESULT "))
    assert said["code"] == 0 and said["eval"] <= 20 < said["train"], said
    assert said["troupe_eval"] == [20.0, 20.0], said  # every greedy episode cut at 20 steps
    assert said["troupe_eval_args"] == {"max_episode_steps": 20}  # which troupe eval says
    assert said["make_env"][0] == 20 < said["make_env"][1], said
