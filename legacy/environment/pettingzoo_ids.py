"""PettingZoo games by id, ``pettingzoo:<family>/<game>[#aec|#parallel]``: the spec that makes
one (:func:`spec_of_id`, the registry's family resolver for the ``pettingzoo:`` prefix), found in
PettingZoo's registry, in a PettingZoo without one by the game's module, and for MPE's games in
``mpe2``, the package they moved to from PettingZoo (1.27 no longer has them). The game is made by
:mod:`legacy.environment.pettingzoo_adapter`; found in PettingZoo's registry, it is resolved
without importing the game."""

from __future__ import annotations

from typing import Any

from legacy.environment.pettingzoo_adapter import INSTALL_HINT

MPE_INSTALL_HINT = (
    "install it with: pip install 'troupe-rl[mpe]' "
    "(a worker image: troupe image build --extras mpe)"
)
PREFIX = "pettingzoo:"


def spec_of_id(name: str):
    """The environment spec of ``pettingzoo:<family>/<game>[#aec|#parallel]``."""
    from api.errors import RegistryError
    from api.registry import Spec

    path, _, api = name[len(PREFIX) :].partition("#")
    if api not in ("", "aec", "parallel") or not path or "." in path:
        raise RegistryError(
            f"'{name}' is no PettingZoo id: write pettingzoo:<family>/<game>, e.g. "
            "pettingzoo:classic/rps_v2, optionally ending in #aec or #parallel"
        )
    try:
        import pettingzoo
    except ImportError as e:
        raise RegistryError(f"'{name}': PettingZoo is not installed; {INSTALL_HINT}") from e
    find = _by_registry if hasattr(pettingzoo, "spec") else _by_module
    if path.startswith("mpe/") and _mpe_moved():
        find = _by_mpe2
    api, entry_point, defaults = find(name, path, api)
    cls = "PettingZooParallelEnvironment" if api == "parallel" else "PettingZooAECEnvironment"
    return Spec(
        "environment",
        name,
        f"legacy.environment.pettingzoo_adapter:{cls}",
        {"env": entry_point, **defaults},
        f"PettingZoo {path} ({api} API)",
    )


def _default_apis(path: str, api: str) -> list[str]:
    """The APIs to try: the one asked for; else a game's parallel one, unless it is a classic
    (turn-based) game, then its AEC one."""
    if api:
        return [api]
    return ["aec"] if path.startswith("classic/") else ["parallel", "aec"]


def _by_registry(name: str, path: str, api: str) -> tuple[str, str, dict[str, Any]]:
    """A PettingZoo with a registry (``pettingzoo.spec``; 1.27.0 here): the game's spec in it.
    1.27.0 deprecates importing the game's module by its path, as was done before, and warns.
    Imports nothing of the game: a missing dependency is said when a worker makes it."""
    import pettingzoo
    from pettingzoo.env_registry.exceptions import NameNotFound, PettingZooRegistryError

    from api.errors import RegistryError

    for kind in _default_apis(path, api):
        try:
            spec = pettingzoo.spec(kind, path)
        except NameNotFound as e:
            error = e
            continue
        except PettingZooRegistryError as e:
            moved = _family_import_error(path)
            if moved:  # the registry no longer knows a family that went to a package of its own
                raise RegistryError(f"'{name}': {moved}") from e
            raise RegistryError(
                f"'{name}': {_said(e)}; check the family and game with PettingZoo's "
                f"documentation, or {INSTALL_HINT}"
            ) from e
        defaults = dict(spec.kwargs)
        if spec.max_cycles is not None and spec.max_cycles != -1:
            defaults.setdefault("max_cycles", spec.max_cycles)
        return kind, spec.entry_point, defaults
    other = "aec" if api == "parallel" else "parallel"
    if api and _registered(other, path):
        raise RegistryError(f"'{name}': PettingZoo's {path} has no {api} API (it has the {other} "
                            f"one: #{other})")  # fmt: skip
    raise RegistryError(f"'{name}': {_said(error)}; check the family and game with PettingZoo's "
                        f"documentation, or {INSTALL_HINT}") from error  # fmt: skip


def _family_import_error(path: str) -> str | None:
    """What importing the game's family says, where it fails: PettingZoo 1.27 moved MPE into a
    package of its own, and its registry only answered "Namespace 'mpe' not found"."""
    import importlib

    family = "pettingzoo." + path.split("/")[0]
    try:
        importlib.import_module(family)
    except ImportError as e:
        return None if e.name == family else _said(e)  # no such family: the registry's word
    return None


def _said(error: Exception) -> str:
    """PettingZoo's message without its closing full stop (ours goes on after a ';')."""
    return str(error).rstrip(". ")


def _registered(kind: str, path: str) -> bool:
    import pettingzoo
    from pettingzoo.env_registry.exceptions import PettingZooRegistryError

    try:
        pettingzoo.spec(kind, path)
    except PettingZooRegistryError:
        return False
    return True


def _by_module(name: str, path: str, api: str) -> tuple[str, str, dict[str, Any]]:
    """A PettingZoo without a registry: the game's module, ``pettingzoo.<family>.<game>``, and
    its ``env`` or ``parallel_env``."""
    import importlib

    from api.errors import RegistryError

    module_name = "pettingzoo." + path.replace("/", ".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise RegistryError(
            f"'{name}': cannot import {module_name} ({e}); check the family and game with "
            f"PettingZoo's documentation, or {INSTALL_HINT}"
        ) from e
    kinds = _default_apis(path, api)
    kind = next((k for k in kinds if hasattr(module, _FACTORY[k])), kinds[-1])
    if not hasattr(module, _FACTORY[kind]):
        raise RegistryError(f"'{name}': {module_name} has no {_FACTORY[kind]}() (no {kind} API)")
    return kind, f"{module_name}:{_FACTORY[kind]}", {}


_FACTORY = {"aec": "env", "parallel": "parallel_env"}


def _mpe_moved() -> bool:
    """Whether this PettingZoo's MPE family is gone to the ``mpe2`` package (as in PettingZoo
    1.27, where importing ``pettingzoo.mpe`` only says so)."""
    import importlib

    try:
        importlib.import_module("pettingzoo.mpe")
    except ImportError:
        return True
    return False


def _by_mpe2(name: str, path: str, api: str) -> tuple[str, str, dict[str, Any]]:
    """An MPE game (``pettingzoo:mpe/simple_spread_v3``) from ``mpe2``, the package MPE moved
    to, which keeps PettingZoo's ids and APIs: the id a PettingZoo user knows still works."""
    import difflib
    import importlib

    from api.errors import RegistryError

    try:
        games = importlib.import_module("mpe2.all_modules").mpe_environments
    except ImportError as e:
        raise RegistryError(
            f"'{name}': PettingZoo's MPE games are in the mpe2 package now, which is not "
            f"installed ({e}); {MPE_INSTALL_HINT}"
        ) from e
    if path not in games:
        close = difflib.get_close_matches(path, list(games), n=1, cutoff=0.6)
        hint = f"did you mean pettingzoo:{close[0]}?" if close else "mpe2 has " + ", ".join(games)
        raise RegistryError(f"'{name}': mpe2 has no game {path}; {hint}")
    module = games[path].__name__
    kind = _default_apis(path, api)[0]
    return kind, f"{module}:{_FACTORY[kind]}", {}
