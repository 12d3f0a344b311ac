"""The half of the image code check that runs in a worker image (``python -m
distributed.images.code_check``), run here as a real process: it imports what a worker would,
and says why it cannot with its own exit code. The half that starts the container is tested
against a real engine in ``tests/docker/test_swarm.py``."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from api.code import CodeConfig, RegistrationConfig
from distributed.images.code_check import (
    CANNOT_BUILD,
    CANNOT_IMPORT,
    MISSING_PACKAGE,
    code_from,
    needs_check,
)

ROOT = Path(__file__).resolve().parents[2]
CORRIDOR = Path(__file__).resolve().parent / "user_code" / "corridor.py"


def _corridor_module(folder: Path) -> Path:
    """The README's corridor script as a module that registers its environment on import."""
    module = folder / "my_corridor.py"
    body = CORRIDOR.read_text().split('if __name__ == "__main__":')[0]
    module.write_text(body + 'register("Corridor-v0", Corridor, length=6)\n')
    return module


def _check(code: CodeConfig, cwd: Path, environment: dict | None = None):
    document = json.dumps(dataclasses.asdict(code))
    command = [sys.executable, "-m", "distributed.images.code_check", document]
    if environment is not None:
        command.append(json.dumps(environment))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}  # no user code folder of ours
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def test_code_goes_through_json_whole():
    code = CodeConfig(
        imports=["/x/my_envs.py", "my_pkg.envs"],
        registrations=[
            RegistrationConfig(
                "environment",
                "Corridor-v0",
                "m:C",
                "/x/m.py",
                ["/x/r.py"],
                {"length": 6},
                "a corridor",
            )
        ],
        sources={"my_pkg.envs": "/x/my_pkg/envs.py"},
    )
    assert code_from(json.dumps(dataclasses.asdict(code))) == code
    assert needs_check(code) and not needs_check(CodeConfig())


def test_a_file_that_is_there_imports_and_its_registration_loads(tmp_path):
    module = _corridor_module(tmp_path)
    code = CodeConfig(
        imports=[str(module)],
        registrations=[
            RegistrationConfig("environment", "Corridor-v1", "my_corridor:Corridor", str(module))
        ],
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = _check(code, elsewhere)
    assert result.returncode == 0, result.stderr


def test_a_missing_file_is_named_with_its_remedy_and_its_own_exit_code(tmp_path):
    code = CodeConfig(imports=[str(tmp_path / "gone" / "my_envs.py")])
    result = _check(code, tmp_path)
    assert result.returncode == CANNOT_IMPORT, result.stderr
    said = " ".join(result.stderr.split())
    assert "cannot import" in said and "my_envs.py" in said, said
    assert "troupe image build --add my_envs.py" in said, said


def test_a_registration_whose_module_is_nowhere_is_refused(tmp_path):
    """Registered by a script whose file the image lacks: ``load_code`` registers it lazily, so
    only loading its entry point finds the gap (a worker finds it as it builds the env)."""
    registration = RegistrationConfig(
        "environment", "Corridor-v2", "my_gone_corridor:Corridor", str(tmp_path / "gone.py")
    )
    result = _check(CodeConfig(registrations=[registration]), tmp_path)
    assert result.returncode == CANNOT_IMPORT, result.stderr
    assert "gone.py" in result.stderr, result.stderr


ENVIRONMENTS = """\
from api.errors import UserError


class NeedsPackage:
    def __init__(self, **kwargs):
        try:
            import troupe_no_such_package  # noqa: F401
        except ImportError as e:
            raise UserError("NeedsPackage-v0 needs troupe_no_such_package") from e


class NoDisplay:
    def __init__(self, **kwargs):
        raise RuntimeError("no display here")
"""


def test_the_runs_environment_is_built_and_a_missing_package_has_its_own_exit_code(tmp_path):
    """``troupe deploy k8s pong-ppo`` with an image built without the atari extra deployed every
    pod; the run then ended on "Atari-v0 needs ale-py". The check now builds the environment as
    an actor does: a missing package is refused, another failure is only warned of."""
    module = tmp_path / "my_needs.py"
    module.write_text(ENVIRONMENTS)
    registrations = [
        RegistrationConfig("environment", name, f"my_needs:{cls}", str(module))
        for name, cls in (("NeedsPackage-v0", "NeedsPackage"), ("NoDisplay-v0", "NoDisplay"))
    ]
    code = CodeConfig(imports=[str(module)], registrations=registrations)
    missing = _check(code, tmp_path, {"type": "NeedsPackage-v0", "args": {}})
    assert missing.returncode == MISSING_PACKAGE, missing.stderr
    assert "NeedsPackage-v0 needs troupe_no_such_package" in missing.stderr
    other = _check(code, tmp_path, {"type": "NoDisplay-v0", "args": {}})
    assert other.returncode == CANNOT_BUILD and "no display here" in other.stderr
    built = _check(
        CodeConfig(), tmp_path, {"type": "CartPole-v1", "args": {"max_episode_steps": 9}}
    )
    assert built.returncode == 0, built.stderr
