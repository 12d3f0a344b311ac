"""Whether a config makes a runnable experiment: every problem at once, before any process starts.

:func:`validate` walks the whole tree and returns every problem it finds (bad values, unknown
registered names, keyword arguments a component does not take, rules that contradict each
other), so a user fixes them in one go instead of one per launch; :func:`check` raises them as
one :class:`~api.errors.ConfigError`. The argument checks are :mod:`api.config.arguments`; the
league sections' (curriculum, PBT, self-play) :mod:`api.config.league`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from typing import Any

from api import user_code
from api.code import RegistrationConfig, load_code
from api.config.arguments import check_arguments, check_ranges, evaluation_env_errors
from api.config.league import check_league
from api.config.parallel import check_data_parallel
from api.config.schema import (
    ActorConfig,
    ComponentConfig,
    ExperimentConfig,
    PolicyConfig,
    ReplayConfig,
    StopConfig,
    from_mapping,
)
from api.errors import ConfigError, RegistryError, UserError
from api.registry import REGISTRIES
from api.signatures import UNKNOWN, static_class_attribute


def validate(config: ExperimentConfig) -> list[str]:
    """Every problem with ``config``, as messages naming the key; empty when it is fine."""
    errors: list[str] = []
    errors += _check_types(config)
    if not config.name:
        errors.append("name: must be set")
    errors += _check_component("environment", "environment", config.environment)
    errors += evaluation_env_errors(config)
    if not config.policies:
        errors.append("policies: at least one policy is needed")
    for pname, pc in config.policies.items():
        errors += _check_component("policy", f"policies.{pname}.policy", pc.policy)
        if not pc.policy.type:
            errors[-1] += _misspelt_policy(pname, config)
        if pc.trainer.type:
            errors += _check_component(
                "trainer", f"policies.{pname}.trainer", pc.trainer, skip=("policy",)
            )
        for key in ("policy_workers", "trainer_workers", "trainer_threads", "batch_segments",
                    "publish_every"):  # fmt: skip
            if _below(value := getattr(pc, key), 1):
                errors.append(f"policies.{pname}.{key}: must be at least 1, got {value!r}")
        if pc.trainer.type and uses_replay(pc):
            seats = max(1, config.agent_policies.count(pname))  # each adds a chunk of its own
            errors += _check_replay(f"policies.{pname}.replay", pc.replay, config.actors, seats)
            errors += _check_replay_budget(f"policies.{pname}.replay", pc.replay, config.stop)
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
    errors += _check_thin(config.metrics.thin)
    for pname, pc in config.policies.items():
        errors += check_data_parallel(f"policies.{pname}", pc)
    errors += _check_positive(
        config.actors,
        "actors",
        ("workers", "envs_per_worker", "segment_length", "groups", "make_threads"),
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
    errors = [
        f"policies.{name}: no agent plays it; name it in agent_policies, or remove it (its "
        "network is built for the spaces of an agent that plays it)"
        for name in config.policies
        if config.agent_policies
        and not (mapped or config.pbt.members)
        and name not in config.agent_policies
    ]
    errors += [  # a file with `base:` kept its recipe's policy beside the population
        f"policies.{name}: not in pbt.members, so no actor plays it (each member plays its "
        f"own); add it to pbt.members, or remove it (in a file with base:, {name}: null)"
        for name in config.policies
        if config.pbt.members and name not in config.pbt.members
    ]
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


def _check_replay(path: str, rc: ReplayConfig, actors: ActorConfig, seats: int = 1) -> list[str]:
    """``seats``: the agents playing the policy (``agent_policies``), each sending an actor's
    segments: a tolerance fitted to one agent's passed this check, and two agents' run
    stopped at the first chunk with "the trainer and the actors would wait for each other
    forever"."""
    errors = _check_positive(
        rc, path, ("capacity_frames", "batch_size", "batches_per_message", "n_step", "min_size")
    )
    if isinstance(rc.gamma, (int, float)) and not 0.0 <= rc.gamma <= 1.0:
        errors.append(f"{path}.gamma: must be in [0, 1], got {rc.gamma}")
    for key in ("alpha", "beta"):
        if _below(getattr(rc, key), 0):
            errors.append(f"{path}.{key}: must be 0 or more")
    if isinstance(rc.beta, (int, float)) and rc.beta > 1:  # past 1 it over-corrects the bias
        errors.append(f"{path}.beta: must be in [0, 1] (1: full importance correction), "
                      f"got {rc.beta}")  # fmt: skip
    if rc.samples_per_insert is not None and _below(rc.samples_per_insert, 1e-300):
        errors.append(f"{path}.samples_per_insert: must be more than 0, or None for no limit")
    if rc.save_every_s is not None and _below(rc.save_every_s, 1e-300):
        errors.append(f"{path}.save_every_s: must be more than 0, or None to save only at the end")
    if rc.tolerance is not None and _below(rc.tolerance, 1e-300):
        errors.append(f"{path}.tolerance: must be more than 0, or None for the default")
    elif rc.tolerance is not None and rc.samples_per_insert is not None:
        chunk = actors.segment_length * actors.envs_per_worker * rc.samples_per_insert * seats
        message = rc.message_rows
        need = max(message, chunk)
        whose = f" (of the {seats} agents it plays)" if seats > 1 else ""
        if rc.tolerance < need:
            errors.append(
                f"{path}.tolerance: {rc.tolerance:g} is less than one message of batches "
                f"({message}) or one actor's segments{whose} times samples_per_insert "
                f"({chunk:g}), so the trainer and the actors could wait for each other forever; "
                f"use at least {need:g}, or None"
            )
    sizes = (rc.min_size, rc.capacity_frames, actors.segment_length)
    if all(isinstance(v, int) and v >= 1 for v in sizes):
        errors += _check_min_size(path, rc, actors.segment_length)
    return errors


