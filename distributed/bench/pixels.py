"""Pixels: the Atari emulator's own speed in one process, and what an observation costs on the wire.

These are the ceilings an end-to-end Pong run is compared with (``troupe bench pixels``):

* :func:`raw_rate`: ALE through gymnasium at ``frameskip=4`` with random actions and RGB frames,
  no preprocessing: what the emulator gives anyone who steps it;
* :func:`preprocessed_rate`: ``Atari-v0`` (the built-in Atari environment, from the registry),
  the same frame skip plus max-pool, 84x84 grayscale, frame stack 4, no-op and fire resets,
  episodic life and reward clipping, exactly as an actor worker steps it;
* :func:`distributed.bench.pixel_ceiling.parallel_rate`: either loop in one process per core at
  once, the machine's ceiling;
* :func:`wire_bytes`: bytes per observation in the messages an actor sends, encoded by the
  runtime's own wire codec.

Frames are **emulator frames**: agent steps x ``frame_skip`` (the frames of no-op and fire
resets are not counted). Each rate is also given per CPU second of the measuring process, the
figure to trust on a shared machine, where the wall-clock rate depends on who else runs.

Run it alone with ``python -m distributed.bench.pixels --seconds 10``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

DEFAULT_GAME = "Pong"
FRAME_SKIP = 4


@dataclass
class EmulatorRate:
    """How fast one process stepped the game."""

    name: str
    """``raw`` (ALE, no preprocessing) or ``preprocessed`` (``Atari-v0``)."""
    game: str
    """The ALE game."""
    frame_skip: int
    """Emulator frames per agent step."""
    agent_steps: int
    """Agent steps taken (random actions)."""
    wall_s: float
    """Wall-clock seconds the steps took."""
    cpu_s: float
    """CPU seconds this process used meanwhile."""

    @property
    def frames(self) -> int:
        """Emulator frames: agent steps x frame skip."""
        return self.agent_steps * self.frame_skip

    @property
    def frames_per_s(self) -> float:
        return self.frames / max(self.wall_s, 1e-9)

    @property
    def frames_per_cpu_s(self) -> float:
        return self.frames / max(self.cpu_s, 1e-9)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "frames": self.frames,
            "frames_per_s": self.frames_per_s,
            "frames_per_cpu_s": self.frames_per_cpu_s,
        }


def _run_for(
    name, game, seconds, step, reset, n_actions, seed, ready=None, frame_skip=FRAME_SKIP
) -> EmulatorRate:
    """Step random actions for ``seconds`` (checking the clock every 64 steps). ``ready``, if
    given, is called once everything is built and returns when the window starts (so that
    processes started together measure the same window)."""
    rng = np.random.default_rng(seed)
    actions = rng.integers(n_actions, size=4096)
    reset()
    if ready is not None:
        ready()
    steps = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    deadline = wall0 + seconds
    while True:
        for _ in range(64):
            if step(int(actions[steps % len(actions)])):
                reset()
            steps += 1
        if time.perf_counter() >= deadline:
            break
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return EmulatorRate(name, game, frame_skip, steps, wall, cpu)


def raw_rate(
    game: str = DEFAULT_GAME, seconds: float = 5.0, seed: int = 0, ready=None
) -> EmulatorRate:
    """ALE's own ``step`` at ``frameskip=4``, RGB frames, no sticky actions, no preprocessing."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = gym.make(f"ALE/{game}-v5", frameskip=FRAME_SKIP, repeat_action_probability=0.0)
    try:
        env.reset(seed=seed)

        def step(action: int) -> bool:
            _, _, terminated, truncated, _ = env.step(action)
            return terminated or truncated

        n_actions = env.action_space.n
        return _run_for("raw", game, seconds, step, env.reset, n_actions, seed, ready)
    finally:
        env.close()


