"""When is a run solved: the greedy evaluation mean, confirmed on fresh episodes of one version.

One window of ``evaluation.episodes`` greedy episodes can reach a target by luck (a run marked
solved once re-evaluated at 365.7 of 475), and a window plays whatever versions the policy
workers had while it lasted, so the version a run ends with may not be one that reached it. So
the first window that reaches the target only makes the run a candidate. The controller then asks
the judged policy's workers to *hold* (global state key :data:`HOLD_KEY`): evaluation requests
are answered by the version they had loaded at that moment (training goes on with the newest),
and the run is solved once ``stop.confirm_windows - 1`` further windows, of episodes played by
that one version from start to end, reached the target too. That version is the one the run
delivers (``summary.json``'s ``solved_version``, what ``troupe eval`` plays). A window that falls
short releases the hold; the next candidate is a window of episodes that finished after it.
:class:`EvaluationHold` is the policy worker's side, run on its heartbeat.

Where no worker can hold (it reports so, or reports nothing for ``hold_timeout_s``), the
confirmation falls back to consecutive windows of whatever versions played them.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from api.config import ExperimentConfig
from api.global_state import GlobalState

logger = logging.getLogger(__name__)

HOLD_KEY = "evaluation/hold"
"""Global state: ``{"policy": name, "round": n}`` while a version is held for confirmation,
None otherwise."""
HOLD_TIMEOUT_S = 30.0
"""How long a hold may go without a report of the held version or a new episode played by it."""


def judged_policy(config: ExperimentConfig) -> str | None:
    """The policy whose version a confirmation holds: ``evaluation.policy``, or the run's only
    trained policy; None when neither names one (several policies share the return)."""
    if config.evaluation.policy:
        return config.evaluation.policy
    trained = [name for name, pc in config.policies.items() if pc.trainer.type]
    return trained[0] if len(trained) == 1 else None


class EvaluationWindows:
    """Greedy evaluation returns as they arrive, and the confirmation of a target.

    ``policy``: the judged policy (None: no holding, consecutive windows confirm). With one
    window (no confirmation asked for) nothing is held.
    """

    def __init__(
        self,
        target: float | None,
        episodes: int,
        windows: int = 1,
        *,
        policy: str | None = None,
        hold_timeout_s: float = HOLD_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.target = target
        self.episodes = episodes
        self.windows = windows
        self.policy = policy if windows > 1 else None
        self.hold_timeout_s = hold_timeout_s
        self.clock = clock
        self.returns: deque[float] = deque(maxlen=episodes)
        self.count = 0
        self.confirmed: list[float] = []
        """Means of the windows that reached the target so far (the held version's)."""
        self.round = 0
        """Holds asked for so far; the current one while :attr:`holding`."""
        self.holding = False
        self.held_version: int | None = None
        self.solved_version: int | None = None
        self._held: list[float] = []
        self._progress = 0.0
        self._window_end = 0

    # ----------------------------------------------------------------- input
    def add(self, episode_return: float, versions: Any = None) -> None:
        """One greedy episode; ``versions``: ``[first, last]`` version of the judged policy
        that played it (as actors report; anything else counts as unknown)."""
        self.returns.append(float(episode_return))
        self.count += 1
        if self.holding and self.held_version is not None and _played_by(versions) == (
            self.held_version
        ):
            self._held.append(float(episode_return))
            self._progress = self.clock()

    def on_worker_stats(self, stats: dict[str, Any]) -> None:
        """A judged policy worker's heartbeat stats: the version it holds, or that it can't."""
        if not self.holding:
            return
        if stats.get("hold_unsupported"):
            self._give_up_holding("a policy worker cannot hold a version")
        elif stats.get("held_round") == self.round and self.held_version is None:
            version = stats.get("held_version")
            if isinstance(version, int) and not isinstance(version, bool):
                self.held_version = version
                self._progress = self.clock()

    def hold_order(self) -> dict[str, Any] | None:
        """What :data:`HOLD_KEY` should say now."""
        return {"policy": self.policy, "round": self.round} if self.holding else None

    # ----------------------------------------------------------------- decision
    def mean(self) -> float | None:
        """The mean of the last ``episodes`` returns, once that many arrived."""
        if len(self.returns) < self.episodes:
            return None
        return float(np.mean(self.returns))

    def solved(self) -> bool:
        """Whether the target is confirmed (call after adding)."""
        if self.target is None:
            return False
        if self.holding:
            return self._confirm_held()
        mean = self.mean()
        if mean is None or self.count < self._window_end:
            return False
        if self.policy is not None:
            if mean >= self.target:
                self._start_hold(mean)
            return False
        return self._confirm_consecutive(mean)

    def _confirm_consecutive(self, mean: float) -> bool:
        if mean >= self.target:
            self.confirmed.append(mean)
            self._window_end = self.count + self.episodes  # the next window: fresh episodes
        elif self.confirmed:
            logger.info("evaluation mean %.1f did not confirm %s", mean, self.confirmed)
            self.confirmed = []
        return len(self.confirmed) >= self.windows

    def _start_hold(self, mean: float) -> None:
        self.round += 1
        self.holding, self.held_version, self._held = True, None, []
        self.confirmed = [mean]
        self._window_end = self.count + self.episodes  # for confirming without a hold
        self._progress = self.clock()
        logger.info(
            "evaluation mean %.1f reached %g: holding policy '%s' for %d window%s of %d",
            mean, self.target, self.policy, self.windows, "s" * (self.windows > 1), self.episodes,
        )  # fmt: skip

    def _confirm_held(self) -> bool:
        while len(self._held) >= self.episodes:
            window, self._held = self._held[: self.episodes], self._held[self.episodes :]
            mean = float(np.mean(window))
            if mean < self.target:
                logger.info(
                    "version %s scored %.1f: not confirmed %s", self.held_version, mean,
                    self.confirmed,
                )  # fmt: skip
                self._release()
                return False
            self.confirmed.append(mean)
            if len(self.confirmed) >= self.windows:  # the candidate's and the held ones
                self.solved_version = self.held_version
                return True
        if self.clock() - self._progress > self.hold_timeout_s:
            if self.held_version is None:
                self._give_up_holding(f"no policy worker held a version in {self.hold_timeout_s}s")
            else:
                logger.warning("no episode of held version %s came for %.0fs: released",
                               self.held_version, self.hold_timeout_s)  # fmt: skip
                self._release()
        return False

    def _release(self) -> None:
        self.holding, self.held_version, self._held = False, None, []
        self.confirmed = []
        self._window_end = self.count + self.episodes

    def _give_up_holding(self, why: str) -> None:
        """Go on as if nothing had been held: the candidate stands, and the next window of
        fresh episodes (whichever versions played them) confirms it or not."""
        logger.warning("%s: confirming on consecutive windows of any versions instead", why)
        self.holding, self.held_version, self._held = False, None, []
        self.policy = None

    def describe(self) -> str:
        """How a solved run was confirmed, for its summary."""
        means = ", ".join(f"{m:.1f}" for m in self.confirmed)
        if self.solved_version is not None:
            held = len(self.confirmed) - 1
            return (
                f"greedy mean return reached {self.target:g} in a window of {self.episodes} "
                f"episodes, then in {held} window{'s' * (held > 1)} of {self.episodes} fresh "
                f"episodes played by version {self.solved_version} alone: {means}"
            )
        n = len(self.confirmed)
        return (
            f"greedy mean return reached {self.target:g} in {n} consecutive "
            f"window{'s' if n > 1 else ''} of {self.episodes} fresh episodes: {means}"
        )


def _played_by(versions: Any) -> int | None:
    """The one version that played a whole episode, from an actor's ``[first, last]``."""
    if (
        isinstance(versions, (list, tuple))
        and len(versions) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in versions)
        and versions[0] == versions[1]
    ):
        return versions[0]
    return None


class EvaluationHold:
    """In a policy worker of the judged policy: follow :data:`HOLD_KEY` (on its heartbeat)."""

    def __init__(self, state: GlobalState, worker: Any):
        self.state = state
        self.worker = worker
        self.round = 0

    def __call__(self) -> None:
        value, _ = self.state.get(HOLD_KEY)
        order = value if isinstance(value, dict) else None
        if order is None or order.get("policy") != self.worker.policy_name:
            if self.worker.held is not None:
                self.worker.release()
            self.round = 0
            return
        round_ = order.get("round")
        if isinstance(round_, int) and round_ != self.round:
            self.round = round_
            self.worker.hold_evaluation(round_)