def _check_replay_budget(path: str, rc: ReplayConfig, stop: StopConfig) -> list[str]:
    """A frame budget below ``min_size`` ends the run before its trainer's first step: it
    would stop as planned (exit 0) having trained nothing."""
    sizes = (rc.min_size, stop.env_frames)
    if not all(isinstance(v, int) and v >= 1 for v in sizes) or stop.env_frames >= rc.min_size:
        return []
    return [
        f"{path}.min_size: the trainer's first batch waits for {rc.min_size} frames in the "
        f"buffer, and stop.env_frames={stop.env_frames} ends the run before that: it would "
        "train nothing. Raise stop.env_frames (frames=) or lower min_size"
    ]


def _check_min_size(path: str, rc: ReplayConfig, segment_length: int) -> list[str]:
    """The buffer keeps whole segments of ``segment_length`` frames, so it holds at most
    ``capacity_frames`` rounded down to a whole number of them. A ``min_size`` above that
    is never reached: the trainer would wait for its first batch, and the rate-limited actors
    for the trainer, for ever (a run stalled with no error)."""
    held = rc.capacity_frames // segment_length * segment_length
    if rc.min_size <= held:
        return []
    if rc.min_size > rc.capacity_frames:
        why = f"a buffer of capacity_frames={rc.capacity_frames}"
    else:
        why = (f"a buffer of capacity_frames={rc.capacity_frames}, which keeps whole segments "
               f"of actors.segment_length={segment_length} frames: {held} at most")  # fmt: skip
    return [
        f"{path}.min_size: {rc.min_size} frames can never be in {why}; lower min_size or raise "
        "capacity_frames"
    ]


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
        from_mapping(ExperimentConfig, dataclasses.asdict(config), "", errors)
    except TypeError as e:
        errors.append(f"config: {e}")
    return errors


