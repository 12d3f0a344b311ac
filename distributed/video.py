"""``troupe eval RUN --video out.mp4``: greedy episodes of a trained policy, as a video; of a
multi-agent run, each agent played by the policy its evaluation seats there (:class:`Seating`).

Frames come from the environment's ``render()`` (a gymnasium id is made with
``render_mode="rgb_array"``); imageio writes them (``pip install 'troupe-rl[video]'``, which also
brings ffmpeg for .mp4; .gif needs only imageio).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from api.errors import UserError

if TYPE_CHECKING:
    from distributed.api import LoadedPolicy

FPS = 30
SUFFIXES = (".mp4", ".gif")


class Recording(NamedTuple):
    policy: str
    """Who played: the policy ``load_policy`` picks (a PBT run's best member, say); of a
    multi-agent run, each seat's policy in the agents' order ("red, blue")."""
    returns: list[Any]
    """Each episode's return (of several agents, their mean); where several policies play,
    each one's."""


def record_video(
    target: str | Path, out: str | Path, episodes: int = 1, seed: int = 0
) -> Recording:
    """Play ``episodes`` greedy episodes of the run's policy (``load_policy``'s), or of each
    agent's policy in a multi-agent run; write their frames to ``out``."""
    imageio = writer_for(out)
    from distributed.api import load_policy

    policy = load_policy(target)
    _quiet_sdl()
    _headless_opengl()
    kwargs = _render_kwargs(policy.config.environment.type)
    env = policy.make_env(evaluation=True, **kwargs)  # greedy episodes, as evaluation plays
    out, returns, played = Path(out), [], {}
    try:
        seating = Seating(target, policy, env.agent_count)
        writer = _open_writer(imageio, out)
    except BaseException:
        env.close()
        raise
    try:
        for episode in range(episodes):
            seats = seating.of(episode)
            played.update((seat.name, None) for seat in seats)
            env.seed(seed + episode)
            totals = _play(env, seats, lambda: _append(writer, out, _frame(env)))
            returns.append(_returns(seats, totals))
    except BaseException:
        with contextlib.suppress(Exception):  # the error that stopped the recording is the one
            writer.close()
        out.unlink(missing_ok=True)  # a video cut off midway is not one to keep
        raise
    finally:
        env.close()
    _close(writer, out)
    return Recording(", ".join(played), returns)


class Seating:
    """Who plays each agent of a video's episode, as the run's evaluation seats them: its
    policy mapping (``evaluation.policy_mapping``, else the run's), asked afresh for each
    episode (self-play: the learner in either seat, against a scripted opponent); else each
    agent's ``agent_policies`` entry; else ``played`` (the one policy, or a PBT run's best
    member) at every seat. A self-play opponent, which has no parameters of its own (it plays
    the learner's past versions), is played by the learner's version under its own name."""

    def __init__(self, target: str | Path, played: LoadedPolicy, agents: int):
        from api.policy_mapping import make_policy_mapping

        self.target, self.agents = target, agents
        self.loaded = {played.name: played}
        self.config = config = played.config
        comp = config.evaluation.policy_mapping
        comp = comp if comp.type else config.policy_mapping
        self.mapping = make_policy_mapping(comp.type, **comp.args) if comp.type else None
        self.fixed = list(config.agent_policies) or [played.name] * agents

    def of(self, episode: int) -> list[LoadedPolicy]:
        if self.mapping is None:
            return [self._load(name) for name in self.fixed]
        info = {"env": 0, "actor": "video", "evaluation": True}
        return [self._load(self.mapping(episode, a, info)) for a in range(self.agents)]

    def _load(self, name: str) -> LoadedPolicy:
        if name not in self.loaded:
            from distributed.api import load_policy

            if name == self.config.selfplay.opponent:  # load_policy refuses it: no parameters
                stand_in = copy.copy(self._load(self.config.selfplay.learner))
                stand_in.name = name
                self.loaded[name] = stand_in
            else:
                self.loaded[name] = load_policy(self.target, policy=name)
        return self.loaded[name]


def _play(env, seats: list[LoadedPolicy], frame: Callable[[], None]) -> list[float]:
    """One greedy episode, ``frame`` called after the reset and after each step; each
    agent's return. An agent whose result is None waits (its turn, or it left the episode);
    the episode ends when every agent that has a result is done, as actors play it."""
    last = list(env.reset())
    states: list[Any] = [None] * len(seats)
    totals = [0.0] * len(seats)
    frame()
    while True:
        live = [r for r in last if r is not None]
        if not live:
            raise UserError("the environment gave no agent a result: none acts on this step")
        if all(r.done or r.truncated for r in live):
            return totals
        actions: list[Any] = [None] * len(seats)
        for agent, result in enumerate(last):
            if result is not None and not (result.done or result.truncated):
                actions[agent], states[agent] = seats[agent].act(result.obs, states[agent])
        last = list(env.step(actions))
        for agent, result in enumerate(last):
            if result is not None:
                totals[agent] += float(np.asarray(result.reward).reshape(-1)[0])
        frame()


def _returns(seats: list[LoadedPolicy], totals: list[float]) -> Any:
    """An episode's return as ``troupe eval`` counts it: the mean over the agents of its
    policy, or, where several policies play, each one's."""
    by_policy: dict[str, list[float]] = {}
    for seat, total in zip(seats, totals, strict=True):
        by_policy.setdefault(seat.name, []).append(total)
    means = {name: round(float(np.mean(got)), 3) for name, got in by_policy.items()}
    return next(iter(means.values())) if len(means) == 1 else means


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


def _render_kwargs(name: str) -> dict[str, Any]:
    """The arguments that make environment ``name`` draw frames: its class's
    ``render_kwargs`` (``render_mode="rgb_array"`` for a gymnasium or PettingZoo one, which
    draw only when made to; an environment of one's own may declare its own), else none."""
    from api import registry

    factory = registry.environments.spec(name).load()
    return dict(getattr(factory, "render_kwargs", None) or {})


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