def preprocessed_rate(
    game: str = DEFAULT_GAME,
    seconds: float = 5.0,
    seed: int = 0,
    envs: int = 1,
    ready=None,
    **env_kwargs: Any,
) -> EmulatorRate:
    """``Atari-v0`` as an actor steps it (``env_kwargs`` override its defaults): ``envs``
    environments in turn, one step each, as an actor's ring of environments."""
    from api import environment  # the built-in Atari-v0, found through the registry

    kwargs = {"game": game, "frame_skip": FRAME_SKIP, **env_kwargs}
    ring = [environment.make("Atari-v0", **kwargs) for _ in range(max(1, envs))]
    for i, env in enumerate(ring):
        env.seed(seed * 1000 + i)
    turn = [0]

    def step(action: int) -> bool:
        env = ring[turn[0]]
        turn[0] = (turn[0] + 1) % len(ring)
        result = env.step([action])[0]
        if result.done or result.truncated:
            env.reset()
        return False

    def reset() -> None:
        for env in ring:
            env.reset()

    try:
        n_actions, skip = ring[0].action_spaces[0].n, ring[0].frames_per_step
        return _run_for("preprocessed", game, seconds, step, reset, n_actions, seed, ready, skip)
    finally:
        for env in ring:
            env.close()


@dataclass
class WireBytes:
    """Bytes per observation in the two messages that carry observations."""

    obs_bytes: int
    """One stacked observation's array: ``frame_stack x 84 x 84`` uint8."""
    new_frame_bytes: int
    """The part of it that is new at each step: one 84x84 frame (the rest is the stack)."""
    inference_per_obs: float
    """An actor's ``rollout`` request for ``batch`` environments, all frames, per observation."""
    samples_per_step: float
    """An actor's ``samples`` message (a ``[T + 1, batch]`` segment with actions, log-probs,
    values, rewards and flags), all frames, per trained step (``T x batch``)."""
    batch: int
    segment_length: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def wire_bytes(game: str = DEFAULT_GAME, batch: int = 8, segment_length: int = 128) -> WireBytes:
    """Encode real Pong observations the way an actor does and count the bytes of every frame.

    The trained steps of a segment exclude its bootstrap step, which is also the first step of
    the next segment: that overlap is part of the cost, so it is counted.
    """
    from api import environment
    from api.namedarray import NamedArray
    from api.policy import RolloutRequest, SampleBatch
    from system.streams import wire

    env = environment.make("Atari-v0", game=game)
    env.seed(0)
    frames = [env.reset()[0].obs]
    for _ in range(segment_length):
        result = env.step([env.action_spaces[0].sample()])[0]
        frames.append(result.obs if not (result.done or result.truncated) else env.reset()[0].obs)
    env.close()
    obs = np.stack(frames)  # [T + 1, ...]
    column = np.zeros((batch, 1))
    request = RolloutRequest(
        obs=np.stack([obs[0]] * batch),
        on_reset=column.astype(bool),
        is_evaluation=column.astype(bool),
        client_id=np.arange(batch).reshape(-1, 1),
        request_id=column.astype(np.int64),
    )
    inference = wire.encode("rollout", {"group": 0, "seq": 0, "request": request})
    steps = (segment_length + 1, batch, 1)
    segment = SampleBatch(
        obs=np.stack([obs] * batch, axis=1),
        action=np.zeros(steps[:2], dtype=np.int64),
        policy_output=NamedArray(
            log_prob=np.zeros(steps, np.float32), value=np.zeros(steps, np.float32)
        ),
        reward=np.zeros(steps, np.float32),
        done=np.zeros(steps, bool),
        truncated=np.zeros(steps, bool),
        on_reset=np.zeros(steps, bool),
        policy_version=np.zeros(steps, np.int64),
    )
    samples = wire.encode("samples", {"segment": segment})
    return WireBytes(
        obs_bytes=int(obs[0].nbytes),
        new_frame_bytes=int(obs[0][-1].nbytes),
        inference_per_obs=_total(inference) / batch,
        samples_per_step=_total(samples) / (segment_length * batch),
        batch=batch,
        segment_length=segment_length,
    )


def _total(frames: list[Any]) -> int:
    return sum(memoryview(f).nbytes for f in frames)


def measure(game: str = DEFAULT_GAME, seconds: float = 5.0) -> dict[str, Any]:
    """Every pixel figure, as a JSON-ready dict: raw and preprocessed rates, their ratio, bytes."""
    raw = raw_rate(game, seconds)
    pre = preprocessed_rate(game, seconds)
    return {
        "raw": raw.to_dict(),
        "preprocessed": pre.to_dict(),
        "preprocessed_over_raw_cpu": pre.frames_per_cpu_s / raw.frames_per_cpu_s,
        "wire": wire_bytes(game).to_dict(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--game", default=DEFAULT_GAME, help="ALE game (default: Pong)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per rate")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.game, args.seconds), indent=2))


if __name__ == "__main__":
    main()
