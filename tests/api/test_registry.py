"""The registry: register/make, lazy entry points, errors, and built-ins loaded by plugin."""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium as gym
import pytest

from api import environment, registry
from api.environment import Environment, StepResult
from api.errors import RegistryError, UserError
from api.registry import Registry, Spec, load_entry_point
from api.resolve import load_experiment


class CountingEnv(Environment):
    """A one-agent environment whose constructor arguments we can inspect."""

    def __init__(self, size: int = 3, mode: str = "easy"):
        self.size = size
        self.mode = mode

    @property
    def agent_count(self) -> int:
        return 1

    @property
    def observation_spaces(self) -> list[gym.Space]:
        return [gym.spaces.Discrete(self.size)]

    @property
    def action_spaces(self) -> list[gym.Space]:
        return [gym.spaces.Discrete(2)]

    def reset(self):
        return [StepResult(0)]

    def step(self, actions):
        return [StepResult(0, done=True)]


def not_an_environment(**kwargs):
    return object()


@pytest.fixture
def names():
    """Names registered by a test, removed afterwards so tests do not leak into each other."""
    registered: list[str] = []
    yield registered
    for name in registered:
        registry.environments.unregister(name)


def test_register_object_and_make_with_defaults(names):
    names.append("test-counting")
    spec = environment.register("test-counting", CountingEnv, size=5)
    assert spec.entry_point == "test_registry:CountingEnv"
    assert spec.description == "A one-agent environment whose constructor arguments we can inspect."
    env = environment.make("test-counting")
    assert isinstance(env, CountingEnv) and env.size == 5 and env.mode == "easy"


def test_make_kwargs_override_registered_defaults(names):
    names.append("test-counting")
    environment.register("test-counting", "test_registry:CountingEnv", size=5, mode="hard")
    env = environment.make("test-counting", size=9)
    assert (env.size, env.mode) == (9, "hard")


def test_make_accepts_a_spec():
    spec = Spec("environment", "anonymous", "test_registry:CountingEnv", {"size": 2})
    assert environment.make(spec).size == 2


