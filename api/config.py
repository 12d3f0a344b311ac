"""Typed experiment configuration, validated as a whole before any process starts.

An experiment is a tree of dataclasses: which environment, which policies (each with its trainer),
how agents map to policies, how many actor / policy / trainer workers, and when to stop.
``validate`` walks the whole tree and returns every problem it finds (unknown keys, bad values,
unknown registered names, keyword arguments the component does not take), so a user fixes them in
one go instead of one per launch.

Experiments are registered by name (``register_experiment``); their entry point is a function
that returns an :class:`ExperimentConfig`. ``troupe run NAME key=value ...`` applies dotted
overrides with :func:`apply_overrides`.

Longer than 400 lines because every field of an experiment is a documented dataclass field here
(``troupe show-config`` prints these docstrings), beside the one validation pass over them; the
argument checks and user code already live in their own modules.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from api.code import CodeConfig, attach_user_code, load_code
from api.config_check import check_arguments, check_ranges, suggest_key
from api.config_league import CurriculumConfig, PBTConfig, SelfPlayConfig, check_league
from api.errors import ConfigError, RegistryError
from api.registry import REGISTRIES, experiments
from api.signatures import UNKNOWN, static_class_attribute


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
    """Seconds between saves of the buffer to ``checkpoints/<policy>/replay.npz`` in the run
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
    current one trains (one trainer worker learning from segments, in separate processes):
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
    the fewest messages (each costs CPU on both ends), but the process idles during inference."""
    on_env_error: Literal["raise", "reset"] = "raise"
    """``raise``: an env exception fails the worker; ``reset``: log it and reset that env."""
    on_nonfinite: Literal["fail", "drop_episode"] = "fail"
    """A NaN or infinite observation or reward from an environment, or action from a policy:
    ``fail`` stops the worker with an error naming the environment, agent and step;
    ``drop_episode`` discards the episode's unsent steps, resets that environment and counts it
    (``nonfinite_episodes`` in the actor's stats)."""


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
    """The policy whose return is the evaluation return (stop rule, display, callbacks); empty:
    the mean over every agent, which says little in a zero-sum game."""


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
    eval_return_source: str = ""
    """Where ``eval_return`` came from when an experiment chose it (the ``ppo`` experiment:
    gymnasium's ``reward_threshold``, or Troupe's default for an id that declares none); printed
    when a run starts and kept in config.json. Nothing in the run reads it."""


@dataclass
class LivenessConfig:
    """How long one ``poll`` of a worker may run before the worker counts as hung.

    A worker's loop heartbeats between polls; while one poll runs long, a thread of the worker
    heartbeats instead (``system.run.control_channel.BusyHeartbeat``), up to this bound. Past it
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
    keep_last: int = 5
    """Numbered checkpoints kept, newest first; older ones are removed as new ones come, so a
    long run's folder stays bounded. 0 keeps every one."""
    keep_every: int = 0
    """Also keep every version that is a multiple of this (a learning history to evaluate
    later, e.g. 1000); 0: none beyond ``keep_last``."""


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
    """A curriculum driven by a metric (``api.config_league``); off by default."""
    pbt: PBTConfig = field(default_factory=PBTConfig)
    """Population-based training over several policies (``api.config_league``); off by
    default."""
    selfplay: SelfPlayConfig = field(default_factory=SelfPlayConfig)
    """A frozen opponent that plays past versions of a learner (``api.config_league``); off by
    default."""
    liveness: LivenessConfig = field(default_factory=LivenessConfig)
    """When a worker whose poll does not return counts as hung and is restarted."""
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
    def from_dict(cls, data: dict[str, Any]) -> ExperimentConfig:
        """Build and validate; raises ConfigError listing every problem."""
        errors: list[str] = []
        config = _build(cls, _renamed(data), "", errors)
        if errors:
            raise ConfigError(errors)
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


def _build(cls: type, data: Any, path: str, errors: list[str]) -> Any:
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
        return _build(hint, value, path, errors)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, path, errors)
    if origin is dict:
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a mapping, got {value!r}")
            return {}
        return {k: _convert(args[1], v, _join(path, k), errors) for k, v in value.items()}
    if origin is list:
        if not isinstance(value, (list, tuple)):
            errors.append(f"{path}: expected a list, got {value!r}")
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
    if (isinstance(hint, type) and not isinstance(value, hint)) or (
        hint is int and isinstance(value, bool)
    ):
        errors.append(f"{path}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return value


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
    return f" (or {close[0]}?)" if close else ""


def _unknown_key(path: str, key: str, names: list[str]) -> str:
    close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(names)}"
    return f"{_join(path, str(key))}: unknown key{hint}"


