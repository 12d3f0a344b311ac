"""Warnings about a stop budget that ends a run before its trainers train (exit 0, nothing
learned): ``troupe train CartPole-v1 frames=100``, or a resume that leaves too few frames."""

from __future__ import annotations

import logging

from api.config import ExperimentConfig

logger = logging.getLogger(__name__)


def warn_short_budget(config: ExperimentConfig, frames_done: int = 0) -> None:
    """Say when ``stop.env_frames`` ends a run before an on-policy trainer's next step
    (``troupe train CartPole-v1 frames=100``, or a resume with a budget raised by less than a
    step): it stops as asked, exit 0, having trained nothing. A replay trainer's ``min_size``
    above a new run's budget is a config error already. ``frames_done``: a resumed run's."""
    from api.config.checks import uses_replay

    budget = config.stop.env_frames
    left = None if budget is None else budget - frames_done
    said = f" (it has {frames_done})"
    for name, pc in config.policies.items():
        if pc.trainer.type and uses_replay(pc) and frames_done and left is not None:
            _warn_short_replay_resume(config, name, left, frames_done)
        step = pc.batch_segments * config.actors.segment_length * pc.trainer_workers
        if not pc.trainer.type or uses_replay(pc) or left is None or left >= step:
            continue
        logger.warning(
            "stop.env_frames=%d ends the run %s policy '%s' trains once: a trainer step "
            "takes %d frames (batch_segments %d x actors.segment_length %d%s)",
            budget, f"{left} frames after this resume{said}, before" if frames_done else "before",
            name, step, pc.batch_segments, config.actors.segment_length,
            f" x trainer_workers {pc.trainer_workers}" if pc.trainer_workers > 1 else "",
        )  # fmt: skip


def _warn_short_replay_resume(config: ExperimentConfig, name: str, left: int, done: int) -> None:
    """A replay trainer trains from its restored buffer as soon as it is up, but a resume whose
    budget the actors' first segments already meet can stop before that (exit 0, nothing more
    trained): said when less than one segment of every actor's environments is left."""
    actors = config.actors
    round_ = actors.workers * actors.envs_per_worker * actors.segment_length
    if left >= round_:
        return
    logger.warning(
        "stop.env_frames=%d ends the run %d frames after this resume (it has %d), less than one "
        "segment from each actor (%d frames: actors.workers %d x envs_per_worker %d x "
        "segment_length %d): it may stop before policy '%s' trains again",
        config.stop.env_frames, left, done, round_, actors.workers, actors.envs_per_worker,
        actors.segment_length, name,
    )  # fmt: skip


def warn_target_horizon(config: ExperimentConfig) -> None:
    """Say when the stop target is gymnasium's ``reward_threshold`` for an episode length that
    ``environment.args.max_episode_steps`` changed (``api.environment.target_out_of_horizon``),
    or ``evaluation.env_args``'s, where the target is judged."""
    from api.environment import target_out_of_horizon

    env, judged = config.environment, config.evaluation.env_args
    where = "evaluation.env_args" if "max_episode_steps" in judged else "environment.args"
    args = {**env.args, **judged}
    why = target_out_of_horizon(env.type, args, config.stop.eval_return, where)
    if why:
        logger.warning("%s", why)
