"""One registry mechanism for environments, policies, trainers and experiments.

A registered component is a :class:`Spec`: a name, a lazy ``"package.module:Attribute"`` entry
point and default keyword arguments. Specs are plain data, so the launcher can put them in a run's
configuration and a spawned or remote process rebuilds exactly the same component with
:func:`Spec.make` without having seen the ``register`` call.

Packages contribute components through the ``troupe.plugins`` entry-point group declared in their
``pyproject.toml``: each entry point names a function that receives nothing and calls
``register``. Plugins load on the first lookup, never as an import side effect.

Everything else registered in a process (a script's own classes, a notebook's) is *user code*:
:func:`user_specs` lists those registrations, a launcher ships them to its workers in the run's
configuration, and each worker registers them again (:mod:`api.user_code` finds the files).
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from api import user_code
from api.errors import ConfigError, RegistryError

logger = logging.getLogger(__name__)

PLUGIN_GROUP = "troupe.plugins"
KINDS = ("environment", "policy", "trainer", "experiment", "policy_mapping", "callback")


@dataclass(frozen=True)
class Spec:
    """How to build one registered component."""

    kind: str
    """One of ``environment``, ``policy``, ``trainer``, ``experiment``, ``policy_mapping``,
    ``callback``."""
    name: str
    """The registered name, e.g. ``CartPole-v1`` or ``actor-critic``."""
    entry_point: str
    """``"package.module:Attribute"``: a class or factory function, imported on ``make``."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Default keyword arguments; those given to ``make`` override them."""
    description: str = ""
    """One line shown by ``troupe list``."""
    source: str = ""
    """The file defining the entry point's module, recorded when an object (not a string) was
    registered: a process that cannot import the module by name imports this file."""
    requires: tuple[str, ...] = ()
    """Files or modules of the user's code imported before the entry point: where what it
    builds is registered elsewhere at import time (a gymnasium id that a script registers with
    gymnasium, built through the gymnasium adapter). A run that builds such a component takes
    its spec to its workers (:func:`api.code.attach_user_code`), even a plugin's."""

    def load(self) -> Callable[..., Any]:
        """Import the entry point and return the class or factory it names."""
        for item in self.requires:
            user_code.import_required(item)
        if self.entry_point.endswith(LAMBDA):
            return _registered_lambda(self)
        return load_entry_point(
            self.entry_point, what=f"{self.kind} '{self.name}'", source=self.source
        )

    def same_target(self, other: Spec) -> bool:
        """Whether both name the same object with the same defaults: registering it again (a
        user file imported by a worker re-runs its ``register`` calls) is then no conflict."""
        if self.kwargs != other.kwargs:
            return False
        if self.entry_point == other.entry_point:
            return True
        qualname = self.entry_point.partition(":")[2]
        return bool(self.source) and (self.source, qualname) == (
            other.source,
            other.entry_point.partition(":")[2],
        )

    def make(self, **kwargs: Any) -> Any:
        factory = self.load()
        merged = {**self.kwargs, **kwargs}
        try:
            return factory(**merged)
        except TypeError as e:
            if _takes(factory, merged):  # raised inside it: "with arguments []" misled
                raise RegistryError(
                    f"{self.kind} '{self.name}' ({self.entry_point}) raised TypeError while "
                    f"it was built: {e}{user_code.where_raised(e)}"
                ) from e
            raise RegistryError(
                f"could not build {self.kind} '{self.name}' from {self.entry_point} with "
                f"arguments {sorted(merged)}: {e}"
            ) from e


def _takes(factory: Callable[..., Any], kwargs: dict[str, Any]) -> bool:
    """Whether ``factory``'s signature takes ``kwargs`` (unknown, for one it hides: no)."""
    try:
        inspect.signature(factory).bind(**kwargs)
    except (TypeError, ValueError):
        return False
    return True


LAMBDA = ":<lambda>"
"""How a registered lambda's entry point ends: no other process can import it by name."""

_lambdas: dict[tuple[str, str], Callable[..., Any]] = {}
"""The lambdas this process registered, by kind and name. Another process gets one by
importing the module that registers it, which registers it there too (RLlib's
``register_env("X", lambda config: MyEnv(config))``, written the same way here)."""


def _registered_lambda(spec: Spec) -> Callable[..., Any]:
    key = (spec.kind, spec.name)
    if key not in _lambdas:
        module = spec.entry_point[: -len(LAMBDA)]
        try:  # runs the module's register calls in this process
            user_code.import_module(module, spec.source)
        except (RegistryError, ImportError) as e:
            raise RegistryError(f"{spec.kind} '{spec.name}': cannot import {module}: {e}") from e
    if key not in _lambdas:
        where = spec.source or spec.entry_point[: -len(LAMBDA)]
        raise RegistryError(
            f"{spec.kind} '{spec.name}' was registered as a lambda, which another process makes "
            f"by importing {where} to register it again; that import did not (a register call "
            "under `if __name__ == '__main__':` runs only in the script itself): register it "
            "at the module's top level, or register a module-level function or class"
        )
    return _lambdas[key]


