"""When is a run solved: greedy evaluation windows, each played by one version, confirmed.

One window of ``evaluation.episodes`` greedy episodes can reach a target by luck (a run marked
solved once re-evaluated at 365.7 of 475), and a window of episodes played by whatever versions
the policy workers had while it lasted does not say which version reached it: in self-play the
learner drifts from version to version (one beats a fixed opponent, the next loses to it), so a
run could end on a version that never reached the target.

So the judged policy's workers *hold* a version for evaluation (the global state's ``HOLD_KEY``,
:mod:`system.run.coordination.evaluation_hold`; one *round* per version): evaluation requests
are answered by that version while training goes on with the newest, and a window counts only
episodes that version played from start to end. A window that reaches the target makes its
version a candidate; the run is solved when ``stop.confirm_windows - 1`` further windows of
fresh episodes of that same version reach it too. That version is the one the run delivers
(``summary.json``'s ``solved_version``, what ``troupe eval`` plays). A window that falls short
ends the round: the next round holds the newest version its trainer reported (or, where the
parameter service let that one go, the version a worker has loaded), and the next window judges
it. With
``stop.max_return`` (the most an episode can return) a window falls short as soon as the
episodes still to come could not lift it to the target: most versions a long run judges fail,
and most fail early, so judging each on a few games instead of a whole window judges several
times as many versions in the same time.
:class:`system.run.coordination.evaluation_hold.EvaluationHold` is the policy worker's side, run
on its heartbeat.

Where no worker can hold (it says so, or says nothing for ``hold_timeout_s``), or a target needs
no confirmation, windows of whatever versions played them are judged as they come, and
``confirm_windows`` consecutive ones must reach the target.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from api.config import ExperimentConfig
from system.eval_quota import QuotaWindow, per_env_quota

logger = logging.getLogger(__name__)

HOLD_TIMEOUT_S = 30.0
"""How long a round may go without a report of the held version (then nothing is held)."""
STALE_EPISODES = 50
"""A round ends when at least this many (and three windows') evaluation episodes in a row were
played by other versions: the held one is not being played (a worker could not hold it). A
count, not a time: an episode may take minutes (Atari)."""


def judged_policy(config: ExperimentConfig) -> str | None:
    """The policy whose versions evaluation judges: ``evaluation.policy``, or the run's only
    trained policy; None when neither names one (several policies share the return)."""
    if config.evaluation.policy:
        return config.evaluation.policy
    trained = [name for name, pc in config.policies.items() if pc.trainer.type]
    return trained[0] if len(trained) == 1 else None


class EvaluationWindows:
    """Greedy evaluation returns as they arrive, and the confirmation of a target.

    ``policy``: the judged policy, whose workers hold a version per window (None, or a target
    that needs no confirmation: nothing is held, consecutive windows confirm). ``max_return``:
    the most an episode can return; a held version's window that can no longer reach the
    target ends early (None: windows are played out).
    """

    def __init__(
        self,
        target: float | None,
        episodes: int,
        windows: int = 1,
        *,
        policy: str | None = None,
        max_return: float | None = None,
        envs: int | None = None,
        hold_timeout_s: float = HOLD_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        """``envs``: the evaluation environments of the run; a window is then each one's
        first ``ceil(episodes / envs)`` episodes begun after it opened (system.eval_quota:
        no bias for short episodes). None: the first ``episodes`` to finish, whatever
        environment played them. ``wall``: the clock episodes' ``started_at`` is read on."""
        self.target = target
        self.max_return = max_return
        self.episodes = episodes
        self.envs = envs
        self.per_env = per_env_quota(episodes, envs) if envs else episodes
        self.wall = wall
        self.windows = windows
        self.policy = policy if windows > 1 and target is not None else None
        self.hold_timeout_s = hold_timeout_s
        self.clock = clock
        self.returns: deque[float] = deque(maxlen=episodes)
        """The last episodes of any version: the evaluation return the metrics report."""
        self.count = 0
        self.confirmed: list[float] = []
        """Means of the windows that reached the target so far (the held version's)."""
        self.round = 0
        """Versions held so far; the current round while :attr:`policy` is set."""
        self.held_version: int | None = None
        """The version a policy worker said it holds in this round: what every worker holds."""
        self.newest: int | None = None
        """The judged policy's newest version, from its trainer's stats."""
        self.named: int | None = None
        """The version this round's order asks for (the newest when it opened), until a
        worker says what it holds (its own, where the named one was gone)."""
        self.solved_version: int | None = None
        self.judged: set[int | None] = set()
        """The versions judged so far (a version can be held again, by a round that began before
        a newer one arrived; it plays a fresh window then)."""
        self.last_window: tuple[int | None, float] | None = None
        """The version and mean of the last window of held episodes judged."""
        self._held = self._window()
        """The held version's current window (or, without holding, any versions')."""
        self._others = 0
        """Evaluation episodes in a row, since the held version was known, played by others."""
        self._since = 0.0

    # ----------------------------------------------------------------- input
    @property
    def window_size(self) -> int:
        """Episodes one window counts (``episodes``, rounded up to a whole quota per env)."""
        return self._held.size

    def _window(self) -> QuotaWindow:
        window = QuotaWindow(self.envs or 1, self.per_env)
        window.opened_at = self.wall()
        return window

    def add(
        self,
        episode_return: float,
        versions: Any = None,
        env: str | None = None,
        started_at: float | None = None,
    ) -> None:
        """One greedy episode; ``versions``: ``[first, last]`` version of the judged policy
        that played it (as actors report; anything else counts as unknown); ``env``: the
        environment that played it, ``started_at``: when (Unix time): an episode begun
        before the current window opened is not the window's (with ``envs``)."""
        self.returns.append(float(episode_return))
        self.count += 1
        if self.policy is not None and self.round == 0:
            self._next_round()  # evaluation has begun: hold a version from now on
            return
        fresh = started_at is None or started_at >= self._held.opened_at
        where = env if self.envs else "any"
        if self.policy is None:
            if fresh:
                self._held.add(where, float(episode_return))
        elif self.held_version is not None:
            if _played_by(versions) == self.held_version:
                if fresh:
                    self._held.add(where, float(episode_return))
                self._others = 0
            else:
                self._others += 1

    def on_worker_stats(self, stats: dict[str, Any]) -> None:
        """A judged policy worker's heartbeat stats: the version it holds, or that it can't."""
        if self.policy is None or self.round == 0:
            return
        if stats.get("hold_unsupported"):
            self._give_up_holding("a policy worker cannot hold a version")
        elif stats.get("held_round") == self.round and self.held_version is None:
            version = stats.get("held_version")
            if type(version) is int:
                self.held_version = version

    def on_trainer_version(self, version: int) -> None:
        """The judged policy's trainer published ``version``: a round opened from now on
        names it."""
        self.newest = version

    def hold_order(self) -> dict[str, Any] | None:
        """What ``HOLD_KEY`` should say now."""
        if self.policy is None or self.round == 0:
            return None
        order: dict[str, Any] = {"policy": self.policy, "round": self.round}
        version = self.held_version if self.held_version is not None else self.named
        if version is not None:
            order["version"] = version
        return order

    def figures(self) -> dict[str, Any]:
        """For each metrics record, while versions are held: the version held now, how many
        were judged, and the last judged window's version and mean (over the episodes it had
        if it ended early: see ``max_return``)."""
        if self.policy is None:
            return {}
        out: dict[str, Any] = {"eval/held_version": self.held_version,
                               "eval/versions_judged": len(self.judged)}  # fmt: skip
        if self.last_window is not None:
            out["eval/judged_version"], out["eval/judged_window_return"] = self.last_window
        return out

    # ----------------------------------------------------------------- decision
    def mean(self) -> float | None:
        """The mean of the last ``episodes`` returns, once that many arrived."""
        if len(self.returns) < self.episodes:
            return None
        return float(np.mean(self.returns))

    def solved(self) -> bool:
        """Whether the target is confirmed (call after adding; cheap to call often)."""
        if self.target is None:
            return False
        if self.policy is not None:
            return self._judge_held()
        if not self._held.complete:
            return False
        mean = float(np.mean(self._held.values()))
        self._held = self._window()  # the next window: fresh episodes
        return self._confirm_consecutive(mean)

    def _confirm_consecutive(self, mean: float) -> bool:
        if mean >= self.target:
            self.confirmed.append(mean)
        elif self.confirmed:
            logger.info("evaluation mean %.1f did not confirm %s", mean, self.confirmed)
            self.confirmed = []
        return len(self.confirmed) >= self.windows

    def _judge_held(self) -> bool:
        if self._held.complete:
            mean = float(np.mean(self._held.values()))
            self._held = self._window()  # a further window: fresh episodes
            if mean < self.target:
                self._fall_short(mean, self.window_size)
                return False
            self.judged.add(self.held_version)
            self.last_window = (self.held_version, mean)
            self.confirmed.append(mean)
            if len(self.confirmed) >= self.windows:
                self.solved_version = self.held_version
                return True
            logger.info("version %s reached %g (%.2f): confirming", self.held_version,
                        self.target, mean)  # fmt: skip
        if self._out_of_reach():
            self._fall_short(float(np.mean(self._held.values())), self._held.played)
            return False
        if self.held_version is None:
            if self.round and self.clock() - self._since > self.hold_timeout_s:
                self._give_up_holding(f"no policy worker held a version in {self.hold_timeout_s}s")
        elif self._others >= max(STALE_EPISODES, 3 * self.episodes):
            logger.warning("%d evaluation episodes in a row were not played by held version %s: "
                           "holding another", self._others, self.held_version)  # fmt: skip
            self._next_round()
        return False

    def _fall_short(self, mean: float, played: int) -> None:
        """The held version's window ended below the target after ``played`` of its episodes
        (fewer than a window when it could no longer reach it): the next version is held."""
        self.judged.add(self.held_version)
        self.last_window = (self.held_version, mean)
        if self.confirmed:
            logger.info("version %s scored %.2f in %d episodes after %s: not confirmed",
                        self.held_version, mean, played, self.confirmed)  # fmt: skip
        self._next_round()

    def _out_of_reach(self) -> bool:
        """Whether the held version's current window falls short even if every episode still
        to come in it returned ``max_return``."""
        if self.max_return is None or not self._held.values():
            return False
        best = self._held.best_mean(self.max_return)
        return best is not None and best < self.target - 1e-9

    def _next_round(self) -> None:
        self.round += 1
        self.held_version, self._held, self.confirmed, self._others = None, self._window(), [], 0
        self.named = self.newest
        self._since = self.clock()

    def _give_up_holding(self, why: str) -> None:
        """Judge windows of any versions from now on, starting with fresh episodes."""
        logger.warning("%s: judging windows of any versions instead", why)
        self.policy, self.held_version, self._held, self.confirmed = None, None, self._window(), []

    def describe(self) -> str:
        """How a solved run was confirmed, for its summary."""
        means = ", ".join(f"{m:.4g}" for m in self.confirmed)
        if self.solved_version is not None:
            n = len(self.judged)
            return (
                f"greedy mean return reached {self.target:g} in {len(self.confirmed)} windows "
                f"of {self.window_size} fresh episodes played by version {self.solved_version} "
                f"alone ({n} version{'s' * (n != 1)} judged in all): {means}"
            )
        n = len(self.confirmed)
        return (
            f"greedy mean return reached {self.target:g} in {n} consecutive "
            f"window{'s' if n > 1 else ''} of {self.window_size} fresh episodes: {means}"
        )


def _played_by(versions: Any) -> int | None:
    """The one version that played a whole episode, from an actor's ``[first, last]``."""
    if (
        isinstance(versions, (list, tuple))
        and len(versions) == 2
        and all(type(v) is int for v in versions)
        and versions[0] == versions[1]
    ):
        return versions[0]
    return None
