"""The Python API: train, evaluate and act with a trained policy, from a script or a notebook.

Re-exported by the top-level ``troupe`` module (``import troupe``)::

    result = troupe.train("cartpole-ppo")                 # blocks; a RunResult
    result = troupe.train(config, background=True)        # returns at once; result.wait()
    result = troupe.train(resume=result.run_dir,         # a solved run trained on
                          overrides=["stop.eval_return=None", "stop.env_frames=2000000"])
    policy = troupe.load_policy(result.run_dir)
    action, state = policy.act(obs)

``train`` is ``troupe run`` without the terminal: the same resolution of what is named (a
registered experiment, an experiment file, an environment id or an ExperimentConfig), the same
checks before anything starts, the same controller process and workers. Components the calling
script registered itself go with the run's config to every worker (see :mod:`api.code`).
"""

from __future__ import annotations

import argparse
import atexit
import difflib
import inspect
import json
import os
import signal
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import numpy as np

from api import user_code
from api.config import ExperimentConfig
from api.errors import ConfigError, UserError
from api.namedarray import NamedArray
from api.policy import Policy, RolloutRequest
from api.spaces import from_positions
from system import run_folder
from system.run.metrics_file import MetricsTail, key_filter, newest_record, read_metrics
from system.streams.validation import action_bounds, fit_actions


