"""What ``troupe run --resume RUN`` checks before any process starts.

A resume with a changed network (``hidden_sizes=[32,32]`` on a run trained with ``[64,64]``)
used to start, crash-loop every policy worker on a torch size mismatch, make no frame and exit 0.
So the saved config is compared with the resumed one first:

- what the saved checkpoints or the learned behaviour depend on cannot change: the environment
  (it decides the spaces), each policy's network, its algorithm (``trainer.type``), which
  policies exist and who plays which agent. Such a change is refused in one line naming the key
  (unless the run saved no checkpoint at all: one that failed at its start may be mended);
- everything else can (stop rules, worker counts, learning rates, evaluation, liveness); what
  changed is printed and appended to the run folder's ``resumes.jsonl``.

A resume whose stop budget the run has already spent (``stop.wall_seconds`` or
``stop.env_frames``, which count the whole run, the part before the resume too) is refused in
one line saying how far the run got: it used to start every worker, stop at once and exit 0.

Then the checkpoints are verified (each file's digest, :mod:`system.parameters.checkpoint_file`):
a damaged file is named in a warning and the newest good one is used; a policy whose parameter
files (or trainer states) are all damaged is refused in one line, since resuming it would
silently start from scratch.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import time
from pathlib import Path
from typing import Any

from api.config import ExperimentConfig
from api.errors import ConfigError, RunFolderError, UserError
from system import run_folder
from system.parameters.checkpoint_file import load_checkpoint_file
from system.parameters.store import LATEST_FILE, TRAINER_FILE, TRAINER_PREVIOUS_FILE

logger = logging.getLogger(__name__)

CONFIG_FILE = run_folder.CONFIG
RESUMES_FILE = run_folder.RESUMES

FIXED = (
    "environment.*",
    "policies",
    "policies.*.policy.*",
    "policies.*.trainer.type",
    "agent_policies",
    "policy_mapping.*",
    "pbt.members",
    "selfplay.opponent",
    "selfplay.learner",
)
"""Keys (``*`` any part) a resume may not change: the checkpoints were made for them."""
CHANGEABLE_EXCEPTIONS = ("policies.*.policy.args.device",)
"""Keys under :data:`FIXED` patterns that may change all the same (where a network runs)."""


def saved_config(folder: Path) -> ExperimentConfig:
    """The run folder's own config; a damaged or foreign ``config.json`` is one line."""
    path = folder / CONFIG_FILE
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise RunFolderError(f"cannot read {path}: {e.strerror or e}") from e
    except ValueError as e:
        raise UserError(
            f"{path} is damaged (not valid JSON: {e}); restore it from a copy, or start a new "
            "run from the experiment with --run-dir"
        ) from e
    try:
        return ExperimentConfig.from_dict(data)
    except ConfigError as e:
        raise UserError(f"{path} is not a config this version of Troupe reads: {e}") from e


def changes(saved: ExperimentConfig, new: ExperimentConfig) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved value, new value)}`` for every leaf that differs, and for ``policies``
    when the set of policy names does."""
    old_flat, new_flat = _flatten(saved.to_dict()), _flatten(new.to_dict())
    out = {
        key: (old_flat.get(key), new_flat.get(key))
        for key in sorted(set(old_flat) | set(new_flat))
        if old_flat.get(key) != new_flat.get(key)
    }
    if set(saved.policies) != set(new.policies):
        out["policies"] = (sorted(saved.policies), sorted(new.policies))
    return out


def check_compatible(saved: ExperimentConfig, new: ExperimentConfig, folder: Path) -> None:
    """Refuse a change the checkpoints cannot follow; print and record the others."""
    changed = changes(saved, new)
    fixed = [key for key in changed if _fixed(key)]
    if fixed and _saved_anything(folder):
        key, (before, after) = fixed[0], changed[fixed[0]]
        raise UserError(
            f"cannot resume {folder} with {key}={after!r}: the run was trained with "
            f"{before!r}, and its checkpoints hold that; start a new run for the change"
        )
    if fixed:  # a run that failed at its start (a config its environment refuted): mend it
        logger.warning("%s saved no checkpoint: it resumes from scratch with %s", folder,
                       ", ".join(fixed))  # fmt: skip
    _check_replay_segments(saved, changed, folder)
    _check_replay_extras(saved, new, changed, folder)
    if not changed:
        return
    listed = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
    logger.warning("resuming %s with changes: %s", folder, listed)
    record = {"time": time.time(), "changed": {k: [a, b] for k, (a, b) in changed.items()}}
    try:
        with open(folder / RESUMES_FILE, "a") as f:
            f.write(json.dumps(record, default=str) + "\n")
    except OSError as e:
        raise RunFolderError.from_os_error(folder / RESUMES_FILE, e) from e


def _saved_anything(folder: Path) -> bool:
    """Whether the run saved any checkpoint (parameters, trainer state, a replay buffer).
    One that saved none (it failed at its start) may resume with any change: "its
    checkpoints hold that" refused the mended config of a run that had none."""
    return any(p.is_file() for p in (folder / run_folder.CHECKPOINTS).rglob("*"))


