"""``troupe eval``: greedy episodes with a run's saved parameters (:mod:`system.run.evaluation`)."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from api.errors import UserError
from distributed.launch.arguments import add_import_argument, at_least_one, at_least_zero

VIDEO_MAX_EPISODES = 10
"""What ``troupe eval --video`` records by default at most (every frame is kept in memory
until the file is written: ten CartPole episodes are 5,000 frames)."""


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        metavar="RUN_DIR_OR_CHECKPOINT",
        help="a run folder (the version its run was solved with, else the latest) or a "
        "checkpoint file (checkpoints/<policy>/vNNNNNNNN.ckpt)",
    )
    parser.add_argument("--episodes", type=at_least_one, default=20)
    parser.add_argument("--envs", type=at_least_one, default=8, help="environments stepped at once")
    parser.add_argument(
        "--seed",
        type=at_least_zero,
        default=None,
        help="seed of the episodes (default: the run's own, so an evaluation replays exactly; "
        "another plays other episodes)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the result as one JSON object on the last line"
    )
    parser.add_argument(
        "--video",
        metavar="OUT.mp4",
        help="also record greedy episodes to a video (.mp4 or .gif; needs the 'video' extra)",
    )
    add_import_argument(
        parser,
        help_text="your own .py file or module, imported first; a file of the run's code that has "
        "moved since (another checkout, another machine) is found as the one of its name "
        "given here; repeatable",
    )
    parser.add_argument(
        "--video-episodes",
        type=at_least_one,
        default=None,
        help=f"episodes in the video (default: --episodes, at most {VIDEO_MAX_EPISODES})",
    )


def run_eval(args: argparse.Namespace, console: Console) -> int:
    """Greedy episodes with saved parameters; reports the mean return."""
    import torch

    from api.user_code import import_given
    from system.eval_quota import interval_words
    from system.run.evaluation import earlier_solve_words, evaluate

    if args.video_episodes is not None and not args.video:
        raise UserError("--video-episodes is for the video: name its file with --video")
    torch.set_num_threads(1)
    import_given(args.imports)
    if args.video:
        from distributed.video import record_video

        wanted = args.video_episodes or min(args.episodes, VIDEO_MAX_EPISODES)
        made = record_video(args.target, args.video, episodes=wanted, seed=args.seed or 0)
        # episodes of its own: the evaluation's figures below come from others, seeded apart
        console.print(
            f"video of {len(made.returns)} greedy episodes of {made.policy}, played for it "
            f"(returns {made.returns}), in {args.video}",
            soft_wrap=True,
        )
    result = evaluate(args.target, episodes=args.episodes, envs=args.envs, seed=args.seed)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        whose = f" of {result.policy}" if result.policy else ""
        if result.curriculum_stage is not None:
            whose += f" in curriculum stage {result.curriculum_stage}, the run's last"
        console.print(
            f"{result.episodes} greedy episodes{whose} (a quota per environment), versions "
            f"{result.versions}: mean return {result.mean_return:.2f} ± {result.std_return:.2f}"
            f" ({interval_words(result.ci95_low, result.ci95_high)}; "
            f"min {result.min_return:.2f}, max {result.max_return:.2f})"
        )
        if result.env_args:  # not training's environments: say how they differ
            console.print(f"  played with evaluation.env_args {result.env_args}", highlight=False)
        if len(result.per_policy) > 1 and not result.results:  # a PBT population: each member
            for policy, mean in result.per_policy.items():
                console.print(f"  {policy}: mean return {mean:.2f}", highlight=False)
        for matchup, score in result.results.items():  # multi-agent: who beat whom
            console.print(f"  {matchup.replace('_vs_', ' against ')}: score {score:.3f}")
        if words := earlier_solve_words(args.target):
            console.print(words, soft_wrap=True)
    return 0
