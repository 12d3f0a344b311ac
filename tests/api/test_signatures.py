"""The source-read signatures the config check uses must agree with the imported ones."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from api.config.arguments import _hints, parse_interval
from api.registry import REGISTRIES
from api.signatures import UNKNOWN, static_class_attribute, static_signature


def _registered(kind: str) -> list:
    registry = REGISTRIES[kind]
    return [
        registry.spec(name)
        for name in registry.names()
        if isinstance(registry.spec(name).entry_point, str)
    ]


@pytest.mark.parametrize("kind", ["trainer", "policy", "environment", "policy_mapping"])
def test_every_static_signature_matches_the_imported_one(kind):
    read = 0
    for spec in _registered(kind):
        static = static_signature(spec.entry_point)
        if static is None:
            continue
        read += 1
        factory = spec.load()
        real = inspect.signature(factory)
        assert [
            (p.name, p.kind, p.default is p.empty) for p in static.signature.parameters.values()
        ] == [(p.name, p.kind, p.default is p.empty) for p in real.parameters.values()], (
            spec.entry_point
        )
        real_hints = _hints(factory)
        for name, hint in static.hints.items():
            assert real_hints.get(name) == hint, (spec.entry_point, name)
    assert read > 0, f"no {kind} signature could be read from source: nothing was compared"


def test_a_constructor_the_source_cannot_show_is_imported_instead():
    # inherited constructors and check_args hooks need the real class
    assert static_signature("legacy.environment.gym_adapter:GymnasiumEnvironment") is None
    assert static_signature("api.environment:Environment") is None
    assert static_signature("no.such.module:Thing") is None


def test_annotations_are_never_run_as_code(tmp_path, monkeypatch):
    (tmp_path / "sneaky.py").write_text(
        "import pathlib\n"
        "Marker = pathlib.Path('touched').touch()\n"
        "class Thing:\n"
        "    def __init__(self, a: int = 1, b: 'print(1) or int' = 2, c: list[float] = ()):\n"
        "        pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    static = static_signature("sneaky:Thing")
    assert static is not None
    assert static.hints == {"a": int, "c": list[float]}
    assert not (tmp_path / "touched").exists()


def test_a_bad_override_is_reported_without_importing_torch():
    code = (
        "import sys\n"
        "from api.errors import ConfigError\n"
        "from api.resolve import load_experiment\n"
        "try:\n"
        "    load_experiment('cartpole-ppo', ['policies.default.trainer.args.lr=abc'])\n"
        "except ConfigError as e:\n"
        "    print(e)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "policies.default.trainer.args.lr: expected float, got str 'abc'" in out.stdout
    assert out.stdout.strip().endswith("False"), out.stdout


def test_needs_replay_read_from_source_matches_the_class():
    read = 0
    for spec in _registered("trainer"):
        declared = static_class_attribute(spec.entry_point, "needs_replay")
        if declared is UNKNOWN:
            continue
        read += 1
        assert declared == getattr(spec.load(), "needs_replay", False), spec.entry_point
    assert read >= 3  # ppo (inherited from api.trainer.Trainer), dqn, sac at least


@pytest.mark.parametrize("kind", ["trainer", "policy"])
def test_arg_ranges_read_from_source_match_the_class_and_its_constructor(kind):
    read = 0
    for spec in _registered(kind):
        declared = static_class_attribute(spec.entry_point, "arg_ranges")
        if declared is UNKNOWN:
            continue
        cls = spec.load()
        assert declared == cls.arg_ranges, spec.entry_point
        read += bool(declared)
        parameters = inspect.signature(cls).parameters
        for key, interval in declared.items():
            assert key in parameters, (spec.entry_point, key)
            low, _, high, _ = parse_interval(interval)
            assert low < high, (spec.entry_point, key)
    assert read >= (4 if kind == "trainer" else 3)  # every built-in trainer; the learning policies


def test_a_folder_named_like_a_package_does_not_hide_its_source(tmp_path):
    """A folder ``algorithm/`` without ``__init__.py`` where Python looks first (the working
    folder here; ``tests/`` under pytest) is a namespace package, offered before the editable
    install's finder is asked. Reading signatures from source then found nothing, and this
    module's checks failed whenever no test before them had imported ``algorithm.*``."""
    (tmp_path / "algorithm").mkdir()
    code = (
        "import importlib.util\n"
        "from api.signatures import static_signature\n"
        "print(importlib.util.find_spec('algorithm').origin)\n"  # the folder: a namespace
        "print(static_signature('algorithm.ppo.trainer:PPOTrainer') is not None)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert out.stdout.split() == ["None", "True"], out.stdout + out.stderr
