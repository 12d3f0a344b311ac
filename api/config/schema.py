"""The experiment's schema: a tree of documented dataclasses, and how one is read from a mapping.

An experiment says which environment, which policies (each with its trainer), how agents map to
policies, how many actor / policy / trainer workers, and when to stop. Each field's docstring is
what ``troupe show-config`` prints (:mod:`api.config.docs`).

Reading a mapping (:meth:`ExperimentConfig.from_dict`, :func:`from_mapping`) checks the shape
only: unknown keys (with the closest real one, of this section or another), wrong types, modes
outside their ``Literal``. Whether the values make a runnable experiment is
:mod:`api.config.checks`'s question.

Longer than 400 lines because every field of an experiment is a documented dataclass field here,
beside the one reader that the field types drive; the checks and the overrides are modules of
their own.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from api.code import CodeConfig
from api.config.arguments import suggest_key, takes_any_keyword
from api.config.league import CurriculumConfig, PBTConfig, SelfPlayConfig
from api.errors import ConfigError


@dataclass
class ComponentConfig:
    """A registered component and the keyword arguments to build it with."""

    type: str = ""
    """Registered name (``troupe list`` shows them all), e.g. ``CartPole-v1`` or ``ppo``."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments; checked against the component's signature before launch."""


@dataclass
class ReplayConfig:
    """The replay buffer worker of an off-policy policy (its trainer says ``needs_replay``)."""

    capacity_frames: int = 100_000
    """Frames the buffer keeps; the oldest segments are overwritten first."""
    batch_size: int = 128
    """Transitions in each batch the buffer hands the trainer."""
    batches_per_message: int = 1
    """Batches the replay worker samples at once and sends in one message; the trainer trains
    on them one step at a time, and their priorities go back together. Each message and each
    sample has a fixed cost that several batches share; the priorities then reach the buffer up
    to that many steps later."""
    n_step: int = 1
    """Rewards summed per transition before bootstrapping (fewer at an episode end)."""
    gamma: float = 0.99
    """Discount of the n-step sum; the trainer's target uses it (``discount = gamma ** k``)."""
    prioritized: bool = False
    """Prioritised replay (sum tree, priorities from the trainer's TD errors); else uniform."""
    alpha: float = 0.6
    """Priority exponent of prioritised replay: 0 is uniform, 1 fully proportional."""
    beta: float = 0.4
    """Importance-sampling exponent of prioritised replay (1 undoes its bias fully)."""
    min_size: int = 1000
    """Frames in the buffer before the trainer gets its first batch."""
    samples_per_insert: float | None = None
    """Sampled transitions per inserted frame the buffer allows (None: no limit). When the
    trainer is ahead its requests wait; when the actors are, the buffer stops taking segments
    and the sample stream holds the actors back."""
    tolerance: float | None = None
    """Slack of the samples-per-insert ratio, in sampled transitions (None: enough for one
    message of batches and one chunk of segments, so neither side can wait forever)."""
    save_every_s: float | None = 60.0
    """Seconds between saves of the buffer to ``checkpoints/<policy>/replay.ckpt`` in the run
    folder (it is also saved when the run stops), so a replay worker restarted after a crash, or
    a run resumed with ``troupe run --resume``, starts from it rather than empty; None: saved only
    when the run stops. A save rewrites the whole buffer and holds up the replay worker meanwhile
    (measured: cartpole-dqn's 50k frames, 3 MiB, about 6 ms; 1M frames of 17 floats, 125 MiB,
    about 0.2 s), so saves are also spaced to at least 50 times the last one's duration."""

    @property
    def message_rows(self) -> int:
        """Transitions in one reply of the replay worker: ``batches_per_message`` batches."""
        return self.batch_size * self.batches_per_message