@dataclass
class RunResult:
    """A run folder and, while it trains in the background, the process running it (the
    controller, or with ``launcher="docker"`` the one running its containers)."""

    run_dir: Path
    """Where the run writes config.json, metrics.jsonl, checkpoints/, summary.json, ..."""
    exit_code: int | None = None
    """0 done or solved, 1 failed, 130 interrupted (stopped in order), 131 stopped at once by
    a second interrupt; None while running."""
    _process: BaseProcess | None = field(default=None, repr=False)
    _tail: MetricsTail | None = field(default=None, repr=False)

    def wait(self, timeout_s: float | None = None) -> RunResult:
        """Block until the run ends (or ``timeout_s`` passes); returns self."""
        from distributed.launch.run import wait_local
        from system.run import folder_lock

        if self._process is not None and self.exit_code is None:
            self.exit_code = wait_local(self._process, timeout_s)
            if self.exit_code is not None:  # the folder is free for a resume, here or elsewhere
                folder_lock.release(self.run_dir)
        return self

    @property
    def running(self) -> bool:
        return self._process is not None and self.exit_code is None and self._process.is_alive()

    def stop(self) -> RunResult:
        """Stop the run in order (as Ctrl+C does) and wait for it."""
        if self.running and self._process.pid is not None:
            os.kill(self._process.pid, signal.SIGINT)
        return self.wait()

    @property
    def summary(self) -> dict[str, Any]:
        """``summary.json`` (empty until the run has ended)."""
        path = self.run_dir / run_folder.SUMMARY
        return json.loads(path.read_text()) if path.exists() else {}

    def metrics(
        self, keys: Iterable[str] | None = None, last: int | None = None
    ) -> list[dict[str, Any]]:
        """The records of ``metrics.jsonl`` so far, oldest first (one a second for the first
        hour, then fewer: ``metrics.thin``).

        ``keys``: only these keys of each record, e.g. ``["env_frames", "episode_return"]``; a
        name ending in "/" keeps every key under it (``"trainer/default/"``). ``last``: only the
        last so many records, read from the file's end. A long run's file is tens of MB even
        thinned, and far more as dicts: ask for what you plot.
        """
        if last is not None and last < 0:
            raise UserError(f"last: the number of records to read, 0 or more; got {last}")
        return read_metrics(self.run_dir, key_filter(keys), last)

    @property
    def latest(self) -> dict[str, Any] | None:
        """The run's record of its last second (``latest.json``), kept in ``metrics.jsonl`` or
        not (after an hour the file keeps one in 10 s, after a day one a minute); None before
        the first."""
        return newest_record(self.run_dir)

    def new_metrics(self, keys: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """The records written since this method's previous call (the first call: all so far),
        for a loop or a notebook cell that follows the run: it reads only what is new."""
        if self._tail is None:
            self._tail = MetricsTail(self.run_dir)
        return self._tail.read(key_filter(keys))


def train(
    experiment: str | ExperimentConfig | None = None,
    overrides: Sequence[str] = (),
    *,
    run_dir: str | Path | None = None,
    resume: str | Path | None = None,
    imports: Sequence[str] = (),
    background: bool = False,
    display: bool = False,
    secure: bool = False,
    launcher: str = "local",
    image: str | None = None,
    algo: str | None = None,
    metrics_port: int | None = None,
    **settings: Any,
) -> RunResult:
    """Run an experiment with every role in its own process, as ``troupe run`` does.

    ``experiment``: an ExperimentConfig, a registered name, an experiment file or an environment
    id; ``overrides``: ``key.path=value`` strings; ``imports``: your own files or modules that
    workers import first. Bad config raises ConfigError before any process starts.
    ``settings``: undotted overrides as keywords, ``train("CartPole-v1", target=400,
    frames=100_000, seed=3)`` as ``troupe train CartPole-v1 target=400 frames=100000 seed=3``
    (an experiment's arguments, or a top-level key); a dotted key goes in ``overrides``.
    ``algo``: with an environment id, the algorithm set up on it, as ``troupe train ENV --algo
    ALGO`` (``auto``, ``ppo``, ``impala``, ``dqn``, ``sac``; without it an id trains ``ppo``).
    ``metrics_port``: serve Prometheus metrics there while the run goes on (0: any free port,
    named in ``endpoints.json``; with Docker, the controller's published on this machine), as
    ``--metrics-port``.
    ``background=True`` returns while it trains: ``wait()``, ``stop()``, ``metrics()``,
    ``new_metrics()``, ``latest``; a script that ends before its run waits for it at exit.
    ``resume``: a run folder to continue instead (``troupe run --resume``): its own config,
    ``overrides`` changing what may change (stop rules, worker counts, learning rates).
    ``launcher``: ``"local"`` (processes here) or ``"docker"`` (every role in its own container
    of ``image``, default ``troupe image build``'s tag; your registered files are mounted into
    them), as ``troupe run --launcher docker --image IMAGE``.
    """
    from api.algorithms import on_environment
    from api.config.load import string_list
    from api.user_code import refuse_while_importing
    from distributed.launch.run import LAUNCHERS, prepare, start

    refuse_while_importing("troupe.train()")
    if launcher not in LAUNCHERS:  # before the run folder is made
        raise UserError(f"unknown launcher '{launcher}'; launchers are {', '.join(LAUNCHERS)}")
    overrides = string_list("overrides", overrides) + [f"{k}={v!r}" for k, v in settings.items()]
    if algo is not None:
        if resume is not None:
            raise UserError("algo sets an algorithm up on an environment; a resumed run "
                            "keeps its own: drop algo")  # fmt: skip
        experiment, overrides = on_environment(experiment, algo, overrides)
    _check_metrics_port(metrics_port)
    if image is not None:
        from distributed.images.pinning import image_reference

        try:
            image_reference(image)
        except argparse.ArgumentTypeError as e:
            raise UserError(f"image: {e}") from None
    if resume is not None and (experiment is not None or run_dir is not None):
        raise UserError("resume continues a run folder with its own experiment: pass either "
                        "resume=RUN_DIR or an experiment (and run_dir), not both")  # fmt: skip
    try:
        config, folder = prepare(
            experiment, overrides, None if run_dir is None else str(run_dir),
            None if resume is None else str(resume), imports=string_list("imports", imports),
        )  # fmt: skip
    except ConfigError as e:
        raise _with_keyword_hints(e, settings) from None
    result = RunResult(folder)
    from system.run import folder_lock

    try:
        result._process = start(
            config, folder, launcher=launcher, image=image, display=display, secure=secure,
            metrics_port=metrics_port,
        )  # fmt: skip
    except BaseException:
        folder_lock.release(folder)
        raise
    folder_lock.held_by_run(folder, result._process.is_alive)
    if not background:
        return result.wait()
    atexit.register(_wait_at_exit, result)
    return result


def _with_keyword_hints(error: ConfigError, settings: dict[str, Any]) -> ConfigError:
    """``error`` with train()'s own keyword named where a setting misspells it:
    ``train(..., runs_dir="/tmp/runs")`` was read as a config key, and only suggested
    ``environment.args.runs_dir``."""
    own = [p for p in inspect.signature(train).parameters if p not in ("experiment", "settings")]
    lines = []
    for line in error.errors:
        key = line.partition(":")[0]
        close = difflib.get_close_matches(key, own, n=1, cutoff=0.75) if key in settings else []
        lines.append(f"{line}; did you mean train()'s own {close[0]}=?" if close else line)
    return ConfigError(lines)


def _wait_at_exit(result: RunResult) -> None:
    """A script that ends while its background run trains waits for the run, as Python waits
    for any child process: it waited for minutes without a word, as if hung. It says so now,
    and a Ctrl+C then stops the run in order, as ``stop()`` would, without a traceback."""
    if not result.running:
        return
    print(
        f"troupe: the background run in {result.run_dir} is still training; waiting for it to "
        "end (Ctrl+C stops it in order; call run.wait() or run.stop() to end a script sooner)",
        file=sys.stderr,
        flush=True,
    )
    try:
        result.wait()
    except KeyboardInterrupt:  # the run's controller got it too (one process group)
        result.wait()


def _check_metrics_port(port: Any) -> None:
    """A bad port, or one taken, is refused before the run folder is made, by
    ``--metrics-port``'s checks (text such as ``"9100"`` too: from Python, a port is a
    number)."""
    from system.run.prometheus import port_number, refuse_taken

    if port is not None:
        port_number(port, "metrics_port", text=False)
    refuse_taken(port)  # or TROUPE_METRICS_PORT's


def evaluate(
    target: str | Path,
    episodes: int = 20,
    envs: int = 8,
    seed: int | None = None,
    imports: Sequence[str] = (),
):
    """Greedy episodes with a run's (or a checkpoint's) parameters: ``troupe eval``. ``seed``:
    of the episodes (default: the run's, so an evaluation replays exactly). ``imports``: as
    :func:`load_policy`'s."""
    from system.run.evaluation import evaluate as run_evaluation

    user_code.import_given(imports)
    return run_evaluation(target, episodes=episodes, envs=envs, seed=seed)


class LoadedPolicy:
    """One trained policy, acting on one observation at a time."""

    def __init__(
        self,
        policy: Policy,
        config: ExperimentConfig,
        name: str,
        version: int,
        curriculum_stage: Any = None,
    ):
        self.policy = policy
        self.config = config
        """The experiment it was trained in."""
        self.name = name
        self.version = version
        self.curriculum_stage = curriculum_stage
        """What its run's environments were last told (``set_curriculum_stage``), or None."""
        from system.workers.lanes import observation_spec

        space = getattr(policy, "observation_space", None)
        self._obs_spec = None if space is None else observation_spec(space)
        action_space = getattr(policy, "action_space", None)
        self._bounds = None if action_space is None else action_bounds([action_space])
        """A Box action's bounds: ``act`` clips into them, as actors do for the environment."""

    def __repr__(self) -> str:  # what a notebook shows of ``troupe.load_policy(...)``
        return (
            f"LoadedPolicy({self.name!r}, version {self.version}, of experiment "
            f"{self.config.name!r} on {self.config.environment.type!r})"
        )

    def act(self, obs: Any, state: Any = None, greedy: bool = True) -> tuple[Any, Any]:
        """``(action, state)`` for one observation (an array, or a dict for Dict spaces).

        ``state``: what the previous call returned, None at an episode's start (a memoryless
        policy always returns None). ``greedy``: the policy's most likely action, as evaluation
        plays; False samples, as training actors do.
        """
        start = state is None
        if start:
            state = self.policy.default_policy_state
        # a gymnasium Tuple's raw tuple, as the run's environments presented it: a dict
        obs = from_positions(obs, getattr(self.policy, "observation_space", None))
        self._check(obs)
        request = RolloutRequest(
            obs=_one_row(obs),
            policy_state=state,
            is_evaluation=np.full((1, 1), greedy),
            on_reset=np.full((1, 1), start),
            client_id=np.zeros((1, 1), dtype=np.int64),
            request_id=np.zeros((1, 1), dtype=np.int64),
        )
        result = self.policy.rollout(request)
        # as the run's actors hand it to the environment: a Gaussian's mean or sample may lie
        # past the Box (2.2 in Pendulum's [-2, 2]), which an environment of one's own may refuse
        (action,) = fit_actions([np.asarray(result.action)[0]], self._bounds)
        return action, result.policy_state

    def _check(self, obs: Any) -> None:
        """An observation the policy cannot take is named: a raw Atari frame given to a
        policy of preprocessed ones ended in torch's "expected input[1, 210, 160, 3] to have 4
        channels, but got 210 channels instead", deep in the network."""
        from system.workers.lanes import misfit

        problem = misfit(obs, self._obs_spec)
        if problem is not None:
            raise UserError(
                f"policy '{self.name}' cannot take this observation: {problem} (its space: "
                f"{self.policy.observation_space}). It takes observations as its run's "
                "environments give them: make_env() makes one"
            )

    def make_env(self, evaluation: bool = False, **kwargs: Any):
        """An environment of the run (``kwargs`` override its arguments, e.g.
        ``render_mode="rgb_array"`` for a gymnasium one); ``evaluation``: as the run's greedy
        evaluation made it (``evaluation.env_args``: Atari's whole games at their score)."""
        from api import environment

        comp = self.config.environment
        extra = self.config.evaluation.env_args if evaluation else {}
        env = environment.make(comp.type, **{**comp.args, **extra, **kwargs})
        if self.curriculum_stage is not None:  # the stage its run reached, not stage 0
            env.set_curriculum_stage(self.curriculum_stage)
        return env


def load_policy(
    target: str | Path, policy: str | None = None, imports: Sequence[str] = ()
) -> LoadedPolicy:
    """A trained policy from a run folder (the version its run was solved with, else its
    latest) or a checkpoint file.

    ``imports``: your own files or modules, imported first (``--import``); a file the run
    recorded that is no longer there is found as the one of its name given here.

    ``policy``: which policy of a multi-policy run (default: a checkpoint file's own, else the
    one ``troupe eval`` reports: a PBT run's best member, ``evaluation.policy``; else the first
    trained one). One without a trainer (scripted: ``random-legal``) plays as it is built, as
    in the run; a self-play opponent has no parameters of its own, and is refused.
    """
    from system.parameters.store import LATEST
    from system.run import builders
    from system.run.evaluation import curriculum_stage, load_run, locate, played_policy

    user_code.import_given(imports)
    run_dir, pinned = locate(target)
    config, store = load_run(run_dir)
    from_file = Path(target).parent.name if Path(target).is_file() else None  # latest.ckpt too
    name = policy or from_file or played_policy(run_dir, config, pinned)
    if name not in config.policies:
        raise UserError(f"run {run_dir} has no policy '{name}'; it has {sorted(config.policies)}")
    if name == config.selfplay.opponent:
        raise UserError(
            f"policy '{name}' of run {run_dir} has no parameters of its own: it plays past "
            f"versions of '{config.selfplay.learner}' (self-play); load that one"
        )
    built = builders.make_policy(config, name, builders.probe_spaces(config), config.seed)
    if name in builders.trained_policies(config):
        number, params = store.get(name, pinned.get(name, LATEST))
        built.load_checkpoint(params)
    else:  # scripted: it plays as it is built, nothing was saved of it
        number = int(built.get_checkpoint().get("version", 0))
    if hasattr(built, "eval_mode"):
        built.eval_mode()
    stage = curriculum_stage(run_dir, config)
    return LoadedPolicy(built, config, name, number, stage["stage"] if stage else None)


def _one_row(obs: Any) -> np.ndarray | NamedArray:
    """One observation as a batch of one: a dict (a Dict in it too) as a NamedArray."""
    if isinstance(obs, dict):
        return NamedArray.from_dict(obs).apply(_one_row)
    return np.asarray(obs)[None]
