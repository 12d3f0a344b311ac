"""Data-parallel trainers (``trainer_workers=2``) in real runs: ``troupe run`` as a user runs it.

Serial mode builds one trainer per policy, so the group is tested here with real processes,
sockets and gloo. What is checked comes from the run folder: ``metrics.jsonl`` (rank 0 reports
the policy's trainer stats, rank 1 its own under ``rank1/``, each with a checksum of its
parameters), ``workers.json`` and ``summary.json``.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import time

import pytest
from e2e_support import finish, read_json, start, wait_for

from api.config import make_experiment
from api.errors import ConfigError
from system.run.report import read_metrics
from system.run.serial import SerialRun

GROUP = ["policies.default.trainer_workers=2", "stop.eval_return=None", "evaluation.workers=0"]


def _versions(run_dir) -> list[float]:
    versions = (r.get("policy/default/version") for r in read_metrics(run_dir))
    return [v for v in versions if v is not None]


def _assert_ranks_agree(run_dir, *, restarted_after: float | None = None) -> dict:
    """The run's last record: both ranks stepped, at the same version, with equal parameters.

    ``restarted_after``: the version at which a rank was killed. The ranks' processes may then
    have started at different times (a rank that joined a group that failed to form restarts
    once more), so their own step counts may differ; the version and the parameters may not.
    Each rank's statistics come with its own heartbeats, and a run interrupted on a loaded
    machine can end on a record whose rank 1 figures are a step or two older than rank 0's (3
    against 5 in one full test run): the record judged is then the last where both report the
    same version, which must be one the re-formed group made together."""
    records = read_metrics(run_dir)
    last = records[-1]
    t = "trainer/default/"
    if restarted_after is not None:
        together = [r for r in records if r.get(f"{t}rank1/version") == r.get(f"{t}version")]
        together = [r for r in together if (r.get(f"{t}version") or 0) > restarted_after]
        assert together, (last, restarted_after)
        last = together[-1]
    restarts = {w: s["restarts"] for w, s in read_json(run_dir / "workers.json").items()}
    assert last[f"{t}steps"] >= 1 and last[f"{t}rank1/steps"] >= 1, (last, restarts)
    if restarted_after is None:
        assert last[f"{t}rank1/steps"] == last[f"{t}steps"], (last, restarts)
    assert last[f"{t}rank1/version"] == last[f"{t}version"], (last, restarts)
    # The policy workers serve what they last pulled: a version or a few behind on a loaded
    # machine (rank 0 publishes one more as the run stops), never ahead.
    assert last["policy/default/version"] <= last[f"{t}version"], last
    assert last[f"{t}rank1/param_checksum"] == last[f"{t}param_checksum"], last
    versions = _versions(run_dir)
    assert versions == sorted(versions), versions  # monotonic, as the parameter service sees them
    return last


@pytest.mark.multiprocess
def test_two_trainers_step_together_from_their_own_samples(tmp_path):
    run_dir = tmp_path / "run"
    args = [*GROUP, "stop.trainer_steps=6", "--run-dir", str(run_dir), "--no-display"]
    out = finish(start(["run", "cartpole-ppo", *args]))
    assert read_json(run_dir / "summary.json")["stop_reason"] == "trainer_steps", out
    workers = read_json(run_dir / "workers.json")
    assert workers["trainer/default/0"]["restarts"] == workers["trainer/default/1"]["restarts"] == 0
    records = read_metrics(run_dir)
    # each rank trained on samples it took from the stream itself
    assert any(r.get("trainer/default/samples", 0) > 0 for r in records)
    assert any(r.get("trainer/default/rank1/samples", 0) > 0 for r in records)
    last = _assert_ranks_agree(run_dir)
    # Both ranks started from the same parameters, and training moved them. The starting ones
    # are read from the ranks' logs: on a fast machine six steps can end before the first
    # report, so no record need hold them (CI once saw the first record's equal the last's).
    starts = [_joined_with(run_dir, rank) for rank in (0, 1)]
    assert starts[0] == starts[1], starts
    assert starts[0] != last["trainer/default/param_checksum"], (starts, last)
    checkpoints = sorted((run_dir / "checkpoints" / "default").glob("v*.ckpt"))
    assert int(checkpoints[-1].stem[1:]) == last["policy/default/version"]  # rank 0's final one


@pytest.mark.multiprocess
@pytest.mark.parametrize("experiment", ["pendulum-sac", "cartpole-dqn"])
def test_two_off_policy_trainers_share_one_replay_worker_and_step_together(tmp_path, experiment):
    """Both ranks take their own batches from the policy's replay worker; their parameters (and
    SAC's temperature, which lives outside the model) stay equal."""
    run_dir = tmp_path / "run"
    args = [*GROUP, "stop.trainer_steps=6", "--run-dir", str(run_dir), "--no-display"]
    out = finish(start(["run", experiment, *args]))
    assert read_json(run_dir / "summary.json")["stop_reason"] == "trainer_steps", out
    last = _assert_ranks_agree(run_dir)
    if experiment == "pendulum-sac":
        assert last["trainer/default/rank1/alpha"] == last["trainer/default/alpha"], last