def _check_positive(obj: Any, path: str, keys: tuple[str, ...]) -> list[str]:
    return [f"{path}.{k}: must be at least 1, got {getattr(obj, k)!r}"
            for k in keys if _below(getattr(obj, k), 1)]  # fmt: skip


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


def _check_thin(steps: Any) -> list[str]:
    """``metrics.thin``: ``[after_s, every_s]`` pairs, later steps after earlier ones."""
    pairs = (list, tuple)  # a config made in Python may hold tuples
    if not isinstance(steps, pairs) or not all(isinstance(s, pairs) for s in steps):
        return []  # the type check says so
    number = (int, float)
    if any(len(s) != 2 or not all(isinstance(v, number) for v in s) for s in steps):
        return [f"metrics.thin: [after_s, every_s] pairs of numbers, e.g. [[3600, 10]]; "
                f"got {steps!r}"]  # fmt: skip
    errors = [f"metrics.thin[{i}]: after_s must be 0 or more and every_s more than 0, got {s}"
              for i, s in enumerate(steps) if s[0] < 0 or s[1] <= 0]  # fmt: skip
    afters = [s[0] for s in steps]
    if afters != sorted(set(afters)):
        errors.append(f"metrics.thin: the after_s of each step must be above the previous "
                      f"one's, got {afters}")  # fmt: skip
    return errors


def _misspelt_policy(name: str, config: ExperimentConfig) -> str:
    """A file's ``policies.defualt:`` under a ``base:`` adds a policy with no type beside the
    base's ``default``, which said only that the new one needs a type (and that agents need a
    mapping): the hint names the policy it was probably meant to change."""
    typed = [p for p, pc in config.policies.items() if pc.policy.type]
    close = difflib.get_close_matches(name, typed, n=1)
    if not close:
        return ""
    return f" ('{name}' is a new policy here: did you mean to set '{close[0]}'?)"


def _check_component(kind: str, path: str, comp: ComponentConfig, skip=()) -> list[str]:
    if not comp.type:
        return [f"{path}.type: must name a registered {kind}"]
    try:
        spec = REGISTRIES[kind].spec(comp.type)
    except RegistryError as e:
        return [f"{path}.type: {e}"]
    return check_arguments(spec, comp.args, path, skip)


def check_portable(config: ExperimentConfig) -> None:
    """Refuse, before a run starts its processes, a component it builds that only this
    process can build: one defined in an interactive session (a notebook cell, ``python -c``),
    which a worker cannot import. Unrefused, every worker fails with "unknown environment" or
    "has no attribute" once the run has started. ``testing.test_pipeline`` builds it here."""
    used = _component_types(config)
    stuck = [r for r in config.code.registrations if r.name in used and _interactive(r)]
    if stuck:
        names = ", ".join(f"{r.kind} '{r.name}'" for r in stuck)
        raise UserError(
            f"{names}: defined in this interactive session (a notebook, python -c, code piped to "
            "python), which the run's workers cannot import: they are other processes. Save "
            "the code in a .py file and import it from there (import my_envs; or "
            "troupe.train(..., imports=['my_envs.py']); or troupe run --import my_envs.py). "
            f"troupe.test_pipeline('{config.environment.type}') checks them here, in this "
            "process, where they are defined."
        )


def _interactive(r: RegistrationConfig) -> bool:
    """Built from an interactive session's ``__main__``: its class, or a gymnasium id it
    registered (``user_code.INTERACTIVE`` among the registration's ``requires``)."""
    module = r.entry_point.partition(":")[0]
    return (module == user_code.INTERACTIVE and not r.source) or user_code.INTERACTIVE in r.requires


def _component_types(obj: Any) -> set[str]:
    """The registered names ``obj`` (a config, or any part of one) builds."""
    if isinstance(obj, ComponentConfig):
        return {obj.type}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        values = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif isinstance(obj, dict):
        values = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        values = list(obj)
    else:
        return set()
    return set().union(*(_component_types(v) for v in values))