@dataclass
class PolicyConfig:
    """One policy of the experiment and the trainer that improves it."""

    policy: ComponentConfig = field(default_factory=ComponentConfig)
    """The registered policy and its arguments."""
    trainer: ComponentConfig = field(default_factory=ComponentConfig)
    """The registered trainer and its arguments (``type`` empty: a frozen policy, not trained)."""
    checkpoint: str = ""
    """A frozen policy's weights: a checkpoint file of any run
    (``runs/<run>/checkpoints/<policy>/v*.ckpt``) its policy workers load at start; empty: as
    built (or, for a self-play opponent, the learner's snapshots)."""
    policy_workers: int = 1
    """Policy worker processes serving this policy's inference."""
    trainer_workers: int = 1
    """Trainer worker processes; several train as one data-parallel group, each on its own
    ``batch_segments`` a step (``system/workers/trainer_group.py``). Serial mode trains with one."""
    batch_segments: int = 16
    """Trajectory segments per trainer step."""
    trainer_threads: int = 1
    """Threads each trainer process's torch runs its operations on (intra-op). More pays only
    for a large network on a CPU learner with idle cores (Pong's CNN on 2 cores: 18% more
    frames with 2, BENCHMARKS.md), and costs a small one dearly (CartPole's MLP: half the
    frames with 2)."""
    load_ahead: bool = True
    """A trainer receives, decodes and cuts its next batch in a thread of its own while the
    current one trains, and puts it on the trainer's device there (one trainer worker learning
    from segments, in separate processes):
    the trainer then waits for samples only when the actors are behind. At most one batch
    more waits for it (samples one trainer step older). False: all in turn, in one thread."""
    publish_every: int = 1
    """Publish a new version every this many trainer steps (checkpointed versions always).
    An off-policy trainer takes many small steps (one per few frames): publishing each one made
    the parameter service and the policy workers' reloads half of its time, while actors gain
    nothing from weights a few milliseconds newer."""
    max_policy_lag: int | None = None
    """Drop segments whose oldest step is more than this many versions behind the trainer
    (counted as ``stale_segments_dropped``, with a warning naming the fix); None keeps all."""
    warn_policy_lag: int | None = 16
    """Warn (at most every 30 s, samples kept) when a batch's oldest step is more than this many
    versions behind the trainer: the trainer cannot keep up with the actors, and on-policy
    learning slows from about this lag on (``BENCHMARKS.md``: PPO needs 2.4 times the frames at
    32). Off-policy trainers, which learn from a replay buffer, are never warned. None: silent."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """The replay buffer between actors and trainer; used only when the trainer declares
    ``needs_replay`` (DQN, SAC), ignored otherwise."""


@dataclass
class ActorConfig:
    """A group of actor workers stepping copies of the environment."""

    workers: int = 2
    """Actor worker processes; the override ``actors.workers=auto`` sizes them from the cores
    of the launching machine (:func:`auto_actor_workers`)."""
    envs_per_worker: int = 8
    """Environments per process, split into ``groups``."""
    segment_length: int = 64
    """Steps per trajectory segment sent to the trainer (plus one bootstrap step)."""
    groups: int = 2
    """Environment groups per process, each asking for its actions in one request. 2 or more:
    a group steps while another waits for its answer. 1: a single request for all environments,
    the fewest messages (each costs CPU on both ends), but the process idles during inference.
    Above ``envs_per_worker``, each group is one environment (the default of 2 stays valid for
    a worker of one environment); evaluation actors use one group."""
    on_env_error: Literal["raise", "reset"] = "raise"
    """``raise``: an env exception, a ``reset``/``step`` that returns no list of one StepResult
    (or None) per agent, or an observation that does not fit its observation space (shape,
    dtype kind, a Dict's keys) fails the worker naming the environment; ``reset``: log it,
    rebuild and reset that env (counted in the metrics' ``worker_health/env_resets``)."""
    on_nonfinite: Literal["fail", "drop_episode"] = "fail"
    """A NaN or infinite observation or reward from an environment, or action from a policy:
    ``fail`` stops the worker with an error naming the environment, agent and step;
    ``drop_episode`` discards the episode's unsent steps, resets that environment and counts it
    (the metrics' ``worker_health/dropped_episodes``)."""
    make_threads: int = 8
    """How many environments an actor (or evaluation actor) makes at once when its first took a
    second or more to make (a simulator that starts a process or loads assets); a quicker one
    makes them one after another. 1: always one after another, for environments that must not
    be made from several threads."""


@dataclass
class EvaluationConfig:
    """Evaluation actors: greedy actions, never trained on."""

    workers: int = 1
    """Evaluation actor processes (0: no evaluation)."""
    envs_per_worker: int = 4
    """Environments per evaluation process."""
    episodes: int = 20
    """Episodes averaged into one evaluation return."""
    max_fps: float | None = None
    """Cap on each evaluation process's environment frames per second (None: as fast as it
    can). Evaluation competes with training for the same CPUs; a cap keeps it a small share."""
    policy_mapping: ComponentConfig = field(default_factory=ComponentConfig)
    """The policy mapping of evaluation actors (e.g. the learner against scripted opponents);
    empty type: the same as training actors."""
    policy: str = ""
    """The policy whose return is the evaluation return (stop rule, display, callbacks) and the
    training return (``episode_return``); empty: the mean over every agent, which says little
    in a zero-sum game."""
    env_args: dict[str, Any] = field(default_factory=dict)
    """Arguments of the evaluation actors' environments over ``environment.args``: evaluation
    judges the task as it is scored where training shapes it (Atari: ``{episodic_life: False,
    clip_rewards: False}``, whole games at their score, where training plays lives with clipped
    rewards). ``troupe eval`` plays them too."""


@dataclass
class StopConfig:
    """When the run ends: the first rule met wins. At least one must be set."""

    eval_return: float | None = None
    """Stop once the greedy evaluation mean return reaches this (confirmed, see below)."""
    confirm_windows: int = 2
    """How many evaluation windows (``evaluation.episodes`` fresh greedy episodes each, none
    shared) must each reach ``eval_return`` before the run stops as solved. One window of a few
    episodes reaches a target by luck now and then; 1 stops on the first. After the first, the
    policy workers of the judged policy (``evaluation.policy``, else the only trained one) hold
    the version they have for evaluation, and the further windows count only episodes that
    version played whole: it is the run's ``solved_version``, what ``troupe eval`` plays."""
    max_return: float | None = None
    """The most one episode can return (1.0 for a won game, 500 for CartPole-v1), if known.
    A held version's window then ends as soon as it can no longer reach ``eval_return`` even if
    every episode left in it returned this much, and the next version is held: a version that
    lost early is not played to the end of its window. None: every window is played out."""
    env_frames: int | None = None
    """Stop after this many environment steps (summed over actors, evaluation excluded)."""
    trainer_steps: int | None = None
    """Stop after this many trainer steps of every policy."""
    wall_seconds: float | None = None
    """Stop after this many seconds."""
    stall_seconds: float | None = 900.0
    """Fail the run (exit 1) after this many seconds in which, with every worker up, neither a
    training frame was stepped nor a trainer step taken: its workers are waiting for one
    another (``system/run/stall_watch.py``). A warning comes after 120 s. None: never fail for
    it. Not a stopping rule: a run that stalls has failed."""
    eval_return_source: str = ""
    """Where ``eval_return`` came from when an experiment chose it (the ``ppo`` experiment:
    gymnasium's ``reward_threshold``, or Troupe's default for an id that declares none); printed
    when a run starts and kept in config.json. Nothing in the run reads it."""

    @property
    def target_source(self) -> str:
        """``eval_return_source`` where it still fits ``eval_return``: an experiment file's
        function that set ``eval_return = None`` over a recipe's target started with "no
        evaluation target (Troupe's default for Pendulum-v1, ...)"; a source that describes
        a target is not said of none, nor one that describes none of a target."""
        source = self.eval_return_source
        if source.startswith("given:") or source.startswith("none") == (self.eval_return is None):
            return source
        return ""


@dataclass
class LivenessConfig:
    """How long one ``poll`` of a worker may run before the worker counts as hung.

    A worker's loop heartbeats between polls; while one poll runs long, a thread of the worker
    heartbeats instead (``system.run.busy_heartbeat.BusyHeartbeat``), up to this bound. Past it
    the heartbeats stop, and with them the touches of the file a Kubernetes liveness probe
    reads: the controller restarts the worker after its heartbeat timeout, or the kubelet after
    ``--probe-stale-seconds`` (``distributed/DEPLOY.md``)."""

    max_poll_s: float = 60.0
    """Actors, policy workers, replay workers and the parameter service: one poll steps a
    group of environments, answers one batch or one request, so a poll this long is a hung
    environment or a deadlock. Raise it for environments whose step or reset takes minutes."""
    max_trainer_poll_s: float = 600.0
    """Trainers: one poll is one training step, which for a large network on a loaded CPU (or
    a data-parallel group waiting for its slowest rank) takes minutes."""
    max_build_s: float = 900.0
    """Every worker, once configured: building what it runs (an actor its environments, one
    after the other) before it is ready. A simulator that starts a process or compiles a scene
    as it is made takes minutes; a thread of the worker heartbeats meanwhile, up to this bound."""

    def bound(self, role: str) -> tuple[str, float]:
        """The setting that bounds one poll of ``role`` (a ``system.roles.Role`` value) and
        its value in seconds."""
        if role == "trainer":
            return "liveness.max_trainer_poll_s", self.max_trainer_poll_s
        return "liveness.max_poll_s", self.max_poll_s


@dataclass
class CheckpointConfig:
    """When versions are written to the run folder as numbered checkpoints, and how many stay.

    The newest version is always kept (``latest.ckpt``, and the final checkpoint), as is any
    version a tag names (the one evaluation confirmed, what ``troupe eval`` plays)."""

    every: int = 50
    """Write a numbered checkpoint every this many published versions (and always at the end)."""
    every_seconds: float | None = 120.0
    """Also write one once this many seconds have passed since the last: a trainer with slow
    steps otherwise goes minutes between checkpoints, all lost to a run killed at once (a
    preempted job). None: by count alone."""
    keep_last: int = 5
    """Numbered checkpoints kept, newest first; older ones are removed as new ones come, so a
    long run's folder stays bounded. 0 keeps every one."""
    keep_every: int = 0
    """Also keep every version that is a multiple of this (a learning history to evaluate
    later, e.g. 1000); 0: none beyond ``keep_last``."""


@dataclass
class MetricsConfig:
    """What of the controller's record a second goes to ``metrics.jsonl`` and TensorBoard.

    The live panel, the Prometheus endpoint and the stop rules see every record; on disk a long
    run keeps fewer as it ages, as a record a second is some 100-350 MB a day of JSON and as much
    of TensorBoard events. Leaving records out samples the curves and loses no frame or episode:
    a record holds means of the last episodes and counters, which the next written one carries
    on, and a written record's stage times are over the time since the one before it; the last
    second's record is in ``latest.json`` whatever is written. Always written: a run's first
    record, each change of the evaluation result, the record that met the stop rule and the
    last; the summary's best training return is of every record, written or not
    (``system/run/thinning.py``)."""

    thin: list[list[float]] = field(default_factory=lambda: [[3600.0, 10.0], [86400.0, 60.0]])
    """``[after_s, every_s]`` steps: from ``after_s`` seconds of a run (counted across resumes)
    one record every ``every_s`` seconds is written. The default: every record for the first
    hour, one in 10 s to a day, then one a minute. ``[]`` writes every record."""


RENAMED_KEYS = {"checkpoint_every": "checkpoint.every"}
"""Keys of older configs (and their run folders' ``config.json``) and where they live now."""


@dataclass
class ExperimentConfig:
    """A whole experiment."""

    name: str = ""
    """The experiment's name (used for the run folder)."""
    environment: ComponentConfig = field(default_factory=ComponentConfig)
    """The registered environment and its arguments."""
    policies: dict[str, PolicyConfig] = field(default_factory=dict)
    """Policies by name, e.g. ``{"default": PolicyConfig(...)}``."""
    agent_policies: list[str] = field(default_factory=list)
    """The policy name of each agent, by agent index; empty: every agent uses the only policy."""
    policy_mapping: ComponentConfig = field(default_factory=ComponentConfig)
    """A registered policy mapping (``api.policy_mapping``, ``troupe list``): which policy plays
    each agent, chosen afresh at every episode's start (self-play, rotating seats); empty type:
    ``agent_policies``. Mapped policies share one network shape, so every agent's spaces must
    be the same."""
    actors: ActorConfig = field(default_factory=ActorConfig)
    """Training actor workers."""
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    """Evaluation actor workers."""
    stop: StopConfig = field(default_factory=StopConfig)
    """Stopping rules."""
    seed: int = 0
    """Base seed; each worker and environment derives its own from it."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Numbered checkpoints: how often, and how many are kept."""
    code: CodeConfig = field(default_factory=CodeConfig)
    """The user's own modules and registrations, loaded by every process of the run."""
    actor_callbacks: list[ComponentConfig] = field(default_factory=list)
    """Registered callbacks run inside every actor (``api.episode``): ``on_episode_start``,
    ``on_episode_step`` (before a step is recorded: reward shaping) and ``on_episode_end``,
    each given the :class:`~api.episode.Episode`, and ``on_segment`` on each batch of finished
    segments before it is sent (fields of its own declared in ``segment_fields``);
    ``episode.log(name, value)`` reports a number as ``custom/<name>``."""
    trainer_callbacks: list[ComponentConfig] = field(default_factory=list)
    """Registered callbacks run inside every trainer (``api.train_result``):
    ``on_train_result(result)`` after each step, with the policy, the trainer and the batch;
    ``result.log(name, value)`` reports a number as ``policy/<policy>/custom/<name>``."""
    callbacks: list[ComponentConfig] = field(default_factory=list)
    """Registered callbacks (``register_callback``) the controller calls: ``on_episode_end``,
    ``on_train_result`` and ``on_evaluation``; see ``system.run.episodes``."""
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    """A curriculum driven by a metric (``api.config.league``); off by default."""
    pbt: PBTConfig = field(default_factory=PBTConfig)
    """Population-based training over several policies (``api.config.league``); off by
    default."""
    selfplay: SelfPlayConfig = field(default_factory=SelfPlayConfig)
    """A frozen opponent that plays past versions of a learner (``api.config.league``); off by
    default."""
    liveness: LivenessConfig = field(default_factory=LivenessConfig)
    """When a worker whose poll does not return counts as hung and is restarted."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """How much of a long run's metrics is written to its folder."""
    roles: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Workers of roles defined outside Troupe: role name -> its arguments, which the role's
    plan reads (``WorkerPlan.plans_for`` in ``system/run/plan.py``). The module that defines the
    role goes in ``code.imports``."""

    def policy_of_agent(self, agent: int) -> str:
        """The policy of ``agent`` without a policy mapping (one with it: any of them)."""
        if self.agent_policies:
            return self.agent_policies[agent]
        return next(iter(self.policies))

    def agent_of_policy(self, name: str) -> int:
        """The first agent ``name`` plays, whose spaces its network is built for (agent 0 for a
        PBT member: it plays every agent of its own actors)."""
        if name in self.pbt.members or self.policy_mapping.type:
            return 0
        return next(
            a for a in range(max(len(self.agent_policies), 1)) if self.policy_of_agent(a) == name
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], errors: list[str] | None = None) -> ExperimentConfig:
        """Build, checking keys and types; raises ConfigError listing every problem. With an
        ``errors`` list, appends them there instead and returns the config, whatever it could
        not read at its default (so that the caller can add what else is wrong with it)."""
        found: list[str] = [] if errors is None else errors
        config = from_mapping(cls, _renamed(data), "", found)
        if found and errors is None:
            raise ConfigError(found)
        return config


# --------------------------------------------------------------------- building from dicts
def _renamed(data: Any) -> Any:
    """``data`` with keys of :data:`RENAMED_KEYS` moved to their new place (a config written
    before the move still loads; one that gives both is left for the unknown-key error)."""
    if not isinstance(data, dict) or not any(old in data for old in RENAMED_KEYS):
        return data
    data = dict(data)
    for old, new in RENAMED_KEYS.items():
        if old not in data:
            continue
        section, key = new.split(".")
        inner = dict(data.get(section) or {})
        if key in inner:
            continue
        inner[key] = data.pop(old)
        data[section] = inner
    return data


def from_mapping(cls: type, data: Any, path: str, errors: list[str]) -> Any:
    """An instance of the config dataclass ``cls`` from a mapping, its problems appended to
    ``errors`` (each naming its key under ``path``); what it cannot read keeps its default."""
    if not isinstance(data, dict):
        errors.append(f"{path or 'config'}: expected a mapping for {cls.__name__}, got {data!r}")
        return cls()
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            errors.append(_unknown_key(path, key, names))
            if not path or path.count(".") < 2:  # also look in the other sections
                errors[-1] += _elsewhere(data, path, key)
    kwargs = {}
    for name in names:
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], _join(path, name), errors)
    return cls(**kwargs)


def _convert(hint: Any, value: Any, path: str, errors: list[str]) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return from_mapping(hint, value, path, errors)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if type(None) in args and _null_as_text(value) and str not in inner:
            errors.append(_NULL_AS_TEXT.format(path=path, value=value))
            return None
        return _convert(inner[0], value, path, errors)
    if origin is dict:
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a mapping, got {value!r}{_as_text(value)}")
            return {}
        return {k: _convert(args[1], v, _join(path, k), errors) for k, v in value.items()}
    if origin is list:
        if not isinstance(value, (list, tuple)):
            errors.append(f"{path}: expected a list, got {value!r}{_as_text(value)}")
            return []
        return [_convert(args[0], v, f"{path}[{i}]", errors) for i, v in enumerate(value)]
    if hint is Any:
        return value
    if origin is typing.Literal:  # a mode: one of a few names, which show-config lists
        if value not in args:
            errors.append(f"{path}: must be {_choices(args)}, got {value!r}")
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, float) and value.is_integer():
        return int(value)  # stop.env_frames=1e6, as budgets are written: a whole number
    if (isinstance(hint, type) and not isinstance(value, hint)) or (
        hint is int and isinstance(value, bool)
    ):
        errors.append(f"{path}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return value


_NULL_AS_TEXT = (
    "{path}: got the text {value!r}, which is no null in a file: YAML and JSON write null; TOML "
    "has none, so leave the key out of the file and unset it on the command line "
    "(`{path}=None`), or write the file as YAML"
)
"""A TOML file that unsets a recipe's key (``stop.eval_return``) can only write it as text; it
read ``expected float, got str 'None'``, which names no way out."""


def _null_as_text(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() in ("none", "null")


def _as_text(value: Any) -> str:
    """Why a list or mapping came as text: ``pbt.members=[a,b]`` is no Python literal."""
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        return (
            " (read as text: it is no Python literal; quote the strings in it, e.g. "
            "['a', 'b'], and the whole key=value for the shell)"
        )
    return ""


def _choices(names: tuple) -> str:
    """``'a' or 'b'``, or ``one of 'a', 'b', 'c'``."""
    if len(names) == 2:
        return f"{names[0]!r} or {names[1]!r}"
    return "one of " + ", ".join(repr(n) for n in names)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _elsewhere(data: dict, path: str, key: str) -> str:
    """A hint at a real key of another section for an unknown top-level or section key."""
    if path or not isinstance(data.get("policies"), dict):
        return ""
    try:
        config = ExperimentConfig.from_dict({k: v for k, v in data.items() if k != key})
    except ConfigError:
        return ""
    close = suggest_key(config, key, n=1)
    if close:
        return f" (or {close[0]}?)"
    env = config.environment.type
    if env and takes_any_keyword("environment", env):  # a gymnasium id's gym.make keywords
        return f" (an argument of environment '{env}'? give it as environment.args.{key}=...)"
    return ""


def _unknown_key(path: str, key: str, names: list[str]) -> str:
    close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(names)}"
    return f"{_join(path, str(key))}: unknown key{hint}"
