"""A run's user code (api.code): the launcher's own registrations and absolute import paths go into
``config.code``, and a fresh worker process (another folder, another registry) that loads that
code builds the component from the user's file, whether registered again or imported."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from api import registry, user_code
from api.code import CodeConfig, RegistrationConfig, attach_user_code, load_code, with_user_code
from api.config import make_experiment
from api.errors import RegistryError

NAME = "test-code-corridor"
CORRIDOR = f'''
from api import registry

class Corridor:
    """A corridor of a given length."""

    def __init__(self, length=1):
        self.length = length

registry.register_environment("{NAME}", Corridor, length=7)
'''
WORKER = f"""
import json, sys
from api import registry
from api.code import CodeConfig, RegistrationConfig, load_code
code = json.loads(sys.argv[1])
load_code(CodeConfig(code["imports"], [RegistrationConfig(**r) for r in code["registrations"]]))
env = registry.environments.make("{NAME}")
print(json.dumps([env.length, sys.modules[type(env).__module__].__file__]))
"""


@pytest.fixture
def corridor(tmp_path, monkeypatch):
    """The user's file, imported here as a script's launch would import it."""
    path = tmp_path / "troupe_test_corridor.py"
    path.write_text(CORRIDOR)
    monkeypatch.setattr(sys, "path", list(sys.path))  # import_file puts tmp_path on it
    user_code.import_file(path)
    yield path
    registry.environments.unregister(NAME)
    sys.modules.pop("troupe_test_corridor", None)


def _in_a_worker(code: CodeConfig, cwd) -> list:
    cwd.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", WORKER, json.dumps(dataclasses.asdict(code))],
        cwd=cwd, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_launchers_registrations_travel_with_the_config(corridor, tmp_path):
    config = dataclasses.replace(make_experiment("cartpole-ppo"), code=CodeConfig())
    mine = [r for r in attach_user_code(config).code.registrations if r.name == NAME]
    assert mine == [
        RegistrationConfig(
            kind="environment", name=NAME, entry_point="troupe_test_corridor:Corridor",
            source=str(corridor), kwargs={"length": 7},
            description="A corridor of a given length.",
        )
    ]  # fmt: skip
    assert config.code == CodeConfig()  # a copy: the config given is as it was
    # a worker registers it again and imports the class from its file (not on its path)
    assert _in_a_worker(attach_user_code(config).code, tmp_path / "w") == [7, str(corridor)]


def test_a_worker_imports_the_runs_files_by_absolute_path(corridor, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = CodeConfig(imports=[corridor.name, "json"])
    code = dataclasses.replace(with_user_code(code), registrations=[])
    assert code.imports == [str(corridor), "json"]  # module names stay names
    assert _in_a_worker(code, tmp_path / "w") == [7, str(corridor)]


def test_this_processes_registration_replaces_a_shipped_one_of_the_same_name(corridor):
    shipped = [
        RegistrationConfig("environment", NAME, "old:Corridor"),
        RegistrationConfig("policy", "test-code-other", "other:Policy"),
    ]
    got = {
        (r.kind, r.name): r.entry_point
        for r in with_user_code(CodeConfig([], shipped)).registrations
    }
    assert got[("environment", NAME)] == "troupe_test_corridor:Corridor"
    assert got[("policy", "test-code-other")] == "other:Policy"


def test_a_registration_of_an_unknown_kind_is_refused():
    code = CodeConfig(registrations=[RegistrationConfig("widget", "w", "m:W")])
    with pytest.raises(RegistryError, match="unknown kind 'widget' of 'w'"):
        load_code(code)