# --------------------------------------------------------------------- validation
def validate(config: ExperimentConfig) -> list[str]:
    """Every problem with ``config``, as messages naming the key; empty when it is fine."""
    errors: list[str] = []
    errors += _check_types(config)
    if not config.name:
        errors.append("name: must be set")
    errors += _check_component("environment", "environment", config.environment)
    if not config.policies:
        errors.append("policies: at least one policy is needed")
    for pname, pc in config.policies.items():
        errors += _check_component("policy", f"policies.{pname}.policy", pc.policy)
        if pc.trainer.type:
            errors += _check_component(
                "trainer", f"policies.{pname}.trainer", pc.trainer, skip=("policy",)
            )
        for key in ("policy_workers", "trainer_workers", "trainer_threads", "batch_segments",
                    "publish_every"):  # fmt: skip
            if _below(getattr(pc, key), 1):
                errors.append(f"policies.{pname}.{key}: must be at least 1")
        if pc.trainer.type and uses_replay(pc):
            errors += _check_replay(f"policies.{pname}.replay", pc.replay, config.actors)
        if pc.checkpoint:
            errors += _check_checkpoint(f"policies.{pname}", pc)
        for key, off in (("max_policy_lag", "no cap"), ("warn_policy_lag", "no warning")):
            if _below(getattr(pc, key), 1):
                errors.append(f"policies.{pname}.{key}: must be at least 1, or None for {off}")
    for i, callback in enumerate(config.callbacks):
        errors += _check_component("callback", f"callbacks[{i}]", callback)
    for i, callback in enumerate(config.actor_callbacks):
        errors += _check_component("callback", f"actor_callbacks[{i}]", callback)
    for i, callback in enumerate(config.trainer_callbacks):
        errors += _check_component("callback", f"trainer_callbacks[{i}]", callback)
    for i, pname in enumerate(config.agent_policies):
        if pname not in config.policies:
            errors.append(
                f"agent_policies[{i}]: unknown policy '{pname}'; policies are "
                f"{sorted(config.policies)}"
            )
    errors += _check_mappings(config)
    from api.config_parallel import check_data_parallel  # its own module: keeps this one short

    for pname, pc in config.policies.items():
        errors += check_data_parallel(f"policies.{pname}", pc)
    errors += _check_positive(
        config.actors, "actors", ("workers", "envs_per_worker", "segment_length", "groups")
    )
    errors += _check_positive(config.evaluation, "evaluation", ("envs_per_worker", "episodes"))
    if _below(config.evaluation.workers, 0):
        errors.append("evaluation.workers: must be 0 or more")
    if _below(config.evaluation.max_fps, 1e-300):
        errors.append("evaluation.max_fps: must be more than 0, or None for no cap")
    errors += check_ranges(config)
    errors += _check_stop(config)
    errors += check_league(config)
    return errors


def _check_checkpoint(path: str, pc: PolicyConfig) -> list[str]:
    if pc.trainer.type:
        return [
            f"{path}.checkpoint: only a frozen policy (no trainer) starts from a checkpoint; a "
            "trained one continues its own run with `troupe run --resume RUN`"
        ]
    if not os.path.isfile(pc.checkpoint):
        return [f"{path}.checkpoint: no file {pc.checkpoint!r} (a v*.ckpt of a run's checkpoints)"]
    return []


def _check_mappings(config: ExperimentConfig) -> list[str]:
    """Exactly one way to say who plays whom; a mapping is built and asked about a few
    episodes (cheap: its factory is plain Python), so a bad argument shows here."""
    mapped = config.policy_mapping.type
    if mapped and config.agent_policies:
        return ["agent_policies: leave empty with policy_mapping (the mapping decides seats)"]
    if mapped and config.pbt.members:
        return ["policy_mapping: leave empty with pbt (each member plays its own actors)"]
    if (
        not (mapped or config.agent_policies)
        and len(config.policies) > 1
        and not config.pbt.members
    ):
        return [
            "agent_policies: must map every agent to a policy when there are several (or set "
            "policy_mapping)"
        ]
    errors = []
    for path, comp in (
        ("policy_mapping", config.policy_mapping),
        ("evaluation.policy_mapping", config.evaluation.policy_mapping),
    ):
        if comp.type:
            errors += _check_mapping(path, comp, config)
    if config.evaluation.policy and config.evaluation.policy not in config.policies:
        errors.append(
            f"evaluation.policy: unknown policy '{config.evaluation.policy}'; policies are "
            f"{sorted(config.policies)}"
        )
    return errors


