"""A run's user code: what the launching process registered, loaded again in every worker.

The launcher calls :func:`attach_user_code` on the experiment before it starts anything: the
registrations this process made outside any plugin go into ``config.code.registrations``. Every
process that builds components from the config (workers, evaluation, ``load_policy``) first calls
:func:`load_code`: it imports ``config.code.imports`` and registers those registrations again, so
a class defined in a script resolves to that script's file (see :mod:`api.user_code`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from api import registry, user_code
from api.errors import RegistryError


@dataclass
class RegistrationConfig:
    """A component registered by the launching process's own code, re-registered in workers."""

    kind: str = ""
    """The registry it belongs to: ``environment``, ``policy``, ``trainer``, ... (KINDS)."""
    name: str = ""
    """The registered name."""
    entry_point: str = ""
    """``module:Attribute`` of the class or factory."""
    source: str = ""
    """The file that defines it, imported where the module cannot be imported by name."""
    requires: list[str] = field(default_factory=list)
    """Files or modules imported before it is built (``api.registry.Spec.requires``)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Default keyword arguments given to ``register``."""
    description: str = ""
    """One line for ``troupe list``."""


@dataclass
class CodeConfig:
    """The user's own code every process of the run loads before it builds anything."""

    imports: list[str] = field(default_factory=list)
    """Python files (``path/to/file.py``) or module names to import first, in order: where
    components are defined and registered at import time (``troupe run --import FILE``)."""
    registrations: list[RegistrationConfig] = field(default_factory=list)
    """Registrations made outside any plugin by the process that launched the run (e.g. in a
    script's ``__main__`` block); the launcher fills this in, workers register them again."""
    sources: dict[str, str] = field(default_factory=dict)
    """Module names of ``imports`` that the launching process found only in the folder it ran
    in (``my_package.envs``, not installed), and their files: where the name cannot be imported
    (a worker or a ``troupe eval`` in another folder) the file is. The launcher fills this in."""


_loaded: set[tuple[str, ...]] = set()


def attach_user_code(config: Any) -> Any:
    """``config`` (an ``ExperimentConfig``) with this process's own registrations (and
    absolute import paths) in its ``code``, and the registration of its environment where
    that needs the user's code imported (a gymnasium id a script registers: Spec.requires)."""
    code = with_user_code(config.code)
    required = _required_registration("environment", config.environment.type)
    if required is not None and all(r.name != required.name for r in code.registrations):
        code.registrations.append(required)
    return dataclasses.replace(config, code=code)


def _required_registration(kind: str, name: str) -> RegistrationConfig | None:
    """``name``'s registration, to travel with the run, if it requires code imported first;
    None otherwise (including a name this process cannot resolve: the config check says so)."""
    try:
        spec = registry.REGISTRIES[kind].spec(name) if name else None
    except RegistryError:
        return None
    if spec is None or not spec.requires:
        return None
    return _registration(spec)


def with_user_code(code: CodeConfig) -> CodeConfig:
    """``code`` with this process's own registrations, its import paths made absolute, and
    the files of the modules it found only in its working directory."""
    registrations = {(r.kind, r.name): r for r in code.registrations}
    for spec in registry.user_specs():
        registrations[(spec.kind, spec.name)] = _registration(spec)
    imports = [_absolute(item) for item in code.imports]
    local = {item: user_code.local_file(item) for item in imports if not item.endswith(".py")}
    sources = {**code.sources, **{item: path for item, path in local.items() if path}}
    return CodeConfig(imports, list(registrations.values()), sources)


def _registration(spec: registry.Spec) -> RegistrationConfig:
    module = spec.entry_point.partition(":")[0]
    return RegistrationConfig(
        kind=spec.kind,
        name=spec.name,
        entry_point=spec.entry_point,
        source=spec.source or user_code.local_file(module) or "",
        kwargs=dict(spec.kwargs),
        description=spec.description,
        requires=list(spec.requires),
    )


def load_code(code: CodeConfig) -> None:
    """Import the run's user modules, then register its registrations (once per process)."""
    key = (*code.imports, *(f"{r.kind}/{r.name}/{r.entry_point}" for r in code.registrations))
    if key in _loaded:
        return
    for item in code.imports:
        user_code.import_code(item, code.sources.get(item, ""))
    for r in code.registrations:
        if r.kind not in registry.REGISTRIES:
            raise RegistryError(f"code.registrations: unknown kind '{r.kind}' of '{r.name}'")
        registry.REGISTRIES[r.kind].register(
            r.name,
            r.entry_point,
            description=r.description,
            override=True,
            source=r.source,
            requires=r.requires,
            **r.kwargs,
        )
    _loaded.add(key)


def relocated(code: CodeConfig) -> tuple[CodeConfig, dict[str, str]]:
    """``code`` with each file that is no longer where the run recorded it replaced by the file
    of its name given with ``--import`` (:func:`api.user_code.given_file`), and what moved: a
    resumed run's workers, and its ``config.json``, then load it from there."""
    moved: dict[str, str] = {}

    def place(path: str) -> str:
        new = user_code.given_file(path) if path else None
        if new is None:
            return path
        moved[path] = str(new)
        return str(new)

    imports = list(dict.fromkeys(place(item) for item in code.imports))
    registrations = [
        dataclasses.replace(r, source=place(r.source), requires=[place(q) for q in r.requires])
        for r in code.registrations
    ]
    sources = {name: place(path) for name, path in code.sources.items()}
    return CodeConfig(imports, registrations, sources), moved


def _absolute(item: str) -> str:
    """File imports as absolute paths: workers may run in another folder."""
    if item.endswith(".py"):
        return str(Path(item).resolve())
    return item
