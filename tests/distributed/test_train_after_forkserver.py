"""``troupe.train`` from a program that already uses multiprocessing's forkserver.

The controller is forked from the launching program. It once inherited that program's
forkserver handle, whose process is not its child: starting its first worker failed in
``os.waitpid`` and the run ended at once with exit code 1 and no summary. The program here
starts a forkserver of its own first, as a user's data loader or an earlier library call would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.multiprocess


def test_a_program_with_its_own_forkserver_can_train(tmp_path):
    script = textwrap.dedent(f"""
        import multiprocessing as mp, os, sys
        import troupe

        def child():
            pass

        if __name__ == "__main__":
            # this program's own forkserver, started and used before it trains
            ctx = mp.get_context("forkserver")
            p = ctx.Process(target=child)
            p.start()
            p.join()
            result = troupe.train("cartpole-ppo", ["stop.env_frames=3000", "stop.eval_return=None",
                                                   "evaluation.workers=0"],
                                  run_dir={str(tmp_path / "run")!r})
            print("exit", result.exit_code)
            # its forkserver is still its own: it starts another child
            p = ctx.Process(target=child)
            p.start()
            p.join()
            print("child", p.exitcode)
    """)
    (tmp_path / "program.py").write_text(script)
    done = subprocess.run(
        [sys.executable, str(tmp_path / "program.py")], capture_output=True, text=True,
        timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "exit 0" in done.stdout, output[-3000:]
    assert "child 0" in done.stdout, output[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "env_frames" and summary["env_frames"] >= 3000
