"""What ``troupe run --resume`` checks first (system.run.resume_check): the saved config is read
(a damaged one is one line), a change the checkpoints cannot follow is refused naming its key,
other changes are recorded in ``resumes.jsonl``, and damaged checkpoints are skipped for the
newest good one or, when none is left, refused."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from api.config import make_experiment
from api.errors import RunFolderError, UserError
from system import run_folder
from system.parameters.checkpoint_file import write_checkpoint
from system.parameters.store import LATEST_FILE, TRAINER_FILE
from system.run.report import METRICS_FILE
from system.run.resume_check import (
    check_budget_left,
    check_checkpoints,
    check_compatible,
    saved_config,
)


def test_the_saved_config_is_read_back_and_a_damaged_one_is_one_line(tmp_path):
    config = make_experiment("cartpole-ppo", ["stop.env_frames=1234"])
    path = tmp_path / run_folder.CONFIG
    path.write_text(json.dumps(config.to_dict()))
    assert saved_config(tmp_path).to_dict() == config.to_dict()
    path.write_text('{"name": ')
    with pytest.raises(UserError, match=r"config\.json is damaged \(not valid JSON"):
        saved_config(tmp_path)
    path.write_text(json.dumps({"policies": 3}))
    with pytest.raises(UserError, match="not a config this version of Troupe reads"):
        saved_config(tmp_path)
    path.unlink()
    with pytest.raises(RunFolderError, match="cannot read"):
        saved_config(tmp_path)


def _changed(what: str):
    config = make_experiment("cartpole-ppo")
    policy = config.policies["default"]
    if what == "network":
        policy.policy.args["hidden_sizes"] = [32, 32]
    elif what == "algorithm":
        policy.trainer.type = "impala"
    elif what == "environment":
        config.environment.type = "Acrobot-v1"
    elif what == "policies":
        config.policies["other"] = config.policies.pop("default")
    elif what == "environment argument":  # below args={}: the refusal named environment.args
        config.environment.args["max_episode_steps"] = 100
    return config


@pytest.mark.parametrize(
    "what, key",
    [
        ("network", "policies.default.policy.args.hidden_sizes"),
        ("algorithm", "policies.default.trainer.type"),
        ("environment", "environment.type"),
        ("policies", r"policies\.[\w.]+"),  # a renamed policy: its old keys are gone
        ("environment argument", r"environment\.args\.max_episode_steps"),
    ],
)
def test_a_change_the_checkpoints_cannot_follow_is_refused(tmp_path, what, key):
    saved, new = make_experiment("cartpole-ppo"), _changed(what)
    latest = tmp_path / run_folder.CHECKPOINTS / "default" / "latest.ckpt"
    latest.parent.mkdir(parents=True)
    latest.write_bytes(b"a saved version")
    with pytest.raises(UserError, match=rf"cannot resume .* with {key}=.*the run was trained"):
        check_compatible(saved, new, tmp_path)
    assert not (tmp_path / run_folder.RESUMES).exists()


def test_a_run_that_saved_nothing_may_be_mended(tmp_path, caplog):
    """``troupe run gather-2p-ppo environment.args.n_agents=3`` fails at its start; its resume
    with ``environment.args.n_agents=2`` was refused: "its checkpoints hold that", of a run
    that had none. It resumes from scratch, saying so."""
    saved = make_experiment("gather-2p-ppo", ["environment.args.n_agents=3"])
    mended = make_experiment("gather-2p-ppo")
    with caplog.at_level(logging.WARNING):
        check_compatible(saved, mended, tmp_path)
    assert "saved no checkpoint: it resumes from scratch with environment.args.n_agents" in (
        caplog.text
    )
    (line,) = (tmp_path / run_folder.RESUMES).read_text().splitlines()
    assert json.loads(line)["changed"] == {"environment.args.n_agents": [3, 2]}


def test_other_changes_are_allowed_and_recorded(tmp_path, caplog):
    saved = make_experiment("cartpole-ppo")
    check_compatible(saved, make_experiment("cartpole-ppo"), tmp_path)
    assert not (tmp_path / run_folder.RESUMES).exists()  # nothing changed, nothing recorded
    new = make_experiment(
        "cartpole-ppo", ["stop.env_frames=1000", "policies.default.policy.args.device=cpu"]
    )
    with caplog.at_level(logging.WARNING):
        check_compatible(saved, new, tmp_path)
    assert "stop.env_frames: 500000 -> 1000" in caplog.text
    (line,) = (tmp_path / run_folder.RESUMES).read_text().splitlines()
    assert json.loads(line)["changed"] == {
        "policies.default.policy.args.device": [None, "cpu"],
        "stop.env_frames": [500000, 1000],
    }


def _allowed_until_a_buffer_is_saved(saved, new, tmp_path) -> None:
    """The resume is allowed in a run folder with no buffer saved (nothing to keep); then a
    buffer is saved in ``tmp_path``."""
    (tmp_path / "unsaved").mkdir()
    check_compatible(saved, new, tmp_path / "unsaved")
    replay = tmp_path / run_folder.CHECKPOINTS / "default" / "replay.ckpt"
    replay.parent.mkdir(parents=True)
    replay.write_bytes(b"a saved buffer")


def test_a_saved_replay_buffer_keeps_its_segment_length(tmp_path):
    """A saved buffer holds whole segments: a resume with another ``actors.segment_length``
    crash-looped its replay worker on the first insert. Refused before anything starts where the
    buffer was saved; allowed where it was not (nothing to keep), or for on-policy runs."""
    saved = make_experiment("cartpole-dqn")
    new = make_experiment("cartpole-dqn", ["actors.segment_length=32"])
    _allowed_until_a_buffer_is_saved(saved, new, tmp_path)
    with pytest.raises(UserError, match=r"with actors\.segment_length=32: policy 'default''s "
                       r"replay buffer \(.*replay\.ckpt\) holds segments of 16 frames; keep "
                       r"actors\.segment_length=16, or remove that file"):  # fmt: skip
        check_compatible(saved, new, tmp_path)
    ppo = make_experiment("cartpole-ppo")
    check_compatible(ppo, make_experiment("cartpole-ppo", ["actors.segment_length=64"]), tmp_path)


class _Bonus:
    segment_fields = {"bonus": ((1,), "float32")}

    def on_segment(self, segment, policy):
        segment.extras.bonus[:] = 1.0


def test_a_saved_replay_buffer_keeps_the_fields_its_actor_callbacks_added(tmp_path):
    """A saved buffer holds the fields its run's actor callbacks declared: a resume without
    them failed its replay worker on the first insert, once every worker had started."""
    from api.registry import callbacks as registered
    from api.registry import register_callback

    register_callback("test-resume-bonus", _Bonus)
    try:  # left registered, it joined the user code of experiments made later in the process
        callbacks = "actor_callbacks=[{'type': 'test-resume-bonus'}]"
        saved = make_experiment("cartpole-dqn", [callbacks])
        new = make_experiment("cartpole-dqn", ["actor_callbacks=[]"])
        _allowed_until_a_buffer_is_saved(saved, new, tmp_path)
        said = r"fields \[\], and its replay buffer \(.*replay\.ckpt\) holds transitions with "
        with pytest.raises(UserError, match=said + r"\['bonus'\]"):
            check_compatible(saved, new, tmp_path)
        again = make_experiment("cartpole-dqn", [callbacks, "stop.env_frames=90000"])
        check_compatible(saved, again, tmp_path)  # the same fields: allowed
    finally:
        registered.unregister("test-resume-bonus")


def _checkpoint(path, field: str, version: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        write_checkpoint(f, {"version": version, field: {"w": np.ones(3, np.float32)}})


def test_a_damaged_checkpoint_is_skipped_for_the_newest_good_one(tmp_path, caplog):
    config = make_experiment("cartpole-ppo")
    policy_dir = tmp_path / run_folder.CHECKPOINTS / "default"
    _checkpoint(policy_dir / LATEST_FILE, "params", 7)
    _checkpoint(policy_dir / "v00000005.ckpt", "params", 5)
    _checkpoint(policy_dir / TRAINER_FILE, "trainer", 7)
    check_checkpoints(tmp_path, config)  # all good: nothing said
    assert not caplog.records
    (policy_dir / LATEST_FILE).write_bytes(b"TROUPEC2" + b"\0" * 40)
    with caplog.at_level(logging.WARNING):
        check_checkpoints(tmp_path, config)
    assert "skipping damaged parameters (latest.ckpt) for v00000005.ckpt" in caplog.text
    (policy_dir / TRAINER_FILE).write_bytes(b"garbage")
    check_checkpoints(tmp_path, config, trainer_state=False)  # an evaluation needs no trainer
    with pytest.raises(RunFolderError, match=r"policy 'default': every trainer state file"):
        check_checkpoints(tmp_path, config)


def test_a_resume_whose_stop_budget_is_spent_is_refused_saying_how_far_the_run_got(tmp_path):
    """stop.wall_seconds and stop.env_frames count the whole run: a resume asking for less than
    the run already had would start every worker and stop at once with exit 0."""
    config = make_experiment("cartpole-ppo", ["stop.wall_seconds=15", "stop.env_frames=1000"])
    check_budget_left(tmp_path, config)  # a run that never wrote a record: nothing to judge
    records = [{"wall_s": 10.0, "env_frames": 400}, {"wall_s": 22.6, "env_frames": 4628}]
    (tmp_path / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(UserError) as refused:
        check_budget_left(tmp_path, config)
    assert str(refused.value) == (
        f"nothing to resume in {tmp_path}: the run already reached stop.wall_seconds=15 (it has "
        "run 23 s) and stop.env_frames=1000 (it has 4628 frames); these budgets count the whole "
        "run, so raise them (e.g. stop.wall_seconds=623 for ten minutes more, "
        "stop.env_frames=9256 for as many frames again)"
    )
    with pytest.raises(UserError, match=r"reached stop.env_frames=1000 \(it has 4628 frames\);"):
        check_budget_left(tmp_path, make_experiment("cartpole-ppo", ["stop.env_frames=1000"]))
    check_budget_left(tmp_path, make_experiment("cartpole-ppo", ["stop.wall_seconds=60"]))
    check_budget_left(tmp_path, make_experiment("cartpole-ppo", ["stop.env_frames=5000"]))


def test_a_resume_whose_trainer_steps_are_spent_is_refused(tmp_path):
    """A run at 187 trainer steps resumed with `stop.trainer_steps=50` trained on to 192 and
    exited 0. Its trainers' last known steps (a record without them, as a resume that ended
    before its trainer was up writes, says nothing) decide, every trained policy's."""
    config = make_experiment("cartpole-ppo", ["stop.trainer_steps=50"])
    records = [{"wall_s": 10.0, "env_frames": 400, "trainer/default/steps": 187.0},
               {"wall_s": 22.6, "env_frames": 4628}]  # fmt: skip
    (tmp_path / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(UserError) as refused:
        check_budget_left(tmp_path, config)
    assert str(refused.value) == (
        f"nothing to resume in {tmp_path}: the run already reached stop.trainer_steps=50 (its "
        "trainers have 'default' 187); these budgets count the whole run, so raise them (e.g. "
        "stop.trainer_steps=374 for as many steps again)"
    )
    check_budget_left(tmp_path, make_experiment("cartpole-ppo", ["stop.trainer_steps=188"]))
    latest = {"wall_s": 30.0, "env_frames": 5000, "trainer/default/steps": 190}
    run_folder.write_json(tmp_path / run_folder.LATEST, latest)
    with pytest.raises(
        UserError, match=r"stop.trainer_steps=188 \(its trainers have 'default' 190"
    ):
        check_budget_left(tmp_path, make_experiment("cartpole-ppo", ["stop.trainer_steps=188"]))
    two = make_experiment("gather-2p-ppo", ["stop.trainer_steps=50"])  # one policy's unknown
    check_budget_left(tmp_path, two)


def test_a_resume_of_a_solved_run_that_asks_for_its_target_again_is_refused(tmp_path):
    """`troupe run --resume R` of a solved run trained on, was solved again by a later version
    and rewrote the summary: its first solve (frames_to_target 129,757, version 63) was lost.
    Asking for a higher target, or none (to train on), is a resume."""
    from system.run.resume_check import check_not_solved

    summary = {
        "solved": True,
        "stop_reason": "eval_return",
        "target": 475.0,
        "frames_to_target": 129757,
        "solved_version": {"policy": "default", "version": 63},
    }
    run_folder.write_json(tmp_path / run_folder.SUMMARY, summary)  # fmt: skip
    for target in ("475", "400"):
        with pytest.raises(UserError) as refused:
            check_not_solved(
                tmp_path, make_experiment("cartpole-ppo", [f"stop.eval_return={target}"])
            )
    assert str(refused.value) == (
        f"nothing to resume in {tmp_path}: the run already met stop.eval_return=475 (version 63 "
        "of 'default') after 129757 frames; to train on, resume with stop.eval_return=None and "
        "a budget (stop.env_frames or stop.wall_seconds), or a higher target"
    )
    check_not_solved(tmp_path, make_experiment("cartpole-ppo", ["stop.eval_return=490"]))
    check_not_solved(tmp_path, make_experiment("cartpole-ppo", ["stop.eval_return=None"]))
    failed_late = {**summary, "stop_reason": "failed", "stop_rule_met": "eval_return"}
    run_folder.write_json(tmp_path / run_folder.SUMMARY, failed_late)  # incomplete: resumable
    check_not_solved(tmp_path, make_experiment("cartpole-ppo"))


def test_the_budget_left_is_judged_from_the_run_s_last_second(tmp_path):
    """A thinned metrics.jsonl's last record may be a minute old; latest.json is the record of
    the last second, written or not, and a SIGKILLed run's budget is judged from it."""
    config = make_experiment("cartpole-ppo", ["stop.env_frames=1000"])
    (tmp_path / METRICS_FILE).write_text(json.dumps({"wall_s": 60.0, "env_frames": 900}) + "\n")
    assert check_budget_left(tmp_path, config) == 900
    run_folder.write_json(tmp_path / run_folder.LATEST, {"wall_s": 95.0, "env_frames": 1300})
    with pytest.raises(UserError, match=r"reached stop.env_frames=1000 \(it has 1300 frames\)"):
        check_budget_left(tmp_path, config)
