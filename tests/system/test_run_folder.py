"""The run folder's one writer and guard, and the end of a run's summary (system.run.finish)."""

from __future__ import annotations

import json
import os
import shutil
import threading

import pytest

from api.config import make_experiment
from api.errors import RunFolderError
from system import run_folder
from system.errors import WorkerFailure
from system.run.finish import finish_run
from system.run.report import read_metrics
from system.run.stopping import EvaluationWindows


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / run_folder.WORKERS
    run_folder.write_json(path, {"a": 1})

    def half(f):
        f.write(b'{"a": ')
        raise OSError(28, "No space left on device")

    with pytest.raises(RunFolderError, match=r"workers\.json"):
        run_folder.write_atomically(path, half)
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == [run_folder.WORKERS]


def test_the_guard_says_the_first_failure_once_and_hands_each_on(tmp_path, caplog):
    seen: list[RunFolderError] = []
    guard = run_folder.FolderGuard(tmp_path, lambda e, by: seen.append(e))
    assert guard.write(lambda: run_folder.write_json(tmp_path / "x.json", 1))

    def full():
        raise OSError(28, "No space left on device")

    assert not guard.write(full) and not guard.write(full)
    assert len(seen) == 2 and guard.error is seen[0]
    assert [r.levelname for r in caplog.records] == ["ERROR"]  # said once
    by: list[str] = []  # who failed: the controller's own write, or the worker that reported it
    guard.on_error = lambda e, who: by.append(who)
    guard.write(full)
    guard.failed(RunFolderError("cannot write x: No space left on device"), by="params")
    assert by == ["controller", "params"]


def _windows() -> EvaluationWindows:
    return EvaluationWindows(475.0, 10, 1, policy=None, max_return=500.0, envs=1)


def test_a_failure_after_the_stop_rule_makes_the_run_failed(tmp_path):
    config = make_experiment("cartpole-ppo")
    (tmp_path / run_folder.METRICS).write_text(
        json.dumps({"wall_s": 1.0, "env_frames": 100, "eval_return": 480.0}) + "\n"
    )
    summary = finish_run(
        config, tmp_path, wall_s=2.0, stop_reason="eval_return",
        failure=WorkerFailure("params", "params did not finish its stop"),
        evaluation=_windows(), extra={"curriculum_stage": 2},
        write=lambda w: (w(), True)[1],
    )  # fmt: skip
    assert summary["stop_reason"] == "failed" and summary["stop_rule_met"] == "eval_return"
    assert summary["curriculum_stage"] == 2 and "params did not finish" in summary["failure"]
    assert json.loads((tmp_path / run_folder.SUMMARY).read_text())["stop_reason"] == "failed"
    assert (tmp_path / run_folder.LEARNING_CURVE).exists() and read_metrics(tmp_path)


@pytest.mark.parametrize("version, untrained", [(0, ["default"]), (7, None)])
def test_a_run_that_never_stepped_its_trainer_says_so(tmp_path, version, untrained):
    """Every episode dropped (an environment that raised, rebuilt by on_env_error=reset): 179k
    frames, not one trainer step, and a summary that read as a run's like any other, exit 0."""
    record = {"wall_s": 1.0, "env_frames": 179_395, "policy/default/version": version}
    (tmp_path / run_folder.METRICS).write_text(json.dumps(record) + "\n")
    summary = finish_run(
        make_experiment("cartpole-ppo"), tmp_path, wall_s=2.0, stop_reason="wall_seconds",
        failure=None, evaluation=_windows(), extra={}, write=lambda w: (w(), True)[1],
    )  # fmt: skip
    assert summary.get("untrained") == untrained, summary
    from distributed.launch.last_lines import untrained_line

    assert untrained_line({"untrained": ["default"], "env_frames": 179_395}).startswith(
        "never trained: no trainer step for default in 179,395 frames"
    )