def load_entry_point(
    entry_point: str, what: str = "entry point", source: str = ""
) -> Callable[..., Any]:
    """Import ``"package.module:Attribute.sub"`` (from ``source`` if the module is not
    importable by name) and return the attribute."""
    module_name, sep, attr = entry_point.partition(":")
    if not sep or not module_name or not attr:
        raise RegistryError(
            f"{what}: entry point '{entry_point}' must look like 'package.module:Attribute'"
        )
    try:
        obj: Any = user_code.import_module(module_name, source)
    except RegistryError as e:
        raise RegistryError(f"{what}: {e}") from e
    except ImportError as e:
        raise RegistryError(
            f"{what}: cannot import module '{module_name}' ({e}); is its package installed?"
        ) from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            hint = ""
            if module_name == "__main__" and not source:
                hint = (
                    " (it was registered from an interactive session: save the class in a .py "
                    "file and register it from there, so other processes can import it)"
                )
            raise RegistryError(
                f"{what}: module '{module_name}' has no attribute '{attr}'{hint}"
            ) from e
    return obj


def entry_point_of(obj: Any) -> str:
    """The ``module:qualname`` string that imports ``obj`` again in another process."""
    return user_code.locate(obj)[0]


class Registry:
    """Names to Specs, for one kind of component."""

    def __init__(self, kind: str):
        self.kind = kind
        self._specs: dict[str, Spec] = {}
        self._user: set[str] = set()
        """Names registered outside a plugin: they travel to workers with the run's config."""
        self._families: dict[str, Callable[[str], Spec]] = {}
        """Name prefixes (``pettingzoo:``) whose names a function turns into specs on first
        use: a whole family of components, none of them listed one by one."""
        self._late: list[Callable[[str], Spec | None]] = []
        """Asked, in order, for a name nothing registered: see :meth:`add_late_names`."""

    def add_family(self, prefix: str, resolve: Callable[[str], Spec]) -> None:
        """Names starting with ``prefix`` resolve through ``resolve(name)`` (which raises
        RegistryError for one it cannot build); every process's plugin adds the same, so a name
        resolves alike in workers."""
        self._families[prefix] = resolve

    def add_late_names(self, resolve: Callable[[str], Spec | None]) -> None:
        """A name no one registered is asked of ``resolve``, which registers and returns its
        spec, or returns None: names another registry learns after this one listed it (a
        gymnasium id that a user's file registers with gymnasium once Troupe's plugin has
        registered gymnasium's ids)."""
        if resolve not in self._late:  # a plugin loaded again (tests) adds it once
            self._late.append(resolve)

    def register(
        self,
        name: str,
        entry_point: str | Callable[..., Any],
        *,
        description: str = "",
        override: bool = False,
        source: str = "",
        requires: Sequence[str] = (),
        **kwargs: Any,
    ) -> Spec:
        """Register ``name``; ``entry_point`` is a ``"module:Attribute"`` string or the object
        (whose defining file is then recorded, see :attr:`Spec.source`); ``requires``: see
        :attr:`Spec.requires`."""
        if not isinstance(name, str) or not name:
            raise RegistryError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        if isinstance(entry_point, str):
            ep = entry_point
        else:
            ep, source = user_code.locate(entry_point)
            description = description or _first_line(getattr(entry_point, "__doc__", None))
        spec = Spec(self.kind, name, ep, dict(kwargs), description, source, tuple(requires))
        old = self._specs.get(name)
        if old is not None and not override and not old.same_target(spec):
            raise RegistryError(
                f"{self.kind} '{name}' is already registered (by {old.entry_point}); "
                "pick another name or pass override=True"
            )
        if callable(entry_point) and ep.endswith(LAMBDA):  # what _registered_lambda returns
            _lambdas[(self.kind, name)] = entry_point
        if old is not None and old.same_target(spec):
            return old  # a user file imported again in a worker registers the same thing
        self._specs[name] = spec
        if _plugins_loading:
            self._user.discard(name)
        else:
            self._user.add(name)
        return spec

    def spec(self, name: str) -> Spec:
        _load_plugins()
        if name in self._specs:
            return self._specs[name]
        for prefix, resolve in self._families.items():
            if isinstance(name, str) and name.startswith(prefix):
                spec = self._specs[name] = resolve(name)
                return spec
        for late in self._late:
            if (spec := late(name)) is not None:
                return spec
        raise RegistryError(self._unknown_message(name))

    def make(self, name: str, **kwargs: Any) -> Any:
        return self.spec(name).make(**kwargs)

    def names(self) -> list[str]:
        _load_plugins()
        return sorted(self._specs)

    def specs(self) -> list[Spec]:
        return [self._specs[n] for n in self.names()]

    def in_family(self, name: str) -> bool:
        """Whether ``name`` is of a family of names resolved on demand (``pettingzoo:...``):
        its resolver, not the list of names, says what is wrong with one."""
        _load_plugins()
        return any(isinstance(name, str) and name.startswith(p) for p in self._families)

    def __contains__(self, name: str) -> bool:
        try:
            self.spec(name)
        except RegistryError:
            return False
        return True

    def registered(self, name: str) -> bool:
        """Whether ``name`` is registered by now: no family or late name resolved, no plugin
        loaded (what a plugin asks while it registers)."""
        return name in self._specs

    def unregister(self, name: str) -> None:
        self._specs.pop(name, None)
        _lambdas.pop((self.kind, name), None)
        self._user.discard(name)

    def restore(self, spec: Spec, *, user: bool = False) -> None:
        """Put ``spec`` back exactly as it was registered (e.g. a built-in a test replaced)."""
        self._specs[spec.name] = spec
        (self._user.add if user else self._user.discard)(spec.name)

    def user_specs(self) -> list[Spec]:
        """Specs registered outside any plugin, in name order."""
        return [self._specs[n] for n in sorted(self._user) if n in self._specs]

    def close_matches(self, name: str, n: int = 3) -> list[str]:
        """Registered names like ``name`` (a typo's likely intent), the closest first."""
        _load_plugins()
        return difflib.get_close_matches(name, list(self._specs), n=n, cutoff=0.6)

    def _unknown_message(self, name: str) -> str:
        close = self.close_matches(name)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        return (
            f"unknown {self.kind} '{name}'.{hint} Run 'troupe list' to see every registered "
            f"{self.kind}, or register it with api.registry.register_{self.kind}(...)."
        )


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if doc and doc.strip() else ""


