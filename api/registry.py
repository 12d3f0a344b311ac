"""One registry mechanism for environments, policies, trainers and experiments.

A registered component is a :class:`Spec`: a name, a lazy ``"package.module:Attribute"`` entry
point and default keyword arguments. Specs are plain data, so the launcher can put them in a run's
configuration and a spawned or remote process rebuilds exactly the same component with
:func:`Spec.make` without having seen the ``register`` call.

Packages contribute components through the ``troupe.plugins`` entry-point group declared in their
``pyproject.toml``: each entry point names a function that receives nothing and calls
``register``. Plugins load on the first lookup, never as an import side effect.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from api.errors import RegistryError

logger = logging.getLogger(__name__)

PLUGIN_GROUP = "troupe.plugins"
KINDS = ("environment", "policy", "trainer", "experiment", "policy_mapping")


@dataclass(frozen=True)
class Spec:
    """How to build one registered component."""

    kind: str
    """One of ``environment``, ``policy``, ``trainer``, ``experiment``, ``policy_mapping``."""
    name: str
    """The registered name, e.g. ``CartPole-v1`` or ``actor-critic``."""
    entry_point: str
    """``"package.module:Attribute"``: a class or factory function, imported on ``make``."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Default keyword arguments; those given to ``make`` override them."""
    description: str = ""
    """One line shown by ``troupe list``."""

    def load(self) -> Callable[..., Any]:
        """Import the entry point and return the class or factory it names."""
        return load_entry_point(self.entry_point, what=f"{self.kind} '{self.name}'")

    def make(self, **kwargs: Any) -> Any:
        factory = self.load()
        merged = {**self.kwargs, **kwargs}
        try:
            return factory(**merged)
        except TypeError as e:
            raise RegistryError(
                f"could not build {self.kind} '{self.name}' from {self.entry_point} with "
                f"arguments {sorted(merged)}: {e}"
            ) from e


def load_entry_point(entry_point: str, what: str = "entry point") -> Callable[..., Any]:
    """Import ``"package.module:Attribute.sub"`` and return the attribute."""
    module_name, sep, attr = entry_point.partition(":")
    if not sep or not module_name or not attr:
        raise RegistryError(
            f"{what}: entry point '{entry_point}' must look like 'package.module:Attribute'"
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise RegistryError(
            f"{what}: cannot import module '{module_name}' ({e}); is its package installed?"
        ) from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise RegistryError(f"{what}: module '{module_name}' has no attribute '{attr}'") from e
    return obj


def entry_point_of(obj: Any) -> str:
    """The ``module:qualname`` string that imports ``obj`` again in another process."""
    qualname = getattr(obj, "__qualname__", "")
    if not qualname or "<locals>" in qualname:
        raise RegistryError(
            f"{obj!r} is defined inside a function; register a module-level class or factory "
            "(or pass its 'module:Attribute' string) so other processes can import it"
        )
    return f"{obj.__module__}:{qualname}"


class Registry:
    """Names to Specs, for one kind of component."""

    def __init__(self, kind: str):
        self.kind = kind
        self._specs: dict[str, Spec] = {}

    def register(
        self,
        name: str,
        entry_point: str | Callable[..., Any],
        *,
        description: str = "",
        override: bool = False,
        **kwargs: Any,
    ) -> Spec:
        """Register ``name``; ``entry_point`` is a ``"module:Attribute"`` string or the object."""
        if not isinstance(name, str) or not name:
            raise RegistryError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        if name in self._specs and not override:
            raise RegistryError(
                f"{self.kind} '{name}' is already registered (by {self._specs[name].entry_point}); "
                "pick another name or pass override=True"
            )
        ep = entry_point if isinstance(entry_point, str) else entry_point_of(entry_point)
        if not description and not isinstance(entry_point, str):
            description = _first_line(getattr(entry_point, "__doc__", None))
        spec = Spec(self.kind, name, ep, dict(kwargs), description)
        self._specs[name] = spec
        return spec

    def spec(self, name: str) -> Spec:
        _load_plugins()
        if name in self._specs:
            return self._specs[name]
        raise RegistryError(self._unknown_message(name))

    def make(self, name: str, **kwargs: Any) -> Any:
        return self.spec(name).make(**kwargs)

    def names(self) -> list[str]:
        _load_plugins()
        return sorted(self._specs)

    def specs(self) -> list[Spec]:
        return [self._specs[n] for n in self.names()]

    def __contains__(self, name: str) -> bool:
        _load_plugins()
        return name in self._specs

    def unregister(self, name: str) -> None:
        self._specs.pop(name, None)

    def _unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(name, list(self._specs), n=3, cutoff=0.6)
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

register_environment = environments.register
register_policy = policies.register
register_trainer = trainers.register
register_experiment = experiments.register
register_policy_mapping = policy_mappings.register

_plugins_loaded = False
_plugins_lock = threading.RLock()


def _load_plugins() -> None:
    """Call every ``troupe.plugins`` entry point once per process."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    with _plugins_lock:
        if _plugins_loaded:
            return
        _plugins_loaded = True  # set first: a plugin may itself look names up
        for ep in entry_points(group=PLUGIN_GROUP):
            try:
                ep.load()()
            except Exception as e:
                raise RegistryError(
                    f"plugin '{ep.name}' ({ep.value}) failed to register its components: {e}"
                ) from e


def make_spec(kind: str, name_or_spec: str | Spec) -> Spec:
    """Resolve a name (or pass a Spec through) for the given kind."""
    if isinstance(name_or_spec, Spec):
        return name_or_spec
    return REGISTRIES[kind].spec(name_or_spec)
