"""A run's user code (api.code): the launcher's own registrations and absolute import paths go into
``config.code``, and a fresh worker process (another folder, another registry) that loads that
code builds the component from the user's file, whether registered again or imported."""

from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import api.code
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
registrations = [RegistrationConfig(**r) for r in code["registrations"]]
load_code(CodeConfig(code["imports"], registrations, code["sources"]))
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


PACKAGED = """
from api import registry


class Corridor:
    def __init__(self, length=1):
        self.length = length


registry.register_environment("{name}", "{package}.corridors:Corridor", length=5)
"""


def _package(root, package: str, name: str):
    """``root/package/corridors.py``, registering its class by its dotted name (as one does for
    an installed package)."""
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    path = root / package / "corridors.py"
    path.write_text(PACKAGED.format(name=name, package=package))
    return path


@pytest.fixture
def isolated(monkeypatch):
    """sys.path, the working-directory roots and the modules as they were."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(user_code, "_local_roots", [])
    modules = set(sys.modules)
    yield
    for name in set(sys.modules) - modules:
        del sys.modules[name]
    for name in ("test-code-packaged", "test-code-local"):
        if name in registry.environments.names():
            registry.environments.unregister(name)


def test_a_file_of_a_package_is_imported_by_its_dotted_name(tmp_path, isolated):
    """``--import my_package/corridors.py``: what the file registers as
    ``my_package.corridors:Corridor`` resolves, though the package is not installed."""
    path = _package(tmp_path, "troupe_test_pkg", "test-code-packaged")
    module = user_code.import_file(path)
    assert module.__name__ == "troupe_test_pkg.corridors"
    assert registry.environments.make("test-code-packaged").length == 5
    assert user_code.import_file(path) is module  # once per process
    # a package named as an installed module is not that module: the file is imported alone
    other = _package(tmp_path / "elsewhere", "json", "test-code-local")
    assert user_code.import_file(other).__name__ != "json.corridors"
    # a file that fails says which, as any user file does
    broken = _package(tmp_path / "broken", "troupe_test_broken", "test-code-local")
    broken.write_text("import numpy\n1 / 0\n")
    with pytest.raises(RegistryError, match=r"importing .*corridors.py failed: ZeroDivisionError"):
        user_code.import_file(broken)


def test_a_file_importing_a_package_not_installed_says_to_install_it(tmp_path, isolated):
    """The file is not at fault, and "fix the file" sent a user of a worker image without the
    package the wrong way: they need it installed where the workers run."""
    path = tmp_path / "grid_envs.py"
    path.write_text("import troupe_test_not_installed.envs\n")
    with pytest.raises(RegistryError) as e:
        user_code.import_file(path)
    assert str(e.value) == (
        f"importing {path} failed: ModuleNotFoundError: No module named "
        "'troupe_test_not_installed' ('troupe_test_not_installed' is not installed here: pip "
        "install the package that provides it (a worker image: troupe image build --pip "
        "PACKAGE, or --add the file if it is your own))"
    )
    with pytest.raises(RegistryError) as e:  # --import by module name, as a package installs it
        user_code.import_code("troupe_test_not_installed")
    assert str(e.value).endswith(
        "name an installed module or a .py file (a worker image: troupe image build --pip "
        "PACKAGE or --add FOLDER)"
    )


def test_a_module_of_the_working_directory_travels_as_its_file(tmp_path, isolated, monkeypatch):
    """``troupe run --import my_package.corridors`` where ``my_package/`` is in the folder the
    command runs in: importable here (as ``python -m`` would have it), its file recorded beside
    the name (in config.json), and the registration's source too, so a worker in another
    folder builds it, while a worker image holding the package (``troupe image build --add
    my_package/``) imports it by name."""
    monkeypatch.chdir(tmp_path)
    path = _package(tmp_path, "troupe_test_local", "test-code-local")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("troupe_test_local.corridors")
    user_code.add_working_directory()
    assert sys.path[-1] == str(tmp_path)  # after what is installed: it shadows nothing
    load_code(CodeConfig(imports=["troupe_test_local.corridors"]))
    code = with_user_code(CodeConfig(imports=["troupe_test_local.corridors", "json"]))
    assert code.imports == ["troupe_test_local.corridors", "json"]
    assert code.sources == {"troupe_test_local.corridors": str(path)}  # json is installed
    (mine,) = [r for r in code.registrations if r.name == "test-code-local"]
    assert (mine.entry_point, mine.source) == ("troupe_test_local.corridors:Corridor", str(path))
    worker = WORKER.replace(NAME, "test-code-local")
    out = subprocess.run(
        [sys.executable, "-c", worker, json.dumps(dataclasses.asdict(code))],
        cwd=tmp_path.parent, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [5, str(path)]
    # run from a checkout of an installed package (ours, editable): its modules are not the
    # user's, they stay names
    monkeypatch.setattr(user_code, "_local_roots", [str(Path(api.code.__file__).parents[1])])
    assert user_code.local_file("api.code") is None