@pytest.mark.parametrize(
    "overrides, episodes, never_ready, said",
    [
        ([], 0, [], "no_greedy_episode"),
        ([], 1, [], "few_greedy_episodes"),
        ([], 9, [], "few_greedy_episodes"),
        ([], 10, [], None),  # cartpole-ppo's evaluation.episodes: a return, build_summary's
        ([], 0, ["eval/0"], None),  # never_ready says it: "no greedy evaluation was played"
        (["evaluation.workers=0", "stop.eval_return=None"], 0, [], None),
    ],
)
def test_a_run_whose_evaluation_ended_too_few_episodes_says_so(
    tmp_path, overrides, episodes, never_ready, said
):
    """A 25-second pong-ppo run (its evaluation actor was up, playing a whole game) and a short
    connect4-selfplay run (137 of its 300 greedy episodes) ended with ``best_eval_return: None``
    and no word of why."""
    from distributed.launch.last_lines import (
        NO_GREEDY_EPISODE_LINE,
        few_greedy_episodes_line,
        warning_lines,
    )

    record = {"wall_s": 1.0, "env_frames": 9, "episode_return": 12.0}  # a training one ended
    (tmp_path / run_folder.METRICS).write_text(json.dumps(record))
    windows = _windows()
    for _ in range(episodes):
        windows.add(21.0, env="eval/0/0")
    summary = finish_run(
        make_experiment("cartpole-ppo", overrides), tmp_path, wall_s=25.0,
        stop_reason="wall_seconds", failure=None, evaluation=windows, extra={},
        write=lambda w: (w(), True)[1], never_ready=never_ready,
    )  # fmt: skip
    keys = {"no_greedy_episode", "few_greedy_episodes"}
    assert {k for k in keys if k in summary} == ({said} if said else set()), summary
    lines = [line for line in warning_lines(summary) if "greedy episode" in line]
    if said == "no_greedy_episode":
        assert lines == [NO_GREEDY_EPISODE_LINE]  # a training episode ended: more time
        none_ended = {**summary, "best_episode_return": None, "env_frames": 22_688}
        assert [x for x in warning_lines(none_ended) if x.startswith("no episode")] == [
            "no episode ended in 22,688 frames, neither a training nor a greedy one, so the run "
            "has no return: an environment without a time limit may never end one (give it "
            "one: environment.args.max_episode_steps=N for a gymnasium id), or give it more time"
        ]
    elif said:
        assert summary[said] == {"ended": episodes, "needed": 10}
        assert lines == [few_greedy_episodes_line(summary[said])]
        assert lines[0].startswith(f"only {episodes} of the 10 greedy episodes")
    else:
        assert lines == []


def test_a_summary_that_cannot_be_written_says_so(tmp_path):
    summary = finish_run(
        make_experiment("cartpole-ppo"), tmp_path, wall_s=1.0, stop_reason="wall_seconds",
        failure=None, evaluation=_windows(), extra={}, write=lambda w: False,
    )  # fmt: skip
    assert summary["summary_written"] is False and summary["stop_reason"] == "wall_seconds"


def test_a_run_folder_removed_mid_run_fails_the_run_and_is_not_written_again(tmp_path, caplog):
    """`rm -rf` of a running run's folder: metrics.jsonl went on into its unlinked file, the
    next writes made a new folder of the same name, and the run exited 0."""
    folder = tmp_path / "run"
    folder.mkdir()
    seen: list[RunFolderError] = []
    guard = run_folder.FolderGuard(folder, lambda e, by: seen.append(e))
    assert guard.write(lambda: run_folder.write_json(folder / "x.json", 1))
    shutil.rmtree(folder)
    assert not guard.write(lambda: run_folder.write_json(folder / "x.json", 2))
    assert "was removed while the run went on: its metrics" in str(seen[0])
    assert not folder.exists()  # the write was not done: it would have made the folder again
    assert not guard.write(lambda: run_folder.write_json(folder / "x.json", 3))
    assert not folder.exists()

    again = tmp_path / "again"
    again.mkdir()
    guard = run_folder.FolderGuard(again, lambda e, by: seen.append(e))
    shutil.rmtree(again)
    (again / "checkpoints").mkdir(parents=True)  # what another process's write makes
    assert not guard.write(lambda: run_folder.write_json(again / "x.json", 1))
    assert "a folder of that name is there again, not the run's" in str(seen[-1])
    assert not guard.write(lambda: run_folder.write_json(again / "y.json", 1))
    assert not (again / "y.json").exists()