def _resumed_from(run_dir, rank: int) -> list[int]:
    """The versions rank ``rank`` said it trains on from, one per generation it joined."""
    log = (run_dir / "logs" / f"trainer-default-{rank}.log").read_text()
    return [int(v) for v in re.findall(r"trains on from version (\d+)", log)]


def _joined_with(run_dir, rank: int) -> float:
    """The parameter checksum rank ``rank`` logged as it joined its (first) group."""
    log = (run_dir / "logs" / f"trainer-default-{rank}.log").read_text()
    return float(re.findall(r"trains on from version \d+ \(parameter checksum (\d+)\)", log)[0])


def _both_past(run_dir, version: float) -> bool:
    """Each rank's own figures have reached past ``version``: the new group has stepped. (They
    are sent with each rank's own heartbeats, so while it trains a record seldom shows the two
    at the same version; the stop ends with one that does.)"""
    records = read_metrics(run_dir)
    t = "trainer/default/"
    return all(
        any((r.get(key) or 0) > version for r in records)
        for key in (t + "version", t + "rank1/version")
    )


@pytest.mark.multiprocess
def test_a_killed_rank_makes_the_group_form_again(tmp_path):
    """Rank 1 is killed: rank 0 fails at its next collective, both restart, and the new group goes
    on from the last published version with versions still monotonic; Ctrl+C then ends the run.

    The records lag the trainers by up to a report period (a CartPole group makes several
    versions in one), so the version the new group starts from is read from what its ranks
    log as they join, never from the records around the kill."""
    run_dir = tmp_path / "run"
    # Ctrl+C ends it, not a rule: the 500k-frame one once ended a run the test still watched
    stops = ["stop.trainer_steps=100000", "stop.env_frames=None"]
    args = [*GROUP, *stops, "--run-dir", str(run_dir), "--no-display"]
    proc = start(["run", "cartpole-ppo", *args])
    wait_for(lambda: (_versions(run_dir) or [0])[-1] >= 2, proc, timeout=240, what="version 2")
    seen_at_kill = _versions(run_dir)[-1]
    os.kill(read_json(run_dir / "workers.json")["trainer/default/1"]["pid"], signal.SIGKILL)

    def restarted(rank: int) -> bool:
        return read_json(run_dir / "workers.json")[f"trainer/default/{rank}"]["restarts"] >= 1

    # the whole group re-forms: the killed rank, and rank 0 that lost it
    wait_for(lambda: restarted(0) and restarted(1), proc, timeout=240, what="both ranks restarted")
    rejoined = lambda: all(len(_resumed_from(run_dir, rank)) >= 2 for rank in (0, 1))  # noqa: E731
    wait_for(rejoined, proc, timeout=240, what="both ranks rejoined")
    resumed = _resumed_from(run_dir, 0)[-1]
    # both ranks go on from the same version, never one older than the records had shown
    assert _resumed_from(run_dir, 1)[-1] == resumed >= seen_at_kill
    wait_for(lambda: _both_past(run_dir, resumed + 2), proc, timeout=300, what="3 steps")
    os.killpg(proc.pid, signal.SIGINT)
    out = finish(proc, timeout=120)
    assert read_json(run_dir / "summary.json")["stop_reason"] == "interrupted", out
    _assert_ranks_agree(run_dir, restarted_after=resumed)


@pytest.mark.multiprocess
@pytest.mark.learning
def test_two_trainers_solve_cartpole(tmp_path):
    """Greedy 475 on CartPole-v1 with two data-parallel trainers of 8 segments each (the example's
    16 a step in all), every role in its own process."""
    run_dir = tmp_path / "run"
    args = ["policies.default.trainer_workers=2", "policies.default.batch_segments=8"]
    out = finish(
        start(["run", "cartpole-ppo", *args, "--run-dir", str(run_dir), "--no-display"]), 900
    )
    summary = read_json(run_dir / "summary.json")
    solved, wall, frames = (summary.get(k) for k in ("solved", "wall_s", "env_frames"))
    print(f"trainer_workers=2: solved {solved} in {wall}s, {frames} frames")
    assert summary["solved"] is True, out
    _assert_ranks_agree(run_dir)


