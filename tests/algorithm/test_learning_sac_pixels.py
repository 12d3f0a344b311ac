"""Learning check of SAC from pixels: ``troupe train DotOffset-v0 --algo sac``, as a user runs it
on an image task of their own (every role a process), must read the dots: a greedy return of
-1 (a mean error of 0.1 a step) where the best blind action scores -3.6. Run alone with
``pytest -m learning -s tests/algorithm/test_learning_sac_pixels.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_support import finish, start

pytestmark = [pytest.mark.learning, pytest.mark.multiprocess]

TASK = Path(__file__).with_name("dot_offset.py")


def test_sac_reads_the_dots_of_an_image_task_within_20k_frames(tmp_path):
    run_dir = tmp_path / "run"
    arguments = ["train", "DotOffset-v0", "--algo", "sac", "--import", str(TASK)]
    arguments += ["target=-1", "frames=20000", "--run-dir", str(run_dir), "--no-display"]
    out = finish(start(arguments), 900)
    summary = json.loads((run_dir / "summary.json").read_text())
    print(
        f"DotOffset-v0 sac: solved={summary['solved']} at {summary['frames_to_target']} frames, "
        f"eval {summary['eval_window_means']}, {summary['wall_s']:.0f}s",
        flush=True,
    )
    assert summary["solved"], out[-3000:]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["policies"]["default"]["policy"]["args"]["shift_pad"] == 4
    workers = json.loads((run_dir / "workers.json").read_text())
    assert all(w["restarts"] == 0 for w in workers.values()), workers
