"""What ``troupe eval TARGET`` takes: a run folder, or a checkpoint file inside one."""

from __future__ import annotations

import pytest

from api.errors import UserError
from system.run.evaluation import locate


def _run_folder(tmp_path):
    run = tmp_path / "runs" / "r"
    (run / "checkpoints" / "default").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    for name in ("v00000300.ckpt", "latest.ckpt", "trainer.ckpt"):
        (run / "checkpoints" / "default" / name).write_bytes(b"x")
    return run


def test_a_version_a_latest_and_a_run_folder_are_found(tmp_path):
    run = _run_folder(tmp_path)
    ckpts = run / "checkpoints" / "default"
    assert locate(ckpts / "v00000300.ckpt") == (run.resolve(), {"default": 300})
    # latest.ckpt was refused as "neither a run folder nor a checkpoint file"
    assert locate(ckpts / "latest.ckpt") == (run.resolve(), {})
    assert locate(run) == (run, {})


def test_a_checkpoint_out_of_its_run_folder_or_a_trainers_state_say_what_is_wrong(tmp_path):
    run = _run_folder(tmp_path)
    copied = tmp_path / "x.ckpt"
    copied.write_bytes(b"x")  # a copy: it was "neither a run folder nor a checkpoint file"
    with pytest.raises(UserError, match=r"x.ckpt is evaluated from inside its run folder"):
        locate(copied)
    with pytest.raises(UserError, match=r"trainer.ckpt is its trainer's state"):
        locate(run / "checkpoints" / "default" / "trainer.ckpt")
    with pytest.raises(UserError, match=r"neither a run folder nor a checkpoint file"):
        locate(tmp_path / "nothing-here")


def test_the_policy_that_plays_is_the_one_evaluation_reports(tmp_path):
    """``load_policy`` (and so ``troupe eval --video``) of a PBT run took its first member
    where ``troupe eval`` reported the summary's best: a video of member0 (117 a game) under
    a report of member3's 317."""
    import dataclasses
    import json

    from api.resolve import load_experiment
    from system.run.evaluation import played_policy

    pbt = load_experiment("cartpole-pbt")
    (tmp_path / "summary.json").write_text(json.dumps({"pbt": {"best_member": "member3"}}))
    assert played_policy(tmp_path, pbt, {}) == "member3"
    assert played_policy(tmp_path, pbt, {"member2": 7}) == "member2"  # a member's file
    assert played_policy(tmp_path / "no-summary", pbt, {}) == "member0"
    selfplay = load_experiment("connect4-selfplay")
    judged = dataclasses.replace(selfplay.evaluation, policy="main")
    assert played_policy(tmp_path, dataclasses.replace(selfplay, evaluation=judged), {}) == "main"
    two = load_experiment("gather-2p-ppo")
    assert played_policy(tmp_path, two, {}) == next(iter(two.policies))
