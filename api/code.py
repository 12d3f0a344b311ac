"""A run's user code: what the launching process registered, loaded again in every worker.

The launcher calls :func:`attach_user_code` on the experiment before it starts anything: the
registrations this process made outside any plugin go into ``config.code.registrations``. Every
process that builds components from the config (workers, evaluation, ``load_policy``) first calls
:func:`load_code`: it imports ``config.code.imports`` and registers those registrations again, so
a class defined in a script resolves to that script's file (see :mod:`api.user_code`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from api import registry, user_code
from api.config import CodeConfig, ExperimentConfig, RegistrationConfig
from api.errors import RegistryError

_loaded: set[tuple[str, ...]] = set()


def attach_user_code(config: ExperimentConfig) -> ExperimentConfig:
    """``config`` with this process's own registrations (and absolute import paths) in it."""
    registrations = {(r.kind, r.name): r for r in config.code.registrations}
    for spec in registry.user_specs():
        registrations[(spec.kind, spec.name)] = RegistrationConfig(
            kind=spec.kind,
            name=spec.name,
            entry_point=spec.entry_point,
            source=spec.source,
            kwargs=dict(spec.kwargs),
            description=spec.description,
        )
    imports = [_absolute(item) for item in config.code.imports]
    code = CodeConfig(imports=imports, registrations=list(registrations.values()))
    return dataclasses.replace(config, code=code)


def load_code(code: CodeConfig) -> None:
    """Import the run's user modules, then register its registrations (once per process)."""
    key = (*code.imports, *(f"{r.kind}/{r.name}/{r.entry_point}" for r in code.registrations))
    if key in _loaded:
        return
    for item in code.imports:
        user_code.import_code(item)
    for r in code.registrations:
        if r.kind not in registry.REGISTRIES:
            raise RegistryError(f"code.registrations: unknown kind '{r.kind}' of '{r.name}'")
        registry.REGISTRIES[r.kind].register(
            r.name,
            r.entry_point,
            description=r.description,
            override=True,
            source=r.source,
            **r.kwargs,
        )
    _loaded.add(key)


def _absolute(item: str) -> str:
    """File imports as absolute paths: workers may run in another folder."""
    if item.endswith(".py"):
        return str(Path(item).resolve())
    return item
