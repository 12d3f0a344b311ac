"""``troupe eval RUN --video out.mp4``: greedy episodes of a trained policy, as a video.

Frames come from the environment's ``render()`` (a gymnasium id is made with
``render_mode="rgb_array"``); imageio writes them (``pip install 'troupe-rl[video]'``, which also
brings ffmpeg for .mp4; .gif needs only imageio).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from api.errors import UserError

FPS = 30
SUFFIXES = (".mp4", ".gif")


def record_video(target: str | Path, out: str | Path, episodes: int = 1, seed: int = 0) -> list:
    """Play ``episodes`` greedy episodes of the run's (first) policy; write their frames to
    ``out``; return the episodes' returns."""
    imageio = writer_for(out)
    from distributed.api import load_policy

    policy = load_policy(target)
    _quiet_sdl()
    kwargs = {"render_mode": "rgb_array"} if _is_gymnasium(policy.config.environment.type) else {}
    env = policy.make_env(evaluation=True, **kwargs)  # greedy episodes, as evaluation plays
    if env.agent_count != 1:
        raise UserError("--video plays one-agent environments; this one has several agents")
    frames, returns = [], []
    try:
        for episode in range(episodes):
            env.seed(seed + episode)
            (result,), state, total = env.reset(), None, 0.0
            frames.append(_frame(env))
            while not (result.done or result.truncated):
                action, state = policy.act(result.obs, state)
                (result,) = env.step([action])
                total += float(np.asarray(result.reward).reshape(-1)[0])
                frames.append(_frame(env))
            returns.append(round(total, 3))
    finally:
        env.close()
    _write(imageio, Path(out), frames)
    return returns


def writer_for(out: str | Path):
    """imageio, once it is known that it can write ``out``: checked before any episode is
    played. A name without .mp4 or .gif (``--video clip``) played every episode, then ended in
    imageio's ``KeyError: None``."""
    suffix = Path(out).suffix.lower()
    if suffix not in SUFFIXES:
        raise UserError(
            f"--video {out}: name a .mp4 or .gif file (e.g. {Path(out).with_suffix('.mp4')}); "
            "the suffix picks the format"
        )
    try:
        import imageio.v2 as imageio

        if suffix == ".mp4":
            import imageio_ffmpeg  # noqa: F401  # ffmpeg itself, which imageio calls for .mp4
    except ImportError as e:
        raise UserError(f"--video {out} needs {e.name}: pip install 'troupe-rl[video]'") from e
    return imageio


def _frame(env) -> np.ndarray:
    frame = env.render()
    if frame is None:
        raise UserError(
            "the environment's render() returned None: it cannot draw frames (a gymnasium id is "
            "made with render_mode='rgb_array'; your own environment must return an RGB array)"
        )
    return np.asarray(frame, dtype=np.uint8)


def _write(imageio, out: Path, frames: list[np.ndarray]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        if out.suffix.lower() == ".gif":
            imageio.mimsave(out, frames, duration=1000 / FPS)
        else:
            imageio.mimsave(out, frames, fps=FPS, macro_block_size=1)
    except (ValueError, RuntimeError, ImportError) as e:
        raise UserError(f"could not write {out}: {e}") from e


def _is_gymnasium(name: str) -> bool:
    import gymnasium as gym

    return name in gym.registry


def _quiet_sdl() -> None:
    """Rendering through pygame's SDL prints "error: XDG_RUNTIME_DIR is invalid" on a machine
    without a login session (a container, CI, ssh), which reads like Troupe's own error; a
    private runtime directory and no sound device keep it quiet (drawing is unaffected)."""
    import os
    import tempfile

    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if not runtime or not os.path.isdir(runtime):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="troupe-xdg-")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
