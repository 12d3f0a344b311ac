"""``troupe eval RUN --video out.mp4``: greedy episodes of a trained policy, as a video.

Frames come from the environment's ``render()`` (a gymnasium id is made with
``render_mode="rgb_array"``); imageio writes them (``pip install 'troupe-rl[video]'``, which also
brings ffmpeg for .mp4; .gif needs only imageio).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import NamedTuple

import numpy as np

from api.errors import UserError

FPS = 30
SUFFIXES = (".mp4", ".gif")


class Recording(NamedTuple):
    policy: str
    """Who played: the policy ``load_policy`` picks (a PBT run's best member, say)."""
    returns: list[float]


def record_video(
    target: str | Path, out: str | Path, episodes: int = 1, seed: int = 0
) -> Recording:
    """Play ``episodes`` greedy episodes of the run's policy (``load_policy``'s); write their
    frames to ``out``."""
    imageio = writer_for(out)
    from distributed.api import load_policy

    policy = load_policy(target)
    _quiet_sdl()
    _headless_opengl()
    kwargs = {"render_mode": "rgb_array"} if _is_gymnasium(policy.config.environment.type) else {}
    env = policy.make_env(evaluation=True, **kwargs)  # greedy episodes, as evaluation plays
    if env.agent_count != 1:
        raise UserError("--video plays one-agent environments; this one has several agents")
    out, returns = Path(out), []
    writer = _open_writer(imageio, out)
    try:
        for episode in range(episodes):
            env.seed(seed + episode)
            (result,), state, total = env.reset(), None, 0.0
            _append(writer, out, _frame(env))
            while not (result.done or result.truncated):
                action, state = policy.act(result.obs, state)
                (result,) = env.step([action])
                total += float(np.asarray(result.reward).reshape(-1)[0])
                _append(writer, out, _frame(env))
            returns.append(round(total, 3))
    except BaseException:
        with contextlib.suppress(Exception):  # the error that stopped the recording is the one
            writer.close()
        out.unlink(missing_ok=True)  # a video cut off midway is not one to keep
        raise
    finally:
        env.close()
    _close(writer, out)
    return Recording(policy.name, returns)


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
    try:
        frame = env.render()
    except Exception as e:  # the environment's own drawing: say so, and how MuJoCo draws
        opengl = type(e).__module__.split(".")[0] in GL_MODULES or "OpenGL" in str(e)
        hint = f". {GL_HINT}" if opengl else ""
        raise UserError(
            f"the environment could not draw a frame: {type(e).__name__}: {e}{hint}"
        ) from e
    if frame is None:
        raise UserError(
            "the environment's render() returned None: it cannot draw frames (a gymnasium id is "
            "made with render_mode='rgb_array'; your own environment must return an RGB array)"
        )
    return np.asarray(frame, dtype=np.uint8)


def _open_writer(imageio, out: Path):
    """A writer that takes frames as they are drawn: kept in memory, ten Pong episodes were
    gigabytes of frames, and a MuJoCo task's 480x480 frames 0.7 GB per 1,000 steps. (Pillow
    still assembles a .gif in memory: a .gif is for short clips.)"""
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        if out.suffix.lower() == ".gif":
            return imageio.get_writer(out, mode="I", duration=1000 / FPS)
        return imageio.get_writer(out, fps=FPS, macro_block_size=1)
    except (ValueError, RuntimeError, ImportError, OSError) as e:
        raise UserError(f"could not write {out}: {e}") from e


def _append(writer, out: Path, frame: np.ndarray) -> None:
    try:
        writer.append_data(frame)
    except (ValueError, RuntimeError, OSError) as e:
        raise UserError(f"could not write {out}: {e}") from e


def _close(writer, out: Path) -> None:
    try:
        writer.close()
    except (ValueError, RuntimeError, OSError) as e:
        out.unlink(missing_ok=True)
        raise UserError(f"could not write {out}: {e}") from e


GL_MODULES = ("mujoco", "OpenGL", "glfw")
GL_HINT = (
    "MuJoCo tasks draw through OpenGL: on a machine without a display set MUJOCO_GL=egl "
    "(a GPU driver's or Mesa's libEGL) or MUJOCO_GL=osmesa (libOSMesa)"
)


def _headless_opengl() -> None:
    """Pick MuJoCo's off-screen OpenGL on a Linux machine without a display.

    Left to itself, gymnasium tries GLFW first; without ``DISPLAY`` GLFW imports, then fails to
    make a context, and MuJoCo ends the run with "an OpenGL platform library has not been
    loaded". EGL draws without a display (GPU drivers and Mesa ship it), OSMesa in software. A
    ``MUJOCO_GL`` or ``PYOPENGL_PLATFORM`` the user set is theirs to keep."""
    import ctypes.util
    import os
    import sys

    shown = os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    chosen = os.environ.get("MUJOCO_GL") or os.environ.get("PYOPENGL_PLATFORM")
    if sys.platform != "linux" or shown or chosen:
        return
    for backend, library in (("egl", "EGL"), ("osmesa", "OSMesa")):
        if ctypes.util.find_library(library):
            os.environ["MUJOCO_GL"] = backend
            return


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
