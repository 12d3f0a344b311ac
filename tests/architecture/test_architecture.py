"""The layout's rules, read from the source: which package may import which, no import cycles, and
no file over 400 lines without a written reason.

Imports are read with ``ast`` (every import statement, including those inside functions), so a
lazy import cannot hide a dependency that points the wrong way.

It lives in a folder of its own: pytest puts a test module's folder on ``sys.path``, and with
``tests/`` there, ``tests/algorithm`` (a folder without ``__init__.py``) would shadow the
``algorithm`` package for every import not made yet.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "algorithm", "legacy", "system", "distributed")
ALLOWED = {
    "api": {"api"},
    "algorithm": {"api", "algorithm"},
    "legacy": {"api", "algorithm", "legacy"},
    "system": {"api", "system"},
    "distributed": {"api", "system", "distributed"},
}
SYSTEM_FLOORS = {
    "system": 0,  # the modules directly in system/: roles, errors, timing, ...
    "system.replay": 1,
    "system.streams": 1,
    "system.parameters": 2,
    "system.workers": 3,
    "system.run": 4,
}
"""The floors of ``system/``: a module imports from its own sub-package or from a lower floor,
never from one beside or above it (a worker module reads its role from ``system.roles``, not
from the run's plan)."""
MAX_LINES = 400
LONG_FILE_REASON = "Longer than 400 lines because"
_TYPE_CHECKING = ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imports(path: Path, module: str, known: set[str], *, typing_too: bool = False) -> set[str]:
    """Every module of ours that ``path`` imports, resolved to a module in ``known``;
    ``typing_too``: also those imported for annotations only (``if TYPE_CHECKING``)."""
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    type_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) in _TYPE_CHECKING
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in type_only and not typing_too:  # annotations only: not run
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


MODULES = _modules()
GRAPH = {m: _imports(p, m, set(MODULES)) for m, p in MODULES.items()}
TYPED_GRAPH = {m: _imports(p, m, set(MODULES), typing_too=True) for m, p in MODULES.items()}
"""With the imports made for annotations only: a circle there is a seam cut in the wrong place
(two modules that each need the other's types)."""


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_one_way(package):
    wrong = sorted(
        f"{m} imports {dep}"
        for m, deps in GRAPH.items()
        if m.split(".")[0] == package
        for dep in deps
        if dep.split(".")[0] not in ALLOWED[package]
    )
    assert wrong == [], f"{package}/ may import only {sorted(ALLOWED[package])}"


def _floor_of(module: str) -> str | None:
    """The floor ``module`` lives on (a sub-package of ``system``, or ``system`` itself), or
    None outside ``system``."""
    parts = module.split(".")
    if parts[0] != "system":
        return None
    sub = ".".join(parts[:2])
    return sub if len(parts) > 2 and sub in SYSTEM_FLOORS else "system"


def test_system_floors_point_down():
    assert {_floor_of(m) for m in MODULES if m.startswith("system")} == set(SYSTEM_FLOORS), (
        "a new sub-package of system/ needs its floor in SYSTEM_FLOORS"
    )
    wrong = sorted(
        f"{m} ({here}) imports {dep} ({there})"
        for m, deps in GRAPH.items()
        if (here := _floor_of(m)) is not None
        for dep in deps
        if (there := _floor_of(dep)) is not None
        and dep not in ("system", there)  # a package's own __init__ imports nothing
        and there != here
        and SYSTEM_FLOORS[there] >= SYSTEM_FLOORS[here]
    )
    assert wrong == []


@pytest.mark.parametrize("graph", [GRAPH, TYPED_GRAPH], ids=["run time", "annotations too"])
def test_no_import_cycles(graph):
    """Depth-first search over every import (lazy ones included, and those for annotations
    only); a package's ``__init__`` that only documents the package imports nothing, so parents
    never close a cycle by themselves."""
    cycles, state = [], {}

    def visit(m, stack):
        state[m] = "open"
        stack.append(m)
        for dep in sorted(graph[m]):
            if state.get(dep) == "open":
                cycles.append(" -> ".join([*stack[stack.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert cycles == []


def test_long_files_say_why():
    long = [
        f"{p.relative_to(ROOT)} ({n} lines)"
        for p in MODULES.values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
        and LONG_FILE_REASON not in (ast.get_docstring(ast.parse(p.read_text())) or "")
    ]
    assert long == [], f"split these files, or say in the module docstring '{LONG_FILE_REASON} ...'"


def test_every_package_folder_is_installed():
    """pyproject.toml lists the packages (``troupe`` maps to ``distributed/troupe``): a new
    folder missing from the list would work in this checkout and vanish from a wheel."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    folders = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("__init__.py")
        if "troupe" not in p.parent.relative_to(ROOT).parts[1:]
    }
    # and the folders mapped by name: troupe, and docker/ as distributed.images.dockerfiles
    assert listed == folders | set(setuptools["package-dir"])