REGISTRIES: dict[str, Registry] = {kind: Registry(kind) for kind in KINDS}
environments = REGISTRIES["environment"]
policies = REGISTRIES["policy"]
trainers = REGISTRIES["trainer"]
experiments = REGISTRIES["experiment"]
policy_mappings = REGISTRIES["policy_mapping"]
callbacks = REGISTRIES["callback"]

register_environment = environments.register
register_policy = policies.register
register_trainer = trainers.register
register_experiment = experiments.register
register_policy_mapping = policy_mappings.register
register_callback = callbacks.register

_plugins_loaded = False
_plugins_loading = False
_plugins_lock = threading.RLock()


def _load_plugins() -> None:
    """Call every ``troupe.plugins`` entry point once per process."""
    global _plugins_loaded, _plugins_loading
    if _plugins_loaded:
        return
    with _plugins_lock:
        if _plugins_loaded:
            return
        _plugins_loaded = True  # set first: a plugin may itself look names up
        _plugins_loading = True
        try:
            for ep in entry_points(group=PLUGIN_GROUP):
                try:
                    ep.load()()
                except Exception as e:
                    raise RegistryError(
                        f"plugin '{ep.name}' ({ep.value}) failed to register its components: {e}"
                    ) from e
        finally:
            _plugins_loading = False


@contextlib.contextmanager
def registering_as_plugin() -> Iterator[None]:
    """Registrations made inside are a plugin's, not the user's: every process makes them itself,
    so a launcher does not ship them to workers. E.g. the gymnasium adapter's blanket registration
    of gymnasium's ids, which each process derives from its own gymnasium registry; called again
    after another module registered an id with gymnasium, it must not turn that id into a user
    registration (which a worker, lacking the id, could not build)."""
    global _plugins_loading
    with _plugins_lock:
        before, _plugins_loading = _plugins_loading, True
        try:
            yield
        finally:
            _plugins_loading = before


def user_specs() -> list[Spec]:
    """Every registration made outside a plugin in this process (a script's, a notebook's):
    what a launcher ships to its workers so they know the same names."""
    return [spec for registry in REGISTRIES.values() for spec in registry.user_specs()]


def make_spec(kind: str, name_or_spec: str | Spec) -> Spec:
    """Resolve a name (or pass a Spec through) for the given kind."""
    if isinstance(name_or_spec, Spec):
        return name_or_spec
    return REGISTRIES[kind].spec(name_or_spec)


def make_callbacks(configs: Iterable[Any], hooks: Sequence[str], section: str) -> list:
    """``[(name, object)]``: the registered callbacks ``configs`` name (``ComponentConfig``s),
    each checked to have at least one of ``hooks``, or a ConfigError naming ``section``."""
    objects = [(c.type, callbacks.make(c.type, **c.args)) for c in configs]
    for name, obj in objects:
        if not any(callable(getattr(obj, hook, None)) for hook in hooks):
            raise ConfigError([f"{section}: '{name}' has none of the methods {', '.join(hooks)}"])
    return objects
