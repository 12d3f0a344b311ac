"""What local workers print reaches the controller's own ``sys.stdout`` and ``sys.stderr``
(distributed/launch/worker_output.py), where the live panel prints it above itself.

Workers wrote to the terminal they inherited: one warning left a stale copy of the panel on the
screen and the next panel drawn below it. ``capsys`` sees only what this process writes through
``sys.stdout``/``sys.stderr``, as the panel does; what a worker wrote to its inherited file
descriptors it never saw.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from api import registry
from api.config import make_experiment
from distributed.launch.local import LocalLauncher
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