def test_a_run_folder_removed_during_a_write_names_the_removal(tmp_path):
    """`rm -rf` takes a while: a write that began with the folder there fails with a bare "No
    such file or directory" (the official CI saw it). The cause is the removal, and it is named;
    a worker's report of such a failure, after the removal, is named the same way."""
    folder = tmp_path / "run"
    folder.mkdir()
    seen: list[RunFolderError] = []
    guard = run_folder.FolderGuard(folder, lambda e, by: seen.append(e))

    def removed_midway() -> None:
        shutil.rmtree(folder)
        (folder / "metrics.jsonl").open("a")  # what the write went on to do

    assert not guard.write(removed_midway)
    assert len(seen) == 1 and "was removed while the run went on" in str(seen[0])
    assert guard.gone and guard.error is seen[0]

    other = tmp_path / "other"
    other.mkdir()
    guard = run_folder.FolderGuard(other, lambda e, by: seen.append(e))
    shutil.rmtree(other)
    guard.failed(RunFolderError(f"cannot write {other / 'checkpoints'}: No such file or directory"))
    assert "was removed while the run went on" in str(seen[-1]) and guard.gone


def test_a_run_folder_emptied_but_left_fails_the_run(tmp_path):
    """`rm -rf` that empties the folder but cannot remove it, as a worker wrote a checkpoint in
    it meanwhile (the fault test saw it): the run went on for ever, its record going into an
    unlinked metrics.jsonl, its other files written into the emptied folder."""
    seen: list[RunFolderError] = []
    folder = tmp_path / "kept"
    folder.mkdir()
    metrics = folder / run_folder.METRICS
    metrics.write_text("{}\n")
    guard = run_folder.FolderGuard(folder, lambda e, by: seen.append(e))
    guard.keep(metrics)
    metrics.unlink()  # the folder's files went, the folder stayed
    assert not guard.write(lambda: run_folder.write_json(folder / "x.json", 1))
    assert (
        f"the run folder {folder} was emptied while the run went on (metrics.jsonl removed)"
        in str(seen[-1])
    )
    assert not (folder / "x.json").exists() and guard.gone
    guard.close()

    metrics.write_text("{}\n")
    guard = run_folder.FolderGuard(folder, lambda e, by: seen.append(e))
    guard.keep(metrics)
    assert guard.write(lambda: None)
    (folder / "other").write_text("{}\n")
    os.replace(folder / "other", metrics)  # the name leads elsewhere: the run's record is gone
    assert not guard.write(lambda: None) and "metrics.jsonl removed" in str(seen[-1])
    assert "the run's record is no longer whole" in str(seen[-1])  # not "its logs went too"
    guard.close()