def _check_mapping(path: str, comp: ComponentConfig, config: ExperimentConfig) -> list[str]:
    from api.policy_mapping import check_policy_mapping, make_policy_mapping

    errors = _check_component("policy_mapping", path, comp)
    if errors:
        return errors
    try:
        mapping = make_policy_mapping(comp.type, **comp.args)
    except (ConfigError, RegistryError) as e:
        problems = e.errors if isinstance(e, ConfigError) else [str(e)]
        return [f"{path}: {p}" for p in problems]
    agents = int(comp.args.get("agent_count", 2))  # the env's own count is checked at start
    return [f"{path}: {p}" for p in check_policy_mapping(mapping, config.policies, agents)]


def uses_replay(pc: PolicyConfig) -> bool:
    """Whether this policy's trainer learns from a replay buffer (its class says
    ``needs_replay = True``); False for an unknown trainer (validation reports that)."""
    if not pc.trainer.type:
        return False
    try:
        spec = REGISTRIES["trainer"].spec(pc.trainer.type)
        if isinstance(spec.entry_point, str) and not spec.source:
            # read from source when it says so plainly: a config check then imports no torch
            declared = static_class_attribute(spec.entry_point, "needs_replay")
            if declared is not UNKNOWN:
                return bool(declared)
        cls = spec.load()
    except RegistryError:
        return False
    return bool(getattr(cls, "needs_replay", False))


def rate_limited_replay(pc: PolicyConfig) -> bool:
    """Whether this policy learns from a replay buffer whose sampling is tied to its inserts
    (``replay.samples_per_insert`` set): then the limiter, not the trainer's speed, sets how
    many steps a frame buys."""
    return pc.replay.samples_per_insert is not None and uses_replay(pc)


def _check_replay(path: str, rc: ReplayConfig, actors: ActorConfig) -> list[str]:
    errors = [
        f"{path}.{k}: must be at least 1"
        for k in ("capacity_frames", "batch_size", "batches_per_message", "n_step", "min_size")
        if _below(getattr(rc, k), 1)
    ]
    if isinstance(rc.gamma, (int, float)) and not 0.0 <= rc.gamma <= 1.0:
        errors.append(f"{path}.gamma: must be in [0, 1], got {rc.gamma}")
    for key in ("alpha", "beta"):
        if _below(getattr(rc, key), 0):
            errors.append(f"{path}.{key}: must be 0 or more")
    if rc.samples_per_insert is not None and _below(rc.samples_per_insert, 1e-300):
        errors.append(f"{path}.samples_per_insert: must be more than 0, or None for no limit")
    if rc.save_every_s is not None and _below(rc.save_every_s, 1e-300):
        errors.append(f"{path}.save_every_s: must be more than 0, or None to save only at the end")
    if rc.tolerance is not None and _below(rc.tolerance, 1e-300):
        errors.append(f"{path}.tolerance: must be more than 0, or None for the default")
    elif rc.tolerance is not None and rc.samples_per_insert is not None:
        chunk = actors.segment_length * actors.envs_per_worker * rc.samples_per_insert
        message = rc.message_rows
        need = max(message, chunk)
        if rc.tolerance < need:
            errors.append(
                f"{path}.tolerance: {rc.tolerance:g} is less than one message of batches "
                f"({message}) or "
                f"one actor's segments times samples_per_insert ({chunk:g}), so the trainer and "
                f"the actors could wait for each other forever; use at least {need:g}, or None"
            )
    sizes = (rc.min_size, rc.capacity_frames)
    if all(isinstance(v, int) for v in sizes) and rc.min_size > rc.capacity_frames:
        errors.append(
            f"{path}.min_size: {rc.min_size} frames can never be in a buffer of "
            f"capacity_frames={rc.capacity_frames}; lower min_size or raise capacity_frames"
        )
    return errors


def check(config: ExperimentConfig) -> ExperimentConfig:
    """Raise ConfigError listing every problem, or return the config unchanged.

    The run's user code is loaded first: the names it registers are part of what is checked."""
    load_code(config.code)
    errors = validate(config)
    if errors:
        raise ConfigError(errors)
    return config


def _check_types(config: ExperimentConfig) -> list[str]:
    errors: list[str] = []
    try:
        _build(ExperimentConfig, dataclasses.asdict(config), "", errors)
    except TypeError as e:
        errors.append(f"config: {e}")
    return errors


def _check_positive(obj: Any, path: str, keys: tuple[str, ...]) -> list[str]:
    return [f"{path}.{k}: must be at least 1" for k in keys if _below(getattr(obj, k), 1)]