def test_entry_points_are_imported_on_make_not_on_register(names, tmp_path, monkeypatch):
    (tmp_path / "troupe_lazy_probe.py").write_text("def build(**kwargs):\n    return kwargs\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    names.append("test-lazy")
    spec = registry.register_environment("test-lazy", "troupe_lazy_probe:build", size=2)
    assert "troupe_lazy_probe" not in sys.modules
    assert spec.make() == {"size": 2}
    assert "troupe_lazy_probe" in sys.modules
    monkeypatch.delitem(sys.modules, "troupe_lazy_probe")


def test_duplicate_name_is_an_error_unless_overridden(names):
    names.append("test-counting")
    environment.register("test-counting", CountingEnv)
    with pytest.raises(RegistryError) as e:
        environment.register("test-counting", CountingEnv, size=4)
    assert str(e.value) == (
        "environment 'test-counting' is already registered (by test_registry:CountingEnv); "
        "pick another name or pass override=True"
    )
    environment.register("test-counting", CountingEnv, override=True, size=7)
    assert environment.make("test-counting").size == 7


def test_the_same_registration_again_is_no_conflict(names):
    """A user file imported by a worker runs its register() calls again: same class, same
    defaults, same file: nothing changes."""
    names.append("test-counting")
    first = environment.register("test-counting", CountingEnv, size=4)
    assert environment.register("test-counting", CountingEnv, size=4) is first
    assert first.source == str(Path(__file__).resolve())


def test_unknown_name_suggests_close_matches():
    with pytest.raises(RegistryError) as e:
        environment.make("CartPol-v1")
    message = str(e.value)
    assert message.startswith("unknown environment 'CartPol-v1'. Did you mean 'CartPole-v1'")
    assert "Run 'troupe list' to see every registered environment" in message


def test_troupe_run_of_an_unknown_name_suggests_experiments_and_environments():
    """``troupe run Taxi-v3``: no experiment, and gymnasium 1.x names the environment
    ``Taxi-v4``; the suggestion must come from the environments too."""
    with pytest.raises(RegistryError) as e:
        load_experiment("CartPol-v1")
    assert str(e.value).startswith(
        "unknown experiment or environment 'CartPol-v1'. Did you mean environment 'CartPole-v1'"
    )
    with pytest.raises(RegistryError, match=r"Did you mean experiment 'cartpole-ppo'"):
        load_experiment("cartpole-ppp")
    with pytest.raises(RegistryError) as e:
        load_experiment("zzzzzz")
    assert "Did you mean" not in str(e.value) and "name an experiment file" in str(e.value)


def test_unknown_name_without_close_match_has_no_suggestion():
    with pytest.raises(RegistryError) as e:
        registry.trainers.spec("zzzzzz")
    assert "Did you mean" not in str(e.value)


@pytest.mark.parametrize(
    "entry_point, message",
    [
        ("no_colon_here", "entry point 'no_colon_here' must look like 'package.module:Attribute'"),
        ("no_such_module_xyz:Thing", "cannot import module 'no_such_module_xyz'"),
        ("json:NoSuchThing", "module 'json' has no attribute 'NoSuchThing'"),
    ],
)
def test_bad_entry_points_say_what_is_wrong(entry_point, message):
    with pytest.raises(RegistryError, match="thing 'x'") as e:
        load_entry_point(entry_point, what="thing 'x'")
    assert message in str(e.value)


def test_nested_attribute_entry_point():
    assert load_entry_point("os:path.join") is __import__("os").path.join


def test_class_defined_in_a_function_cannot_be_registered():
    class Local(CountingEnv):
        pass

    with pytest.raises(
        RegistryError, match="is defined inside a function; register a module-level"
    ):
        Registry("environment").register("local", Local)


def test_bad_constructor_arguments_name_the_component(names):
    names.append("test-counting")
    environment.register("test-counting", CountingEnv)
    with pytest.raises(RegistryError) as e:
        environment.make("test-counting", sise=3)
    assert str(e.value).startswith(
        "could not build environment 'test-counting' from test_registry:CountingEnv with "
        "arguments ['sise']"
    )


class BrokenInside(CountingEnv):
    def __init__(self, size: int = 3):
        super().__init__(size)
        # a TypeError of its own code, not of its arguments
        self.grid = sorted([size, "a"])


def test_a_type_error_inside_a_constructor_is_said_where_it_was_raised(names):
    """The message "could not build environment 'TE-v0' from te:TE with arguments []: Cannot
    interpret '5' as a data type" blamed arguments there were none of, and said nothing of
    where the constructor failed."""
    names.append("test-broken-inside")
    environment.register("test-broken-inside", BrokenInside)
    with pytest.raises(RegistryError) as e:
        environment.make("test-broken-inside", size=4)
    said = str(e.value)
    assert said.startswith(
        "environment 'test-broken-inside' (test_registry:BrokenInside) raised TypeError while "
        "it was built: '<' not supported"
    ), said
    assert said.endswith(f"(at {__file__}:{BrokenInside.__init__.__code__.co_firstlineno + 3}: "
                         "self.grid = sorted([size, \"a\"]))"), said  # fmt: skip


def test_make_rejects_something_that_is_not_an_environment(names):
    names.append("test-not-env")
    environment.register("test-not-env", not_an_environment)
    with pytest.raises(RegistryError, match=r"built a object, which is not an api\.environment"):
        environment.make("test-not-env")
    names.append("test-gym-env")
    environment.register("test-gym-env", gym.make, id="CartPole-v1")
    with pytest.raises(RegistryError, match=r"built a gymnasium environment .*gymnasium\.register"):
        environment.make("test-gym-env")


def test_empty_name_is_rejected():
    with pytest.raises(RegistryError, match="name must be a non-empty string"):
        Registry("policy").register("", CountingEnv)


def test_plugin_loading_finds_the_builtins():
    for name in ("CartPole-v1", "Pendulum-v1", "GridGather-v0", "MemoryCue-v0"):
        assert name in registry.environments
    assert registry.environments.spec("CartPole-v1").kwargs == {"gym_id": "CartPole-v1"}
    assert "actor-critic" in registry.policies
    assert "ppo" in registry.trainers
    assert "cartpole-ppo" in registry.experiments


def test_gymnasium_ids_do_not_replace_existing_registrations():
    from legacy.environment.gym_adapter import register_gymnasium_ids

    builtin = registry.environments.spec("CartPole-v1")
    environment.register("CartPole-v1", CountingEnv, override=True)
    try:
        register_gymnasium_ids()
        assert registry.environments.spec("CartPole-v1").entry_point == "test_registry:CountingEnv"
    finally:
        registry.environments.restore(builtin)  # the built-in again, not a user registration
    assert registry.environments.spec("CartPole-v1").kwargs == {"gym_id": "CartPole-v1"}
    assert "CartPole-v1" not in [s.name for s in registry.user_specs()]


def test_what_another_process_imports_to_run_a_modules_top_level_again(tmp_path):
    from api import user_code

    installed = "gymnasium.envs.classic_control"
    assert user_code.origin_of(installed) == installed  # by name: its packages' __init__ run
    mine = tmp_path / "troupe_test_origin.py"
    mine.write_text("X = 1\n")
    module = user_code.import_file(mine)
    assert user_code.origin_of(module.__name__) == str(mine.resolve())  # a file of the user's
    assert user_code.origin_of("troupe_not_imported_yet") == "troupe_not_imported_yet"


def test_a_spec_imports_what_it_requires_first_once(tmp_path):
    """A spec whose entry point builds something registered elsewhere at import time (a
    gymnasium id a script registers) imports that code first, once, in whatever process
    builds it."""
    marker = tmp_path / "troupe_test_required.py"
    counter = "sys.troupe_test_required_runs"
    marker.write_text(f"import sys\n{counter} = 1 + getattr(sys, {counter.split('.')[1]!r}, 0)\n")
    reg = Registry("environment")
    with registry.registering_as_plugin():
        spec = reg.register("needs-it", "builtins:dict", requires=[str(marker)])
    assert spec.requires == (str(marker),) and reg.user_specs() == []  # a plugin's
    assert spec.make(a=1) == {"a": 1}
    spec.make()
    assert sys.troupe_test_required_runs == 1  # imported once
    del sys.troupe_test_required_runs


LAMBDA_FILE = """
from api import registry

registry.register_environment("test-lambda-made", lambda **kw: {"made": True, **kw}, size=3)

if __name__ == "__main__":
    registry.register_environment("test-lambda-main", lambda **kw: kw)
"""

REMAKE = """
import json, sys
from api import registry
spec = registry.Spec(**json.loads(sys.argv[1]))  # registered again as a worker does
registry.environments.register(spec.name, spec.entry_point, source=spec.source, **spec.kwargs)
print(json.dumps(registry.environments.make(spec.name, mode="hard")))
"""


def test_a_lambda_registered_at_a_modules_top_level_is_made_in_another_process(tmp_path, names):
    """``register_environment("X", lambda **kw: MyEnv(**kw))``, as RLlib's ``register_env``
    is written, was taken and then failed in every process, this one included: "module 'x'
    has no attribute '<lambda>'". Another process imports the module, which registers the
    lambda there too. One that only a ``__main__`` block registers says why it cannot."""
    import dataclasses
    import json
    import subprocess

    from api import user_code

    names.extend(["test-lambda-made", "test-lambda-main"])
    path = tmp_path / "troupe_test_lambda.py"
    path.write_text(LAMBDA_FILE)
    user_code.import_file(path)
    spec = registry.environments.spec("test-lambda-made")
    assert spec.entry_point == "troupe_test_lambda:<lambda>" and spec.source == str(path)
    assert spec.make(mode="easy") == {"made": True, "size": 3, "mode": "easy"}
    again = registry.environments.register(spec.name, spec.entry_point, source=spec.source, size=3)
    assert again is spec and again.make()["made"]  # the config's registration keeps the lambda
    root = Path(__file__).resolve().parents[2]
    plain = json.dumps({**dataclasses.asdict(spec), "requires": []})  # as a run's config has it
    other = subprocess.run(
        [sys.executable, "-c", REMAKE, plain], capture_output=True, text=True, timeout=60,
        cwd=tmp_path, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert other.returncode == 0, other.stderr
    assert json.loads(other.stdout) == {"made": True, "size": 3, "mode": "hard"}
    main_only = Spec("environment", "test-lambda-main", "__main__:<lambda>", source=str(path))
    with pytest.raises(RegistryError, match=r"registered as a lambda.*__main__"):
        main_only.make()


class CloseRaises(CountingEnv):
    def close(self):
        raise RuntimeError("close failed")


def test_an_environment_made_for_its_spaces_whose_close_raises_is_said_not_raised(names, caplog):
    """``troupe train`` of an environment whose close() raised ended in a bare traceback from
    planning the run, after its spaces were read. It is a warning naming the environment."""
    from legacy.experiments.agent_kinds import declared

    names.append("test-close-raises")
    environment.register("test-close-raises", CloseRaises, size=5)
    with caplog.at_level("WARNING", logger=environment.__name__):
        spaces = declared("test-close-raises", {})
    assert spaces.spaces == [(gym.spaces.Discrete(5), gym.spaces.Discrete(2))]
    assert caplog.messages == [
        "environment 'test-close-raises': close() raised RuntimeError: close failed (its spaces "
        "were read; troupe test-env checks close() too)"
    ]


def raising_experiment(size: int = 4):
    raise ValueError(f"size must be odd, got {size}")


def test_an_experiment_that_raises_says_what_and_where(tmp_path):
    """ "experiment 'auto' with {'env': ..., 'frames': 1000}: size must be odd": the error's
    type and the line of the user's code that raised it were left out."""
    registry.register_experiment("test-raising-experiment", raising_experiment)
    try:
        with pytest.raises(UserError) as e:
            load_experiment("test-raising-experiment", ["size=6"])
    finally:
        registry.experiments.unregister("test-raising-experiment")
    line = raising_experiment.__code__.co_firstlineno + 1
    assert str(e.value) == (
        "experiment 'test-raising-experiment' with {'size': 6}: ValueError: size must be odd, "
        f'got 6 (at {__file__}:{line}: raise ValueError(f"size must be odd, got {{size}}"))'
    )
