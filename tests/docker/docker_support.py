"""What the docker tests share: a run in a thread of the test's process, and what they read
of the run folder and the engine."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from distributed.images import build as images
from distributed.launch import docker_run as dl
from distributed.launch.run import prepare
from distributed.ops import folder
from system.run.metrics_file import last_metrics

IMAGE = os.environ.get("TROUPE_TEST_IMAGE", images.DEFAULT_TAG)
QUICK = ["stop.eval_return=None", "evaluation.workers=1"]


def troupe_run_docker(cwd, run_dir: Path, *overrides: str, env=None) -> subprocess.Popen:
    """``troupe run cartpole-ppo --launcher docker`` in a process group of its own, as a user
    starts it (``env``: more variables, e.g. a ``DOCKER_HOST``)."""
    command = [
        sys.executable, "-m", "distributed.cli", "run", "cartpole-ppo", *QUICK, *overrides,
        "--launcher", "docker", "--image", IMAGE, "--run-dir", str(run_dir), "--no-display",
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env={**os.environ, "COLUMNS": "200", **(env or {})},
    )  # fmt: skip


def wait_until_it_trains(proc: subprocess.Popen, run_dir: Path, timeout: float = 240) -> None:
    """Until the run has counted frames; its output if it ended before."""
    deadline = time.monotonic() + timeout
    while frames(run_dir) == 0 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert frames(run_dir) > 0, proc.stdout.read() if proc.poll() is not None else ""


class BackgroundRun:
    """``run_docker`` in a thread, so a test can act on the run while it goes."""

    def __init__(self, client, run_dir: Path, overrides: list[str]):
        config, self.run_dir = prepare("cartpole-ppo", overrides, str(run_dir), None)
        (self.run_dir / "config.json").write_text(json.dumps(config.to_dict()))
        self.run = dl.run_name(self.run_dir)
        self.output = io.StringIO()
        self.code: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, args=(client, config), daemon=True)
        self.thread.start()

    def _main(self, client, config) -> None:
        try:
            self.code = dl.run_docker(
                config, self.run_dir, image=IMAGE, client=client, out=self.output
            )
        except BaseException as e:  # re-raised by join() in the test's thread
            self.error = e

    def join(self, timeout: float = 300) -> int:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the run did not end in {timeout}s:\n{self.log()}"
        if self.error is not None:
            raise self.error
        assert self.code is not None
        return self.code

    def log(self) -> str:
        """The run's last output, and how it ended if it has."""
        ended = "" if self.thread.is_alive() else f"\n(exit code {self.code}, error {self.error!r})"
        return self.output.getvalue()[-4000:] + ended

    def wait_for(self, condition, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            assert self.thread.is_alive(), f"the run ended before {what}:\n{self.log()}"
            time.sleep(0.2)
        pytest.fail(f"timed out waiting for {what}:\n{self.log()}")


def read_json(path: Path) -> dict:
    return folder.read_json(path) or {}  # missing, or being replaced


def frames(run_dir: Path) -> int:
    """The last record's frames; a line being written is passed over (it failed the test)."""
    record = last_metrics(run_dir)
    return int(record.get("env_frames") or 0) if record else 0


def the_container(client, run: str, worker_id: str):
    filters = {"label": [f"{dl.LABEL_RUN}={run}", f"{dl.LABEL_WORKER}={worker_id}"]}
    (container,) = client.containers.list(all=True, filters=filters)
    return container


def assert_nothing_left(client, run: str) -> None:
    label = {"label": f"{dl.LABEL_RUN}={run}"}
    assert client.containers.list(all=True, filters=label) == []
    assert client.networks.list(filters=label) == []


ROOT = Path(__file__).resolve().parents[2]


def corridor_module(folder: Path, name: str, prefix: str = "") -> Path:
    """The README's Corridor environment as a user's file ``name`` that registers
    ``Corridor-v0`` when imported; ``prefix``: code of the user's that runs first."""
    corridor = (ROOT / "tests" / "distributed" / "user_code" / "corridor.py").read_text()
    module = folder / name
    body = corridor.split('if __name__ == "__main__":')[0]
    module.write_text(prefix + body + 'register("Corridor-v0", Corridor, length=6)\n')
    return module


def deploy_with_import(client, module: Path, command: list[str], cwd: Path, *, add: bool = True):
    """``troupe deploy ... --import MODULE`` (``command``: the words after ``deploy``), with an
    image that holds ``module`` (``troupe image build --add``'s layer; ``add=False``: the test
    image, which does not)."""
    from distributed.images.user_layer import add_user_code

    tag = f"troupe-worker:test-{module.stem.replace('_', '-')}" if add else IMAGE
    if add:
        add_user_code(client, IMAGE, tag, [module])
    try:
        return subprocess.run(
            [sys.executable, "-m", "distributed.cli", "deploy", command[0], "--import",
             str(module), *command[1:], "--image", tag],
            cwd=cwd, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        if add:
            client.images.remove(tag, force=True)


def assert_refused_for_the_missing_file(result, module: Path) -> None:
    """The deploy was refused, before anything was made, with the worker's own message."""
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 1, said[-3000:]
    assert f"image {IMAGE} cannot import the run's code, as each worker would" in said, said
    assert f"troupe image build --add {module.name}" in said, said