def test_serial_mode_trains_a_group_config_with_one_trainer():
    config = make_experiment("cartpole-ppo", ["policies.default.trainer_workers=2"])
    run = SerialRun(config)
    try:
        progress = run.run(trainer_steps=2)
    finally:
        run.close()
    assert list(run.trainers) == ["default"] and run.trainers["default"].group is None
    assert progress.trainer_steps("default") >= 2
    assert run.store.latest_version("default") == run.trainers["default"].trainer.policy.version


def test_config_rejects_groups_it_cannot_train():
    with pytest.raises(ConfigError) as e:
        make_experiment(
            "gather-2p-ppo",
            ["policies.red.policy.type=random-legal", "policies.red.trainer_workers=2"],
        )
    assert (
        "policies.red.trainer_workers: 2 trainers train data-parallel, which needs a policy with "
        "distributed_setup() (a subclass of algorithm.policy.SingleModelPytorchPolicy); "
        "'random-legal' (algorithm.scripted_policies.RandomLegalPolicy) has none: set "
        "trainer_workers=1"
    ) in str(e.value)
    with pytest.raises(ConfigError) as e:
        make_experiment(
            "cartpole-ppo",
            ["policies.default.trainer.type=", "policies.default.trainer_workers=3"],
        )
    assert (
        "policies.default.trainer_workers: 3 trainers for a policy without a trainer; set it to 1"
    ) in str(e.value)


# ------------------------------------------------------------- rendezvous generations
class FileRendezvous:
    """The control channel's register/lookup, as files in a folder (real processes share it);
    every lookup is counted, so the test can wait until a joiner has looked more than once."""

    def __init__(self, folder):
        self.folder = folder

    def announce(self, name: str, port: int) -> None:
        tmp = self.folder / "address.tmp"
        tmp.write_text(f"127.0.0.1:{port}")
        tmp.replace(self.folder / "address")

    def lookup(self, name: str) -> tuple[str, int]:
        with open(self.folder / "lookups", "a") as f:
            f.write(".")
        deadline = time.monotonic() + 60
        while not (self.folder / "address").exists():
            assert time.monotonic() < deadline, "nothing announced"
            time.sleep(0.05)
        host, port = (self.folder / "address").read_text().rsplit(":", 1)
        return host, int(port)


def _member(rank: int, folder, value: float, results, hold) -> None:
    import torch
    import torch.distributed as dist

    from system.workers.trainer_group import form_group

    torch.set_num_threads(1)
    group = form_group("p", rank, 2, FileRendezvous(folder), "trainer_group/p")
    total = torch.tensor([value])
    dist.all_reduce(total)
    results.put((rank, float(total)))
    if hold is not None:
        hold.wait(120)
    group.close()


@pytest.mark.multiprocess
def test_a_joiner_waits_for_a_new_generation_instead_of_joining_a_closed_one(tmp_path):
    """A restarted rank 1 finds the old rank 0's store still up but its group formed (closed):
    it must not join it, and joins the new rank 0 once that one announces itself."""
    ctx = multiprocessing.get_context("spawn")
    results, hold = ctx.Queue(), ctx.Event()
    old = [ctx.Process(target=_member, args=(0, tmp_path, 1.0, results, hold))]
    old.append(ctx.Process(target=_member, args=(1, tmp_path, 2.0, results, None)))
    new: list = []
    try:
        for p in old:
            p.start()
        assert sorted(results.get(timeout=180) for _ in old) == [(0, 3.0), (1, 3.0)]
        old[1].join(60)  # the old rank 1 left; the old rank 0 lives on with its closed store
        lookups = (tmp_path / "lookups").read_text()
        new.append(ctx.Process(target=_member, args=(1, tmp_path, 20.0, results, None)))
        new[0].start()
        deadline = time.monotonic() + 120
        while len((tmp_path / "lookups").read_text()) < len(lookups) + 2:  # it looked again
            assert time.monotonic() < deadline and new[0].is_alive(), "the joiner did not retry"
            time.sleep(0.1)
        hold.set()  # the old rank 0 goes; its successor opens a new generation
        new.append(ctx.Process(target=_member, args=(0, tmp_path, 10.0, results, None)))
        new[1].start()
        assert sorted(results.get(timeout=180) for _ in new) == [(0, 30.0), (1, 30.0)]
    finally:
        for p in [*old, *new]:
            p.join(30)
            if p.is_alive():
                p.kill()