def _check_replay_segments(
    saved: ExperimentConfig, changed: dict[str, tuple[Any, Any]], folder: Path
) -> None:
    """A saved replay buffer holds whole segments of the run's ``actors.segment_length``: a
    resume with another length would crash its replay worker on the first insert, again and
    again (a crash loop that failed the run)."""
    if "actors.segment_length" not in changed:
        return
    from api.config.checks import uses_replay
    from system.workers.replay_worker import replay_file

    before, after = changed["actors.segment_length"]
    for name, pc in saved.policies.items():
        path = replay_file(folder, name)
        if pc.trainer.type and uses_replay(pc) and path.is_file():
            raise UserError(
                f"cannot resume {folder} with actors.segment_length={after!r}: policy "
                f"'{name}''s replay buffer ({path}) holds segments of {before!r} frames; keep "
                f"actors.segment_length={before!r}, or remove that file to start the buffer empty"
            )


def _check_replay_extras(
    saved: ExperimentConfig, new: ExperimentConfig, changed: dict, folder: Path
) -> None:
    """A saved replay buffer holds the extra fields its run's actor callbacks declared
    (``segment_fields``): a resume whose callbacks declare others would fail its replay
    worker on the first insert, after every worker had started."""
    if not any(key.startswith("actor_callbacks") for key in changed):
        return
    from api.config.checks import uses_replay
    from system.run.declared import extra_fields
    from system.workers.replay_worker import replay_file

    held = [replay_file(folder, n) for n, pc in saved.policies.items() if uses_replay(pc)]
    held = [path for path in held if path.is_file()]
    if not held:
        return
    try:
        before, after = sorted(extra_fields(saved)), sorted(extra_fields(new))
    except Exception:  # a callback that cannot be built: the run's own checks say why
        return
    if before != after:
        raise UserError(
            f"cannot resume {folder} with these actor_callbacks: they add the segment fields "
            f"{after}, and its replay buffer ({held[0]}) holds transitions with {before}; "
            "keep the run's actor callbacks, or remove that file to start the buffer empty"
        )


def check_budget_left(folder: Path, config: ExperimentConfig) -> int:
    """Refuse a resume that would stop as soon as it started: the run's last record already
    meets ``stop.wall_seconds`` or ``stop.env_frames``. The frames the run has made so far."""
    from system.run.metrics_file import newest_record

    last = newest_record(folder)
    if not last:
        return 0
    stop = config.stop
    wall, frames = float(last.get("wall_s") or 0.0), int(last.get("env_frames") or 0)
    spent, raised = [], []
    if stop.wall_seconds is not None and wall >= stop.wall_seconds:
        spent.append(f"stop.wall_seconds={stop.wall_seconds:g} (it has run {wall:.0f} s)")
        raised.append(f"stop.wall_seconds={wall + 600:.0f} for ten minutes more")
    if stop.env_frames is not None and frames >= stop.env_frames:
        spent.append(f"stop.env_frames={stop.env_frames} (it has {frames} frames)")
        raised.append(f"stop.env_frames={2 * frames} for as many frames again")
    steps = _trainer_steps(folder, config, last)
    if stop.trainer_steps and steps and min(steps.values()) >= stop.trainer_steps:
        done = ", ".join(f"'{name}' {n}" for name, n in steps.items())
        spent.append(f"stop.trainer_steps={stop.trainer_steps} (its trainers have {done})")
        raised.append(f"stop.trainer_steps={2 * max(steps.values())} for as many steps again")
    if spent:
        raise UserError(
            f"nothing to resume in {folder}: the run already reached {' and '.join(spent)}; "
            f"these budgets count the whole run, so raise them (e.g. {', '.join(raised)})"
        )
    return frames


