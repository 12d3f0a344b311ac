"""What local workers print reaches the controller's own ``sys.stdout`` and ``sys.stderr``
(distributed/launch/worker_output.py), where the live panel prints it above itself.

Workers wrote to the terminal they inherited: one warning left a stale copy of the panel on the
screen and the next panel drawn below it. ``capsys`` sees only what this process writes through
``sys.stdout``/``sys.stderr``, as the panel does; what a worker wrote to its inherited file
descriptors it never saw.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from api import registry
from api.config import make_experiment
from distributed.launch.local import LocalLauncher
from distributed.launch.worker_output import WorkerOutput, write_to
from system.run.controller import Controller

PRINTING = Path(__file__).parent / "user_code" / "printing_env.py"

pytestmark = pytest.mark.multiprocess


def _run(tmp_path: Path, overrides: list[str]) -> dict:
    registry.register_environment(
        "printing-cartpole", "printing_env:PrintingCartPole", source=str(PRINTING), override=True
    )
    try:
        config = make_experiment("cartpole-ppo", [
            "environment.type=printing-cartpole", "actors.workers=1", "actors.envs_per_worker=2",
            "evaluation.workers=0", "stop.eval_return=None", "stop.env_frames=3000", *overrides,
        ])  # fmt: skip
    finally:
        registry.environments.unregister("printing-cartpole")
    return Controller(config, tmp_path / "run", LocalLauncher(), display=False).run()


def _pids(text: str, what: str) -> set[str]:
    return {line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(what)}


@pytest.mark.parametrize("partial", [False, True])
def test_what_a_worker_prints_reaches_the_controllers_own_streams(tmp_path, capsys, partial):
    summary = _run(tmp_path, [f"environment.args.partial={partial}"])
    assert summary["stop_reason"] == "env_frames", summary
    out, err = capsys.readouterr()
    # the actor's environments, and those the trainer and policy worker make to read spaces
    printed = _pids(out, "printed by pid")
    assert printed and printed == _pids(out, "written to fd 1 by pid"), out
    assert _pids(err, "to stderr by pid") == printed, err  # a last line without its newline too
    assert "to stderr" not in out and "printed by" not in err


def _child(writers, text: bytes) -> None:
    write_to(writers)
    os.write(1, text)  # a line, then one without its newline, as a process's last words
    os.write(2, b"to stderr\n")


def test_each_line_comes_whole_and_a_drained_output_takes_new_workers(capsys):
    """Workers started after a drain (a launcher used again) are read by a new thread: pipes
    nobody reads fill, and a worker writing to a full one blocks."""
    output = WorkerOutput()
    for n in range(2):
        writers = output.pipes()
        process = multiprocessing.get_context("fork").Process(
            target=_child, args=(writers, f"one {n}\ntwo {n} without end".encode())
        )
        process.start()
        WorkerOutput.started(writers)
        process.join(timeout=30)
        output.drain(timeout_s=5.0)
        out, err = capsys.readouterr()
        assert out == f"one {n}\ntwo {n} without end\n" and err == "to stderr\n", (out, err)
