"""The actor worker: steps a ring of environments, asks policy workers for actions, builds segments.

Its stages (:mod:`system.timing`): ``env_step``, ``requests`` (built and sent), ``answers``
(received and recorded), ``send_samples``; it waits in ``wait_actions``, ``wait_trainers``
(back-pressure) and ``wait_pace``.

The environments are split into groups. While one group waits for its actions, the worker steps
another, so the CPU is not idle during inference round trips (Sample Factory's double buffering).
Each agent of each environment is a *slot*; the slots of one policy in one group form a *lane*
(:mod:`system.workers.lanes`), whose requests, memories and segments are handled as one batch.

Per agent, every observation goes to the policy, even a final one (done or truncated): its value
is what bootstraps a truncated episode exactly. Then the environment is reset instead of stepped.

Longer than 400 lines because an environment's episode (its seed, who plays each seat, the
user's hooks, recording, non-finite values, errors) is one state machine, read best in one place.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from api.env_check import reward_problem
from api.environment import Environment, StepResult, frames_per_step
from api.errors import ConfigError
from api.policy_mapping import PolicyMapping
from system.errors import EnvironmentFailure
from system.eval_quota import episode_seed
from system.ratelimit import Pace, RecoveredErrors
from system.roles import Role
from system.streams.inference import InferenceClient
from system.streams.samples import SampleProducer
from system.streams.validation import action_bounds, check_action, fit_actions
from system.workers.actor_hooks import ActorHooks
from system.workers.base import Worker
from system.workers.env_making import make_environments
from system.workers.lanes import Group, Lane, Misfit, Slot, matchups, observation_spec, per_policy
from system.workers.nonfinite import NonFiniteGuard
from system.workers.trajectory import SegmentBuffer

logger = logging.getLogger(__name__)


class ActorWorker(Worker):
    role = Role.ACTOR

    def __init__(
        self,
        worker_id: str,
        env_factory: Callable[[int], Environment],
        n_envs: int,
        agent_policies: Callable[[int], str],
        inference: InferenceClient,
        samples: SampleProducer | None,
        *,
        segment_length: int = 64,
        is_evaluation: bool = False,
        seed: int = 0,
        on_env_error: str = "raise",
        groups: int = 2,
        validate_actions: bool = False,
        max_fps: float | None = None,
        on_nonfinite: str = "fail",
        env_name: str = "",
        policy_mapping: PolicyMapping | None = None,
        mapped_policies: Sequence[str] = (),
        trained_policies: Sequence[str] | None = None,
        hooks: ActorHooks | None = None,
        make_threads: int = 1,
    ):
        super().__init__(worker_id)
        self.inference, self.samples, self.hooks = inference, samples, hooks
        """``hooks``: the experiment's actor callbacks (system.workers.actor_hooks), if any."""
        self.is_evaluation, self.seed = is_evaluation, seed
        self.on_env_error, self.on_nonfinite = on_env_error, on_nonfinite
        self.validate_actions, self.env_factory = validate_actions, env_factory
        self.envs: list[Environment] = make_environments(
            self._make_env, n_envs, make_threads, worker_id
        )
        self.bounds = [action_bounds(env.action_spaces) for env in self.envs]
        """Each environment's Box action bounds: actions are clipped into them (fit_actions)."""
        self._rebuilding: set[int] = set()
        """Environments being rebuilt after an error (``on_env_error='reset'``)."""
        self._env_errors = RecoveredErrors(logger)
        self.env_name = env_name or type(self.envs[0]).__name__
        try:
            self.frames_per_step = frames_per_step(self.envs[0])
        except ValueError as e:  # a build error: the run ends at once with it
            raise ValueError(f"environment '{self.env_name}': {e}") from None
        """Emulator frames a step (Atari's frame skip), reported where more than 1."""
        self.nonfinite = NonFiniteGuard(worker_id, on_nonfinite, self._where)
        self.mapping = policy_mapping
        """Chooses every agent's policy at each reset; None: ``agent_policies``, fixed."""
        self.mapped_policies = list(mapped_policies)
        self.episode_counts = [0] * n_envs
        first = (lambda _a: self.mapped_policies[0]) if policy_mapping else agent_policies
        self.slots = [
            [Slot(e, a, first(a)) for a in range(env.agent_count)]
            for e, env in enumerate(self.envs)
        ]
        n_groups = max(1, min(groups, n_envs))
        record = samples is not None and not is_evaluation
        self.trained = None if trained_policies is None else set(trained_policies)
        """Policies whose steps are recorded and sent (None: all); a frozen one's are not."""
        self.groups = [
            self._group(list(range(g, n_envs, n_groups)), segment_length, record)
            for g in range(n_groups)
        ]
        self.env_frames = 0
        self.episode_steps, self.started_at = [0] * n_envs, [0.0] * n_envs
        """Steps of each environment's running episode (reported as ``episode_length``)."""
        self.episodes: list[dict[str, float]] = []
        self._started = False
        self.pace = Pace(max_fps) if max_fps else None
        self.looked_for_answers_at = 0.0
        """When this worker last looked for answers (``time.monotonic``): the clock of
        :meth:`stalled_policies`."""

    def _group(self, envs: list[int], segment_length: int, record: bool) -> Group:
        group = Group(envs)
        if self.mapping is not None:  # any slot may play any policy: each lane holds them all
            slots = [slot for e in envs for slot in self.slots[e]]
            group.lanes = {
                p: Lane(p, slots, None, self.is_evaluation) for p in self.mapped_policies
            }
        for e in envs if self.mapping is None else ():
            for slot in self.slots[e]:
                if slot.policy not in group.lanes:
                    group.lanes[slot.policy] = Lane(slot.policy, [], None, self.is_evaluation)
                group.lanes[slot.policy].slots.append(slot)
        for lane in group.lanes.values():
            keep = record and (self.trained is None or lane.policy in self.trained)
            lane.buffer = SegmentBuffer(len(lane.slots), segment_length) if keep else None
            first = lane.slots[0]  # the agent whose spaces the policy's network is built for
            lane.obs_spec = observation_spec(self._observation_space(first))
        return group

    def _observation_space(self, slot: Slot):
        return self.envs[slot.env].observation_spaces[slot.agent]

    # ----------------------------------------------------------------- the loop
    def poll(self) -> int:
        clock = self.stages
        if not self._started:
            clock.enter("env_step")
            self._start()
        if self.samples is not None:
            backlogged = self.samples.backlogged
            clock.enter("wait_trainers" if backlogged else "send_samples")
            self.samples.flush(timeout_ms=10 if backlogged else 0)
            if self.samples.backlogged:
                return 0  # back-pressure: the trainers are behind, so this actor waits
        if self.pace is not None and self._held_back():
            return 0
        clock.enter("wait_actions")
        self.looked_for_answers_at = time.monotonic()
        if not self.inference.wait(timeout_ms=5):
            return 0
        clock.enter("answers")
        work = 0
        for reply in self.inference.poll(timeout_ms=0):
            group = self.groups[reply.group]
            if reply.seq != group.seq or reply.policy not in group.waiting:
                continue  # stale or duplicate answer
            group.replies[reply.policy] = reply
            if len(group.replies) == len(group.waiting):
                work += self._advance(reply.group)
        if self.pace is not None:
            self.pace.spend(work)
        return work

    def _held_back(self) -> bool:
        """Sleep a little if this worker is ahead of its pace (``max_fps``); True if it was."""
        self.stages.enter("wait_pace")
        wait_s = self.pace.wait_s()
        if wait_s > 0:
            time.sleep(min(wait_s, 0.02))  # short: heartbeats and stop requests go on
        return wait_s > 0

    def _start(self) -> None:
        self._started = True
        for e in range(len(self.envs)):
            self._reset_env(e)
        for g in range(len(self.groups)):
            self._request(g)

    def _request(self, g: int) -> None:
        group = self.groups[g]
        group.seq += 1
        for retry in (False, True):  # once more after dropping episodes that went non-finite
            self._build_requests(group)
            bad = self.nonfinite.inputs(group)
            if not bad:
                break
            self.nonfinite.handle(bad, after_reset=retry)
            for e in bad:
                self._drop_episode(e)
        if not group.waiting:
            raise EnvironmentFailure(
                f"no agent of environments {group.envs} acts: every result is None; an "
                "environment must give at least one agent a result on every step"
            )
        self._post(g, group.waiting)

    def _build_requests(self, group: Group) -> None:
        """Each lane's request; an environment whose observation does not fit its space is an
        environment error (:meth:`_env_failed`: the worker fails, or the environment is rebuilt,
        at most once per environment here)."""
        for _ in range(len(group.envs) + 1):
            group.replies = {}
            group.waiting = set()
            try:
                for policy, lane in group.lanes.items():
                    if lane.build_request(group.seq) is not None:
                        group.waiting.add(policy)
                return
            except Misfit as misfit:
                message = self._misfit_message(misfit)
                self._env_failed(misfit.slot.env, message, None)
        raise EnvironmentFailure(message)

    def _misfit_message(self, misfit: Misfit) -> str:
        space = self._observation_space(misfit.slot)
        return (
            f"{self._where(misfit.slot)} returned an observation that does not fit its "
            f"observation space {space}: {misfit.problem}; fix the environment "
            "(test_environment checks every step against the spaces)"
        )

    def _post(self, g: int, policies) -> None:
        group = self.groups[g]
        group.posted_at = time.monotonic()
        for policy in policies:
            self.inference.post(policy, g, group.seq, group.lanes[policy].request)

    def stalled_policies(self, timeout_s: float) -> set[str]:
        """Policies that have not answered a request for ``timeout_s`` (their worker may be
        gone: the caller reconnects and calls :meth:`repost`).

        Counted up to the last time this worker looked for answers: while it is held back (the
        trainers' back-pressure, its pace) answers wait unread in its socket, and a request
        posted before a long wait for a trainer's step is not one its policy worker failed."""
        looked = self.looked_for_answers_at
        return {
            policy
            for group in self.groups
            if group.waiting and looked - group.posted_at > timeout_s
            for policy in group.waiting
            if policy not in group.replies
        }

    def repost(self, policies: set[str]) -> None:
        """Send the unanswered requests of ``policies`` again (same sequence numbers, so a late
        original answer and the new one are never both used)."""
        for g, group in enumerate(self.groups):
            missing = [p for p in group.waiting if p in policies and p not in group.replies]
            if missing:
                self._post(g, missing)

    def _advance(self, g: int) -> int:
        """All answers of group ``g`` are in: record the steps, step or reset, ask again."""
        self.stages.enter("answers")
        group = self.groups[g]
        actions: dict[int, list[Any]] = {e: [None] * len(self.slots[e]) for e in group.envs}
        bad = self.nonfinite.actions(group)
        if bad:
            self.nonfinite.handle(bad, after_reset=False)
            for e in bad:  # nothing of these episodes may complete a segment now
                self._forget_env(e)
        for policy in group.waiting:
            lane, reply = group.lanes[policy], group.replies[policy]
            segments = lane.take_answer(reply.result, reply.version)
            if segments is not None:
                self.stages.enter("send_samples")
                if self.hooks is not None:  # the user's trajectory hook: the last word
                    segments = self.hooks.segment(policy, segments)
                self.samples.post(policy, segments)
                self.stages.enter("answers")
            action = reply.result.action
            for i, c in enumerate(lane.acting):
                slot = lane.slots[c]
                actions[slot.env][slot.agent] = action[i]
        self.stages.enter("env_step")
        for e in group.envs:
            if e in bad:
                self._drop_episode(e)
                continue
            if self.validate_actions:
                self._check_actions(e, actions[e])
            self._step_env(e, actions[e])
        self.stages.enter("requests")
        self._request(g)
        return len(group.envs)

    def _check_actions(self, e: int, actions: list[Any]) -> None:
        for agent, (action, space) in enumerate(zip(actions, self.envs[e].action_spaces)):
            if action is not None:
                check_action(self.slots[e][agent].policy, agent, action, space)

    # ----------------------------------------------------------------- environments
    def _step_env(self, e: int, actions: list[Any]) -> None:
        slots = self.slots[e]
        live = [s.result for s in slots if s.result is not None]
        if live and all(r.done or r.truncated for r in live):
            self._finish_episode(e)
            self._reset_env(e)
            return
        for slot in slots:  # an agent that is done waits out the episode
            if slot.result is not None and (slot.result.done or slot.result.truncated):
                actions[slot.agent] = None
        results = self._call_env(e, "step", fit_actions(actions, self.bounds[e]))
        if results is None:
            return
        self.env_frames += 1
        self.episode_steps[e] += 1
        if self.hooks is not None:  # before the step is recorded: a hook may shape its reward
            self.hooks.step(e, results)
        self._take_results(e, results)

    def _make_env(self, e: int) -> Environment:
        env = self.env_factory(e)
        env.seed(self.seed + e)
        return env

    def _reset_env(self, e: int) -> None:
        if self.mapping is not None:
            self._map_policies(e)
        if self.is_evaluation:  # each evaluation episode replays from a seed of its own
            self.envs[e].seed(episode_seed(self.seed + e, self.episode_counts[e]))
        self.episode_counts[e] += 1
        for slot in self.slots[e]:
            slot.on_reset = True
            slot.episode_return = 0.0
        self.episode_steps[e], self.started_at[e] = 0, time.time()
        results = self._call_env(e, "reset")
        if results is not None:
            if self.hooks is not None:
                policies = [slot.policy for slot in self.slots[e]]
                self.hooks.start(e, self.envs[e], results, self.episode_counts[e] - 1, policies)
            self._take_results(e, results)

    def _map_policies(self, e: int) -> None:
        """Who plays each agent of environment ``e``'s next episode. Episode ids count up per
        environment from a base its seed gives: unique in the run, consecutive per environment."""
        episode_id = (self.seed + e) * 2**32 + self.episode_counts[e]
        info = {"env": e, "actor": self.worker_id, "evaluation": self.is_evaluation}
        for slot in self.slots[e]:
            name = self.mapping(episode_id, slot.agent, info)
            if name not in self.mapped_policies:
                raise ConfigError([f"policy_mapping: gave '{name}' to agent {slot.agent} of "
                                   f"episode {episode_id}; this actor plays "
                                   f"{self.mapped_policies}"])  # fmt: skip
            slot.policy = name

    def _take_results(self, e: int, results: list[StepResult | None]) -> None:
        for slot, result in zip(self.slots[e], results):
            slot.result = result
            if result is not None:
                slot.episode_return += float(np.asarray(result.reward).reshape(-1)[0])

    def _call_env(self, e: int, method: str, *args) -> list[StepResult | None] | None:
        try:
            results = getattr(self.envs[e], method)(*args)
        except Exception as err:
            message = f"environment {e} of {self.worker_id} raised in {method}(): {err!r}"
            return self._env_failed(e, message, err)
        problem = _results_problem(results, len(self.slots[e]))
        if problem is None:
            return results
        message = (
            f"environment '{self.env_name}' #{e} of {self.worker_id}: {method}() returned {problem}"
        )
        return self._env_failed(e, message, None)

    def _env_failed(self, e: int, message: str, err: Exception | None) -> None:
        """Raise EnvironmentFailure, or (``on_env_error='reset'``) rebuild the environment; one
        that fails again in the reset after its rebuild fails the worker (no endless loop)."""
        if e in self._rebuilding:
            raise EnvironmentFailure(f"{message}, right after it was rebuilt") from err
        if self.on_env_error != "reset":
            if err is not None:  # a simulator that crashes now and then need not end the run
                message += "; actors.on_env_error=reset rebuilds such an environment and goes on"
            raise EnvironmentFailure(message) from err
        self._env_errors.record(f"{message}; resetting it", err)
        self.stats["env_errors"] = self.stats.get("env_errors", 0) + 1
        self._rebuilding.add(e)
        try:
            self._recover_env(e)
        finally:
            self._rebuilding.discard(e)

    def _recover_env(self, e: int) -> None:
        """Rebuild a failed environment; its agents' unfinished steps are dropped."""
        try:
            self.envs[e].close()
        except Exception:  # a broken env may fail to close too; we replace it regardless
            logger.debug("closing failed environment %d raised", e, exc_info=True)
        with self.building():  # minutes, for a simulator: not a hung poll
            self.envs[e] = self._make_env(e)
        self._forget_env(e)
        self._reset_env(e)

    def _forget_env(self, e: int) -> None:
        """Drop the unsent steps of environment ``e``'s agents."""
        for group in self.groups:
            for lane in group.lanes.values():
                lane.forget([c for c, s in enumerate(lane.slots) if s.env == e])

    def _finish_episode(self, e: int) -> None:
        slots = self.slots[e]
        record = {
            "episode_return": float(np.mean([s.episode_return for s in slots])),
            "episode_length": float(self.episode_steps[e]),
            "env": f"{self.worker_id}/{e}",  # per-environment quotas (system.eval_quota)
            "started_at": self.started_at[e],
        }
        record.update(per_policy(slots))
        if len(slots) > 1:
            record.update(matchups(slots))
        info = next((s.result.info for s in slots if s.result is not None), {})
        for k, v in (info or {}).items():
            if isinstance(v, (int, float, np.number)) and not isinstance(v, bool):
                record[f"episode_info/{k}"] = float(v)
        if self.hooks is not None:
            record.update(self.hooks.end(e))
        self.episodes.append(record)

    # ----------------------------------------------------------------- non-finite values
    def _where(self, slot: Slot) -> str:
        return (
            f"environment '{self.env_name}' #{slot.env} of {self.worker_id}, agent "
            f"{slot.agent}, at step {self.episode_steps[slot.env]} of its episode"
        )

    def _drop_episode(self, e: int) -> None:
        """Forget the episode's unsent steps and start a new one (counted in the stats)."""
        self.stats["nonfinite_episodes"] = self.stats.get("nonfinite_episodes", 0) + 1
        self._forget_env(e)
        self._reset_env(e)

    # ----------------------------------------------------------------- stats
    def collect_stats(self) -> dict[str, Any]:
        stats = super().collect_stats()
        prefix = "eval_" if self.is_evaluation else ""
        stats[f"{prefix}env_frames"] = self.env_frames
        if self.frames_per_step != 1:  # the controller reports emulator frames beside steps
            stats["frames_per_step"] = self.frames_per_step
        slots = getattr(self.inference, "slots", None)  # one per actor, shared by both streams
        if slots is not None:
            stats["shm_obs_bytes"] = slots.bytes_written  # since the worker started
        stats[f"{prefix}episodes"] = self.episodes
        self.env_frames = 0
        self.episodes = []
        return stats

    def close(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception:  # closing is best effort: the worker is going away
                logger.debug("environment close raised", exc_info=True)
        self.inference.close()
        if self.samples is not None:
            self.samples.close()


def _results_problem(results: Any, agents: int) -> str | None:
    """What is wrong with what ``reset``/``step`` returned for ``agents`` agents (None: nothing).
    A short list would leave the missing agents' last results in place: acted on, and their
    rewards recorded, again."""
    shape = "; it returns a list of one StepResult (or None) per agent"
    if not isinstance(results, (list, tuple)):
        return f"a {type(results).__name__}{shape}"
    if len(results) != agents:
        got = f"{len(results)} result{'s' if len(results) != 1 else ''}"
        return f"{got} for {agents} agent{'s' if agents != 1 else ''}{shape}"
    for agent, result in enumerate(results):
        if result is None:
            continue
        if not isinstance(result, StepResult):
            return f"a {type(result).__name__} for agent {agent}{shape}"
        reward = result.reward
        if not (isinstance(reward, float) or type(reward) is int):  # the cheap, usual case
            problem = reward_problem(reward)
            if problem is not None:
                return f"a result for agent {agent} whose {problem}"
    return None
