"""Atari games (``ale-py``) with the standard DeepMind preprocessing, done in the actor process.

Registered as ``Atari-v0``; pick the game with ``game="Pong"`` (any ALE game: ``Breakout``,
``SpaceInvaders``, ...). Needs the ``atari`` extra: ``pip install 'troupe-rl[atari]'`` (ale-py
ships the ROMs; opencv resizes the frames).

What one :meth:`AtariEnvironment.step` does, and why here: the observation that leaves the actor
is already the small one the network reads, so the wire and the policy worker never see a
210x160 frame, and every buffer stays uint8 (4 times smaller than float32) until the model
scales it by 1/255.

* **frame skip**: the action is repeated for ``frame_skip`` emulator frames (rewards summed);
* **max-pool**: the observation is the pixel-wise max of the last two of those frames (some
  games draw sprites on alternate frames only);
* **84x84 grayscale**: the emulator's own grayscale screen (no RGB conversion), resized.
  ``area`` interpolation by default, as the common DQN/PPO preprocessing does (OpenCV's
  ``INTER_AREA``), computed by :class:`AreaResize`: the same weights in two small matrix
  products, 19 us a frame against OpenCV's 46-55 us on the project's 2-core VM. On the 16-core
  GPU machine OpenCV's resize was 13% of an actor's time (py-spy, BENCHMARKS.md, issue 23).
  ``linear`` (OpenCV's ``INTER_LINEAR``) is cheaper still but samples rather than averages
  (thin sprites fade). Pillow's bilinear resize alone took longer than a whole step, hence
  OpenCV;
* **frame stack**: the last ``frame_stack`` preprocessed frames, stacked **channel first**:
  ``obs.shape == (frame_stack, 84, 84)``, dtype uint8. Channel first because that is the layout a
  convolution reads (no transpose in the model), and because pushing a frame into the stack then
  moves whole contiguous 84x84 planes;
* **no-op reset**: a new game starts with 1 to ``noop_max`` emulator frames of NOOP, so that
  episodes do not all start from the same state;
* **fire reset**: in games whose action 1 is FIRE (Breakout, ...), ``reset`` presses it, as the
  game does not start (or go on after a lost life) until it is pressed; without episodic life,
  so does the step that loses a life;
* **episodic life** (training): losing a life ends the episode (``done=True``, no bootstrapping
  across it), but the game goes on: the following ``reset`` continues it without restarting;
* **reward clipping** (training): rewards are reported as their sign (-1, 0, +1);
* **sticky actions**: with ``repeat_action_probability`` the emulator repeats the previous
  action instead of the new one on each frame (0.25 is the ALE v5 protocol; 0, the default, is
  the ``NoFrameskip-v4`` protocol most published PPO numbers use).

Episode returns seen by the runtime are therefore per life and clipped. The real game score is
in the ``info`` of the step that ends a game: ``game_return`` (unclipped, summed over every life)
and ``game_frames`` (emulator frames, no-ops included). The Atari recipes' greedy evaluation
turns both off (``evaluation.env_args``): its episodes are whole games, its returns their scores.

Frames: one ``step`` is one agent step of ``frame_skip`` emulator frames;
:attr:`AtariEnvironment.frames_per_step` says how many, for code that counts emulator frames.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

import gymnasium as gym
import numpy as np

from api.environment import Environment, StepResult
from api.errors import UserError
from legacy.environment.gym_adapter import quiet_ale

NAME = "Atari-v0"
INTERPOLATIONS = ("area", "linear")
_INSTALL = "pip install 'troupe-rl[atari]' (a worker image: troupe image build --extras atari)"


def _import_atari_packages():
    """``ale_py`` and ``cv2``, with an error that says how to install them."""
    try:
        import ale_py
        import cv2
    except ImportError as e:
        raise UserError(f"{NAME} needs ale-py and opencv ({e}); install them: {_INSTALL}") from e
    quiet_ale(ale_py)
    return ale_py, cv2


def ale_id(game: str) -> str:
    """The gymnasium id of ``game`` (``"Pong"``, ``"pong"`` or ``"ALE/Pong-v5"``).

    Raises UserError naming the closest game when there is no such game.
    """
    ale_py, _ = _import_atari_packages()
    gym.register_envs(ale_py)
    games = {i[len("ALE/") : -len("-v5")]: i for i in gym.registry if _is_v5(i)}
    by_lower = {g.lower(): i for g, i in games.items()}
    name = game[len("ALE/") : -len("-v5")] if _is_v5(game) else game
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    close = difflib.get_close_matches(name, list(games), n=1, cutoff=0.5)
    hint = f"did you mean '{close[0]}'?" if close else f"{len(games)} games, e.g. Pong, Breakout"
    raise UserError(f"{NAME}: game={game!r} is not an ALE game; {hint}")


def _is_v5(gym_id: str) -> bool:
    return gym_id.startswith("ALE/") and gym_id.endswith("-v5") and "-ram" not in gym_id


class AtariEnvironment(Environment):
    """One Atari game, preprocessed (see the module docstring), as a one-agent environment.

    Args:
        game: the ALE game, e.g. ``"Pong"`` or ``"Breakout"``.
        frame_skip: emulator frames per agent step (the action is repeated).
        noop_max: a new game starts with 1 to ``noop_max`` frames of NOOP (0: none).
        screen_size: side of the square grayscale observation, in pixels.
        frame_stack: observations stacked along the first axis.
        episodic_life: a lost life ends the episode (the game goes on at the next ``reset``).
        clip_rewards: rewards reported as their sign; ``info["game_return"]`` keeps the score.
        repeat_action_probability: sticky actions, per emulator frame (ALE v5 uses 0.25).
        fire_on_reset: press FIRE after a reset in games that need it to start.
        full_action_space: all 18 joystick actions instead of the game's minimal set.
        max_episode_frames: a game is truncated after this many emulator frames (30 minutes of
            play at 60 Hz by default); 0 for no limit.
        interpolation: ``"area"`` or ``"linear"`` resizing of the 210x160 screen.
    """

    def __init__(
        self,
        game: str = "Pong",
        frame_skip: int = 4,
        noop_max: int = 30,
        screen_size: int = 84,
        frame_stack: int = 4,
        episodic_life: bool = True,
        clip_rewards: bool = True,
        repeat_action_probability: float = 0.0,
        fire_on_reset: bool = True,
        full_action_space: bool = False,
        max_episode_frames: int = 108_000,
        interpolation: str = "area",
    ):
        _check_args(locals())
        _, cv2 = _import_atari_packages()
        cv2.setNumThreads(1)  # one small resize per step: a thread pool only costs wake-ups
        self._cv2 = cv2
        self._interpolation = cv2.INTER_AREA if interpolation == "area" else cv2.INTER_LINEAR
        self.game, self.frame_skip, self.noop_max = game, int(frame_skip), int(noop_max)
        self.episodic_life, self.clip_rewards = bool(episodic_life), bool(clip_rewards)
        self.gym_id = ale_id(game)
        self._env = gym.make(
            self.gym_id,
            frameskip=1,  # skipping and max-pooling are done here, on the raw frames
            repeat_action_probability=float(repeat_action_probability),
            full_action_space=bool(full_action_space),
            max_num_frames_per_episode=int(max_episode_frames) or None,
            obs_type="grayscale",
        )
        # Stepped through the emulator itself: a gymnasium step per frame (wrappers, info dict,
        # a copy of the screen) costs more than the emulation. The calls are those of the ALE
        # environment's own step().
        self._ale = self._env.unwrapped.ale
        self._actions = self._env.unwrapped._action_set
        meanings = self._env.unwrapped.get_action_meanings()
        self._fire = fire_on_reset and len(meanings) >= 3 and meanings[1] == "FIRE"
        height, width = self._ale.getScreenDims()
        self._pool = np.zeros((min(2, self.frame_skip), height, width), dtype=np.uint8)
        self._pooled = np.empty((height, width), dtype=np.uint8)
        self._stack = np.zeros((frame_stack, screen_size, screen_size), dtype=np.uint8)
        self._area = None
        if interpolation == "area" and screen_size <= min(height, width):
            self._area = AreaResize((height, width), (screen_size, screen_size))
        self._observation_space = gym.spaces.Box(0, 255, self._stack.shape, np.uint8)
        self._action_space = gym.spaces.Discrete(len(self._actions))
        self._rng = np.random.default_rng()
        self._next_seed: int | None = None
        self._game_over = True  # the first reset starts a game
        self._episode_over = True
        self._lives = 0
        self._game_return = 0.0
        self._game_frames = 0

    @property
    def agent_count(self) -> int:
        return 1

    @property
    def observation_spaces(self) -> list[gym.Space]:
        return [self._observation_space]

    @property
    def action_spaces(self) -> list[gym.Space]:
        return [self._action_space]

    @property
    def frames_per_step(self) -> int:
        """Emulator frames in one agent step (``frame_skip``)."""
        return self.frame_skip

    def seed(self, seed: int) -> None:
        """The next ``reset`` starts a new game from this seed (emulator, sticky actions and
        no-op count); also seeds action sampling."""
        self._next_seed = int(seed)
        self._rng = np.random.default_rng(int(seed))
        self._action_space.seed(int(seed))

    def reset(self) -> list[StepResult | None]:
        if self._game_over or self._next_seed is not None:
            self._new_game()
        # After a lost life (episodic_life) the game simply goes on from where it is.
        if self._fire:
            self._act(1)
            self._act(2)  # some games want the joystick to move off FIRE before serving
        if self._game_over:  # a game lost during the reset presses: start another one
            return self.reset()
        self._grab_screen(0)
        self._stack[:] = self._resize(self._pool[0])
        self._episode_over = False
        return [StepResult(obs=self._stack.copy())]

    def _new_game(self) -> None:
        self._env.reset(seed=self._next_seed)
        self._next_seed = None
        self._game_over = False
        self._game_return, self._game_frames = 0.0, 0
        for _ in range(self._rng.integers(1, self.noop_max + 1) if self.noop_max else 0):
            self._act(0)
            if self._game_over:
                self._env.reset()
                self._game_over = False
        self._lives = self._ale.lives()

    def step(self, actions: list[Any]) -> list[StepResult | None]:
        if len(actions) != 1:
            raise ValueError(
                f"{NAME} has one agent, so step() takes a list of one action; got {len(actions)}"
            )
        if self._episode_over:
            raise UserError(
                f"{NAME} ({self.game}): step() called but no episode is running (it ended, or "
                "reset() was never called); call reset() to start a new episode"
            )
        reward = self._skip(int(actions[0]))
        ale = self._ale
        lives = ale.lives()
        lost = 0 < lives < self._lives
        if lost and self._fire and not self.episodic_life and not self._game_over:
            reward += self._serve()
        # game_over() (checked each frame) is terminal or truncated: ask which only when it is
        terminated = self._game_over and ale.game_over(with_truncation=False)
        truncated = self._game_over and not terminated
        life_lost = self.episodic_life and lost
        self._lives = lives
        stack = self._stack
        stack[:-1] = stack[1:]
        np.maximum(self._pool[0], self._pool[-1], out=self._pooled)
        stack[-1] = self._resize(self._pooled)
        done = terminated or life_lost
        self._episode_over = done or truncated
        info: dict[str, Any] = {}
        if self._game_over:
            info = {"game_return": self._game_return, "game_frames": self._game_frames}
        elif life_lost:
            info = {"lives": lives}
        if self.clip_rewards:
            reward = float((reward > 0) - (reward < 0))
        return [StepResult(stack.copy(), reward, done, truncated, info)]

    def _skip(self, action: int) -> float:
        """Repeat ``action`` for ``frame_skip`` frames, keeping the last two screens in the pool.

        The hottest loop of an Atari actor (the emulator aside): what :meth:`_act` does for one
        frame, inlined, with the score and frame count added once a step."""
        ale, code, pool = self._ale, self._actions[action], self._pool
        first_kept = self.frame_skip - len(pool)
        reward, frames = 0, 0
        for i in range(self.frame_skip):
            reward += ale.act(code, 1.0)
            frames += 1
            if ale.game_over():  # terminal or truncated
                # the game ended mid-skip: its last screen is the observation, twice
                self._game_over = True
                ale.getScreenGrayscale(pool[-1])
                pool[0] = pool[-1]
                break
            if i >= first_kept:
                ale.getScreenGrayscale(pool[i - first_kept])
        self._game_return += reward
        self._game_frames += frames
        return float(reward)

    def _serve(self) -> float:
        """A lost life where the episode goes on (``episodic_life=False``, as evaluation plays
        whole games): press FIRE as the ``reset`` after one does in training, else a game that
        waits for it (Breakout) waits until ``max_episode_frames``, and greedy evaluation
        with it. The observation is the screen after the presses."""
        reward = self._act(1) + self._act(2)
        self._ale.getScreenGrayscale(self._pool[-1])
        self._pool[0][:] = self._pool[-1]
        return reward

    def _act(self, action: int) -> float:
        """One emulator frame; keeps the unclipped score, the frame count and the game-over
        flag up to date."""
        reward = float(self._ale.act(self._actions[action], 1.0))
        self._game_return += reward
        self._game_frames += 1
        self._game_over = self._ale.game_over()  # terminal or truncated
        return reward

    def _grab_screen(self, slot: int) -> None:
        self._ale.getScreenGrayscale(self._pool[slot])

    def _resize(self, frame: np.ndarray) -> np.ndarray:
        if self._area is not None:
            return self._area(frame)
        size = self._stack.shape[1:]
        return self._cv2.resize(frame, size[::-1], interpolation=self._interpolation)

    def render(self) -> np.ndarray:
        """The current emulator screen in colour, ``[210, 160, 3]`` uint8."""
        return self._ale.getScreenRGB()

    def close(self) -> None:
        self._env.close()


class AreaResize:
    """OpenCV's ``INTER_AREA`` downscaling of a 2-D uint8 image, in two small matrix products.

    Each output pixel is the mean of the input area it covers, input pixels cut at its border
    counted by the fraction inside: a weight matrix per axis, applied one axis after the other.
    The weights repeat every ``n_in / gcd(n_in, n_out)`` input pixels (every 5 rows and 40
    columns for 210x160 -> 84x84), so each axis is one product with a block of them: a few
    hundred thousand multiply-adds, where OpenCV's general path for a non-integer ratio walks
    the pixels one by one. Rounded half to even, as OpenCV rounds; summed in another order, so
    a sum that lands within float rounding of .5 may come out one grey level apart (a handful
    of pixels of a random image; none in 2,000 Pong frames checked by hand; the test checks 300).
    """

    def __init__(self, size_in: tuple[int, int], size_out: tuple[int, int]):
        (h_in, w_in), (h_out, w_out) = size_in, size_out
        if not (0 < h_out <= h_in and 0 < w_out <= w_in):
            raise ValueError(f"AreaResize downscales only: {size_in} -> {size_out}")
        self.size_in, self.size_out = (h_in, w_in), (h_out, w_out)
        self._rows = _area_block(h_in, h_out)  # (out, in) of one block of rows
        self._cols = np.ascontiguousarray(_area_block(w_in, w_out).T)  # (in, out), columns

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        (h_in, w_in), (h_out, w_out) = self.size_in, self.size_out
        rows_in = self._rows.shape[1]
        # rows: blocks of rows_in input rows -> rows_out output rows, every column at once
        x = frame.astype(np.float32).reshape(h_in // rows_in, rows_in, w_in)
        x = np.matmul(self._rows, x).reshape(h_out, w_in)
        # columns: every output row's blocks of cols_in input columns -> cols_out
        x = (x.reshape(-1, self._cols.shape[0]) @ self._cols).reshape(h_out, w_out)
        return np.rint(x, out=x).astype(np.uint8)


def _area_block(n_in: int, n_out: int) -> np.ndarray:
    """The area weights of one repeating block along an axis of ``n_in`` -> ``n_out`` pixels:
    ``[n_out / g, n_in / g]`` for ``g = gcd(n_in, n_out)``, float32."""
    g = math.gcd(n_in, n_out)
    block_in, block_out = n_in // g, n_out // g
    scale = n_in / n_out
    weights = np.zeros((block_out, block_in))
    for i in range(block_out):
        start, end = i * scale, (i + 1) * scale
        for j in range(int(start), min(block_in, math.ceil(end))):
            weights[i, j] = max(0.0, min(end, j + 1) - max(start, j)) / scale
    return weights.astype(np.float32)


def _check_args(args: dict[str, Any]) -> None:
    """Every bad argument in one UserError naming the argument and its allowed values."""
    errors = []
    for name in ("frame_skip", "screen_size", "frame_stack"):
        if not isinstance(args[name], int) or args[name] < 1:
            errors.append(f"{name} must be an int of 1 or more, got {args[name]!r}")
    for name in ("noop_max", "max_episode_frames"):
        if not isinstance(args[name], int) or args[name] < 0:
            errors.append(f"{name} must be an int of 0 or more, got {args[name]!r}")
    p = args["repeat_action_probability"]
    if not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        errors.append(f"repeat_action_probability must be in [0, 1), got {p!r}")
    if args["interpolation"] not in INTERPOLATIONS:
        got = args["interpolation"]
        errors.append(f"interpolation must be one of {INTERPOLATIONS}, got {got!r}")
    if not isinstance(args["game"], str) or not args["game"]:
        errors.append(f"game must be an ALE game name such as 'Pong', got {args['game']!r}")
    if errors:
        raise UserError(f"{NAME}: " + "; ".join(errors))