def test_a_kept_file_that_cannot_be_stat_ed_is_not_taken_for_removed(tmp_path, monkeypatch):
    """Only a name that leads nowhere is a removal; a disk error or a permission on the way
    proves nothing, and the write that follows says what failed."""
    import errno

    folder = tmp_path / "run"
    folder.mkdir()
    metrics = folder / run_folder.METRICS
    metrics.write_text("{}\n")
    seen: list[RunFolderError] = []
    guard = run_folder.FolderGuard(folder, lambda e, by: seen.append(e))
    guard.keep(metrics)
    real_stat = os.stat

    def failing(path, *args, **kwargs):
        if os.fspath(path) == str(metrics):
            raise OSError(failing.errno, os.strerror(failing.errno), str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(run_folder.os, "stat", failing)
    failing.errno = errno.EIO
    assert guard.write(lambda: None) and not seen
    failing.errno = errno.ESTALE  # NFS: removed on the server
    assert not guard.write(lambda: None) and "metrics.jsonl removed" in str(seen[-1])
    guard.close()


def test_a_write_failing_as_the_removal_begins_waits_for_it(tmp_path, monkeypatch):
    """What the official CI met: `rm -rf` had emptied `logs/` but not yet unlinked the folder
    when a write failed, so the folder was still there. A vanished path waits a moment for the
    folder to go; one that vanished alone is reported as it is."""
    folder = tmp_path / "run"
    (folder / "logs").mkdir(parents=True)
    seen: list[RunFolderError] = []
    guard = run_folder.FolderGuard(folder, lambda e, by: seen.append(e))

    def logs_removed_first() -> None:
        shutil.rmtree(folder / "logs")
        threading.Timer(0.3, shutil.rmtree, [folder]).start()  # the rest of the removal
        (folder / "logs" / "controller.log").open("a")

    assert not guard.write(logs_removed_first)
    assert len(seen) == 1 and "was removed while the run went on" in str(seen[0])

    monkeypatch.setattr(run_folder, "REMOVAL_WAIT_S", 0.3)
    (folder / "logs").mkdir(parents=True)
    guard = run_folder.FolderGuard(folder, lambda e, by: seen.append(e))
    assert not guard.write(lambda: (folder / "nothing" / "x").open("a"))
    assert "No such file or directory" in str(seen[-1]) and not guard.gone
    assert folder.exists()


@pytest.mark.parametrize("tail", ["", "a line being written"])
def test_the_last_lines_are_read_back_from_the_end_each_byte_once(tmp_path, monkeypatch, tail):
    path = tmp_path / "worker.log"
    path.write_text("".join(f"line {i} " + "x" * (i % 40) + "\n" for i in range(500)) + tail)
    whole = path.read_text().splitlines()
    read = []

    def counting_open(*args, **kwargs):
        f = open(*args, **kwargs)  # noqa: SIM115 - last_lines closes it
        plain_read = f.read
        f.read = lambda size=-1: read.append(len(data := plain_read(size))) or data
        return f

    monkeypatch.setattr(run_folder, "open", counting_open, raising=False)
    for n in (1, 2, 37, 499, 500, 501, 2000):
        read.clear()
        assert run_folder.last_lines(path, n, block=16) == whole[-n:]
        assert sum(read) <= path.stat().st_size  # before, every block re-read all after it
    assert run_folder.last_lines(path, 0) == []
    assert run_folder.last_lines(tmp_path / "absent.log", 3) == []
    (tmp_path / "empty.log").write_bytes(b"")
    assert run_folder.last_lines(tmp_path / "empty.log", 3) == []


@pytest.mark.parametrize("under", ["", "sub"])
def test_a_file_where_the_run_folder_must_be_is_named_as_such(tmp_path, under):
    """`--run-dir` naming a file (or a folder under one) said "File exists; check the disk
    holding the run folder": nothing to do with the disk."""
    from distributed.launch.run import prepare

    afile = tmp_path / "notes.txt"
    afile.write_text("not a run")
    folder = afile / under if under else afile
    with pytest.raises(RunFolderError) as caught:
        prepare("cartpole-ppo", [], str(folder), None)
    assert str(caught.value) == (
        f"cannot write {folder}: {afile} is a file where a folder must be; pick another "
        "--run-dir (or move the file away)"
    )


def test_a_solved_run_resumed_and_not_solved_again_keeps_the_record_of_its_solve(tmp_path):
    """A solved run resumed with `stop.eval_return=None` rewrote summary.json without
    `solved_version`: nothing said which version had met the target. The new summary carries it
    (and the next resume's too), with its checkpoint while that is kept, and `troupe eval` of the
    folder says that the latest versions play and how to play the solved one."""
    from system.run.evaluation import earlier_solve_words

    config = make_experiment("cartpole-ppo")
    (tmp_path / run_folder.METRICS).write_text(json.dumps({"wall_s": 1.0, "env_frames": 9}) + "\n")
    solved = {"policy": "default", "version": 83}
    run_folder.write_json(tmp_path / run_folder.SUMMARY, {"solved_version": solved})
    checkpoint = tmp_path / "checkpoints" / "default" / "v00000083.ckpt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"x")

    def resumed() -> dict:
        return finish_run(
            config, tmp_path, wall_s=2.0, stop_reason="env_frames", failure=None,
            evaluation=_windows(), extra={}, write=lambda w: (w(), True)[1],
        )  # fmt: skip

    summary = resumed()
    assert "solved_version" not in summary
    assert summary["earlier_solved_version"] == {**solved, "checkpoint": str(
        checkpoint.relative_to(tmp_path))}  # fmt: skip
    assert earlier_solve_words(tmp_path) == (
        "the latest versions play: this run was resumed after version 83 of 'default' solved "
        f"it, and was not solved again; to play that one: troupe eval {checkpoint}"
    )
    checkpoint.unlink()  # pruned since
    assert resumed()["earlier_solved_version"] == solved  # a second resume keeps it
    assert earlier_solve_words(tmp_path).endswith(
        "that version's checkpoint file is no longer kept"
    )
    (tmp_path / run_folder.SUMMARY).unlink()
    assert "earlier_solved_version" not in resumed()  # a first run: nothing earlier
    assert earlier_solve_words(tmp_path) is None