def check_not_solved(folder: Path, config: ExperimentConfig) -> None:
    """Refuse to resume a run that met its target when the resumed config asks for that target
    again (or a lower one): it trained on, was solved once more by a later version and rewrote
    the summary, its first solve (``frames_to_target``, ``solved_version``) lost."""
    try:
        summary = json.loads((folder / run_folder.SUMMARY).read_text())
    except (OSError, ValueError):
        return
    if not isinstance(summary, dict) or not summary.get("solved"):
        return
    reason, target = summary.get("stop_reason"), summary.get("target")
    key, asked = {
        "eval_return": ("stop.eval_return", config.stop.eval_return),
        "pbt_target_return": ("pbt.target_return", config.pbt.target_return),
    }.get(reason, ("", None))
    if asked is None or not isinstance(target, (int, float)) or asked > target:
        return
    solved = summary.get("solved_version") or {}
    by = f" (version {solved['version']} of '{solved['policy']}')" if solved else ""
    raise UserError(
        f"nothing to resume in {folder}: the run already met {key}={target:g}{by} after "
        f"{summary.get('frames_to_target') or summary.get('env_frames')} frames; to train on, "
        f"resume with {key}=None and a budget (stop.env_frames or stop.wall_seconds), or a "
        "higher target"
    )


def _trainer_steps(folder: Path, config: ExperimentConfig, last: dict) -> dict[str, int]:
    """Each trained policy's trainer steps as the run's newest record (``last``) or the last
    record that has them says (every one of them known, or {}): what ``stop.trainer_steps`` is
    met by, since a restored trainer counts on from them. A resume with that budget spent
    trained on and exited 0; the other budgets were refused."""
    from system.run.metrics_file import read_metrics

    keys = {f"trainer/{name}/steps": name for name, pc in config.policies.items()
            if pc.trainer.type}  # fmt: skip
    found: dict[str, int] = {}
    for record in [last, *reversed(read_metrics(folder, keep=keys.__contains__))]:
        for key, name in keys.items():
            if name not in found and isinstance(record.get(key), (int, float)):
                found[name] = int(record[key])
        if len(found) == len(keys):
            return {name: found[name] for name in keys.values()}
    return {}


def check_checkpoints(folder: Path, config: ExperimentConfig, trainer_state: bool = True) -> None:
    """Each trained policy resumes from a checkpoint that proves itself, or not at all.
    ``trainer_state=False``: parameters only (an evaluation never reads the optimiser)."""
    for name in config.policies:
        policy_dir = folder / run_folder.CHECKPOINTS / name
        if not policy_dir.is_dir():
            continue
        params = [policy_dir / LATEST_FILE, *sorted(policy_dir.glob("v*.ckpt"), reverse=True)]
        _newest_good(name, "parameters", [p for p in params if p.is_file()], "params")
        if not trainer_state:
            continue
        states = [policy_dir / TRAINER_FILE, policy_dir / TRAINER_PREVIOUS_FILE]
        _newest_good(name, "trainer state", [p for p in states if p.is_file()], "trainer")


def _newest_good(policy: str, what: str, files: list[Path], field: str) -> Path | None:
    damaged: list[str] = []
    for path in files:
        try:
            load_checkpoint_file(path, field=field)
        except (OSError, ValueError) as e:
            damaged.append(path.name)
            skipped = str(e)
            continue
        if damaged:  # said once per policy; the files are named in the message
            logger.warning("skipping damaged %s (%s) for %s: %s", what, ", ".join(damaged),
                           path.name, skipped)  # fmt: skip
        return path
    if damaged:
        raise RunFolderError(
            f"cannot resume policy '{policy}': every {what} file in {files[0].parent} is "
            f"damaged ({', '.join(damaged)}); restore them from a copy, or remove them to start "
            "that part afresh"
        )
    return None


def _fixed(key: str) -> bool:
    if any(fnmatch.fnmatchcase(key, p) for p in CHANGEABLE_EXCEPTIONS):
        return False
    return any(fnmatch.fnmatchcase(key, p) for p in FIXED)


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Leaves by dotted key. An empty mapping is none: kept as a leaf, ``environment.args``
    ({} then, a key below it now) was the change a refusal named, ``with
    environment.args=None: the run was trained with {}``, not the key that changed."""
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: data}