def _below(value: Any, bound: int) -> bool:
    """A number below ``bound``; a value of the wrong type is the type check's to report."""
    return isinstance(value, (int, float)) and value < bound


def _check_stop(config: ExperimentConfig) -> list[str]:
    stop = config.stop
    rules = [stop.eval_return, stop.env_frames, stop.trainer_steps, stop.wall_seconds]
    errors = []
    if all(r is None for r in rules):
        errors.append(
            "stop: set at least one of eval_return, env_frames, trainer_steps, wall_seconds"
        )
    if stop.eval_return is not None and _below(config.evaluation.workers, 1):
        errors.append("stop.eval_return: needs evaluation.workers >= 1")
    if stop.confirm_windows < 1:
        errors.append("stop.confirm_windows: must be at least 1 (1: no confirmation)")
    reachable = stop.max_return is None or stop.eval_return is None
    if not reachable and stop.max_return < stop.eval_return:
        errors.append(
            f"stop.max_return: {stop.max_return} is below stop.eval_return "
            f"({stop.eval_return}): no window could reach it"
        )
    return errors


def _check_component(kind: str, path: str, comp: ComponentConfig, skip=()) -> list[str]:
    if not comp.type:
        return [f"{path}.type: must name a registered {kind}"]
    try:
        spec = REGISTRIES[kind].spec(comp.type)
    except RegistryError as e:
        return [f"{path}.type: {e}"]
    return check_arguments(spec, comp.args, path, skip)


# --------------------------------------------------------------------- overrides
def apply_overrides(config: ExperimentConfig, overrides: list[str]) -> ExperimentConfig:
    """Apply ``key.path=value`` strings; values are Python literals or plain strings.

    Raises ConfigError listing every bad override (unknown keys with the closest real key of
    any section, wrong types) and every error of the result."""
    data = config.to_dict()
    errors = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            errors.append(f"{item}: an override must look like key.path=value")
            continue
        key = RENAMED_KEYS.get(key.strip(), key.strip())
        err = _set_path(data, key.split("."), parse_value(raw.strip()))
        if err:
            hint = "" if "did you mean" in err else _hint(config, key.strip())
            errors.append(f"{key}: {err}{hint}")
    if data.get("actors", {}).get("workers") == AUTO:
        data["actors"]["workers"] = auto_actor_workers(data)
    new = _build(ExperimentConfig, data, "", errors)
    if errors:  # with what the rest of the config gets wrong, so one launch shows them all
        raise ConfigError(errors + [e for e in validate(new) if e not in errors])
    return new


AUTO = "auto"
"""``actors.workers=auto``: as many actor processes as the cores the other roles leave."""


def auto_actor_workers(data: dict[str, Any], cores: int | None = None) -> int:
    """Actor processes for ``actors.workers=auto``: the cores this process may use (those of
    the machine that launches the run: size a cluster run by hand), less one for each policy
    and trainer worker and one for the parameter service, controller and evaluation, at
    least one. On a 16-core machine with one policy and one trainer worker: 13 actors."""
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    others = 1
    for policy in (data.get("policies") or {}).values():
        if isinstance(policy, dict):
            others += int(policy.get("policy_workers") or 0)
            if (policy.get("trainer") or {}).get("type"):
                others += int(policy.get("trainer_workers") or 0)
    return max(1, cores - others)


def _hint(config: ExperimentConfig, key: str) -> str:
    close = suggest_key(config, key)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def _set_path(data: dict, parts: list[str], value: Any) -> str | None:
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        if not isinstance(node, dict) or part not in node:
            names = list(node) if isinstance(node, dict) else []
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            return f"no key '{'.'.join(parts[: i + 1])}'{hint}"
        node = node[part]
    if not isinstance(node, dict):
        return f"'{'.'.join(parts[:-1])}' is not a mapping"
    node[parts[-1]] = value  # unknown leaf keys are reported by from_dict, with a suggestion
    return None


def parse_value(raw: str) -> Any:
    """The value of a ``key=value`` argument, read the same way everywhere (overrides, env
    arguments): ``none``/``null`` is None, ``true``/``false`` in any case a bool, a Python
    literal its value, anything else the text itself."""
    if raw in ("none", "null", "None"):
        return None
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


def make_experiment(name: str, overrides: list[str] | None = None) -> ExperimentConfig:
    """Build a registered experiment, apply overrides, and check it as a whole."""
    config = experiments.make(name)
    if not isinstance(config, ExperimentConfig):
        raise ConfigError([f"experiment '{name}' did not return an ExperimentConfig"])
    if overrides:
        config = apply_overrides(config, overrides)
    return check(attach_user_code(config))
