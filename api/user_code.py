"""Code a user wrote outside any installed package, made importable in every process of a run.

A class registered from a script (``python corridor.py``) lives in the module ``__main__`` of
that process only: a worker process has another ``__main__``, and a container may not even have
the file at the same place. So when an object is registered, :func:`locate` records the file
that defines it next to its ``module:Attribute`` entry point, and :func:`import_module` in
another process imports that module by name if it can, else from the recorded file, else from
a folder of user code added to a worker image (``TROUPE_USER_CODE``, see ``troupe image build
--add``). A file is imported as a module, never run as ``__main__``: its ``if __name__ ==
"__main__":`` block (the training launch, a test) does not run again in the workers.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys
import sysconfig
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from api.errors import RegistryError, UserError

KNOWN_PACKAGES = ("api", "algorithm", "legacy", "system", "distributed")
"""Troupe's own top-level packages: code in them is not the user's."""
OWN_CODE = tuple(str(Path(__file__).resolve().parents[1] / p) + os.sep for p in KNOWN_PACKAGES)
"""Where Troupe's own modules are, as tracebacks name them."""

_NOT_USERS = (*OWN_CODE, sysconfig.get_paths()["stdlib"] + os.sep)
"""Where Troupe's own modules and Python's standard library are (site- and dist-packages
hold the installed ones)."""

USER_CODE_ENV = "TROUPE_USER_CODE"
"""Folders (``os.pathsep``-separated) where worker images keep user code added at build time."""
DEFAULT_USER_CODE_DIR = "/opt/troupe/user"

_lock = threading.RLock()
_by_file: dict[str, ModuleType] = {}
_given: dict[str, Path] = {}
"""Files the user named with ``--import`` in this process, by file name (:func:`given_file`)."""


def where_raised(error: BaseException) -> str:
    """Where in the user's code ``error`` was raised: its innermost frame outside Troupe, the
    standard library and the installed packages, as " (at FILE:LINE: CODE)"; empty where
    none is."""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        path = frame.filename
        if path.startswith(_NOT_USERS) or "-packages" in path or path.startswith("<"):
            continue
        return f" (at {path}:{frame.lineno}: {(frame.line or '').strip()})"
    return ""


def locate(obj: Any) -> tuple[str, str]:
    """``(entry_point, source)`` for a module-level class or function: ``source`` is the file
    that defines it (empty when the module has none, e.g. a notebook cell)."""
    qualname = getattr(obj, "__qualname__", "")
    if not qualname or "<locals>" in qualname:
        raise RegistryError(
            f"{obj!r} is defined inside a function; register a module-level class or factory "
            "(or pass its 'module:Attribute' string) so other processes can import it"
        )
    return f"{obj.__module__}:{qualname}", file_of(sys.modules.get(obj.__module__))


INTERACTIVE = "__main__"
"""The module of an interactive session (a notebook, ``python -c``, code piped to ``python -``):
it has no file, so no other process can import what it defines. A spec that requires it, or
whose entry point is in it with no source, builds only in the process that registered it."""


def file_of(module: ModuleType | None) -> str:
    """The resolved path of ``module``'s source file; empty where it has none (a notebook's
    ``__main__``) or names none on disk (``<stdin>``, ``<string>``)."""
    source = getattr(module, "__file__", None)
    return str(Path(source).resolve()) if source and Path(source).is_file() else ""


_importing: list[str] = []
"""What this process is importing of the user's code now, innermost last (see :func:`importing`)."""


def importing() -> str | None:
    """The user module or file this process is importing now (None: none): a worker, the
    controller or ``--import`` runs the file's top level, where a ``troupe.train`` call that
    no ``if __name__ == "__main__":`` guards would start a run inside each of them."""
    return _importing[-1] if _importing else None


def refuse_while_importing(call: str) -> None:
    """Raise if ``call`` (``troupe.train()``) comes from the top level of a user file being
    imported: a script without its ``__main__`` guard started a run inside every worker that
    imported it (runs nested in runs, each waiting on its own), and printed nothing."""
    what = importing()
    if what is not None:
        raise UserError(
            f"{call} was called while Troupe imported {what} to load your components (every "
            "worker, the controller and --import import such a file, running its top level): "
            'put the call under if __name__ == "__main__":, as the README\'s corridor.py does'
        )


def _while_importing(function):
    @functools.wraps(function)
    def wrapper(name: str, *args: Any, **kwargs: Any) -> ModuleType:
        _importing.append(name)
        try:
            return function(name, *args, **kwargs)
        finally:
            _importing.pop()

    return wrapper


@_while_importing
def import_module(name: str, source: str = "") -> ModuleType:
    """The module ``name``, imported by name where it is installed, else from ``source``.

    ``__main__`` with a source is always the file: this process's ``__main__`` is another
    program unless it is that very file (the process that registered the object).
    """
    if name == "__main__" and source:
        main = sys.modules.get("__main__")
        if main is not None and _same_file(getattr(main, "__file__", None), source):
            return main
        return import_file(_find_source(source, name))
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if not source or not _is_missing(e, name):
            raise
    path = _find_source(source, name)
    if "." not in name:
        return import_file(path, name)
    # A module of a package that is not installed: put the package's root on the path.
    depth = name.count(".") + (1 if path.name == "__init__.py" else 0)
    sys.path.insert(0, str(path.resolve().parents[depth]))
    return importlib.import_module(name)


@_while_importing
def import_file(path: str | Path, name: str | None = None) -> ModuleType:
    """Import the Python file ``path`` as a module (once per process), without running its
    ``__main__`` block. Its folder goes on ``sys.path`` so it can import its neighbours. A
    file of a package (its folder has an ``__init__.py``) is imported under its package's
    name, the package's root on ``sys.path``: what it registers as ``package.module:Class``
    then resolves, as it would had the package been installed."""
    path = Path(path).resolve()
    key = str(path)
    with _lock:
        if key in _by_file:
            return _by_file[key]
        for module in list(sys.modules.values()):
            if _same_file(getattr(module, "__file__", None), key) and module.__name__ != "__main__":
                _by_file[key] = module
                return module
        if not path.is_file():
            raise RegistryError(f"cannot import {path}: no such file")
        if name is None and (module := _import_from_package(path)) is not None:
            _by_file[key] = module
            return module
        name = name or module_name_for(path)
        folder = str(path.parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise RegistryError(f"cannot import {path}: not a Python source file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            sys.modules.pop(name, None)
            raise _import_failed(path, e) from e
        _by_file[key] = module
        return module


def _import_from_package(path: Path) -> ModuleType | None:
    """``path`` imported by its dotted name in the package that holds it, or None when it is
    in no package, or that name is another module (an installed package of the same name)."""
    root, parts = path.parent, [path.stem]
    while (root / "__init__.py").is_file() and root.name.isidentifier():
        root, parts = root.parent, [root.name, *parts]
    if len(parts) == 1 or not all(p.isidentifier() for p in parts):
        return None
    name = ".".join(parts)
    if str(root) not in sys.path:
        sys.path.append(str(root))  # after what is installed: it shadows nothing
    try:
        module = importlib.import_module(name)
    except Exception as e:
        if isinstance(e, ModuleNotFoundError) and _is_missing(e, name):
            return None
        raise _import_failed(path, e) from e
    return module if _same_file(getattr(module, "__file__", None), str(path)) else None


def _import_failed(path: Path, e: BaseException) -> RegistryError:
    """What a failed import of the user's file says to do: a module it imports that is not
    installed is no fault of the file (in a worker image, the package was not put there)."""
    if isinstance(e, ModuleNotFoundError) and e.name:
        top = e.name.split(".")[0]
        advice = (
            f"'{top}' is not installed here: pip install the package that provides it (a worker "
            "image: troupe image build --pip PACKAGE, or --add the file if it is your own)"
        )
    else:
        advice = "fix the file; every worker imports it to build your components"
    return RegistryError(f"importing {path} failed: {type(e).__name__}: {e} ({advice})")


_local_roots: list[str] = []
"""Folders :func:`add_working_directory` put on ``sys.path``: modules found there are the
user's own, and their files go with the run's config (:func:`local_file`)."""


def add_working_directory() -> None:
    """Let the working directory's modules and packages be imported by name (``troupe run
    --import my_package.policies`` where ``my_package/`` is here), as ``python -m`` does;
    appended, so that nothing installed is shadowed."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
        _local_roots.append(cwd)


def local_file(module_name: str) -> str | None:
    """The file of ``module_name`` (imported already) when it is found only in a folder
    :func:`add_working_directory` added: workers started elsewhere, or a later ``troupe eval``
    from another folder, import it from there."""
    module = sys.modules.get(module_name)
    source = getattr(module, "__file__", None)
    if not source or not _local_roots or module_name.partition(".")[0] in _installed():
        return None
    path = str(Path(source).resolve())
    roots = [str(Path(r).resolve()) for r in _local_roots]
    return path if any(path.startswith(os.path.join(r, "")) for r in roots) else None


@functools.cache
def _installed() -> frozenset[str]:
    """Top-level names of installed distributions (an editable install's too: run from its
    checkout, its modules are in the working directory and still not the user's)."""
    return frozenset(importlib.metadata.packages_distributions())


def import_code(item: str, source: str = "") -> ModuleType:
    """One entry of a run's ``code.imports``: a ``.py`` file, else a module name (imported
    from ``source``, its file, where the name cannot be: see :func:`import_module`)."""
    if item.endswith(".py"):
        return import_file(_find_source(item, item))
    try:
        return import_module(item, source)
    except ImportError as e:
        raise RegistryError(
            f"code.imports: cannot import module '{item}' ({e}); name an installed module or "
            "a .py file (a worker image: troupe image build --pip PACKAGE or --add FOLDER)"
        ) from e


def import_given(items: Sequence[str]) -> None:
    """The files and modules the user named for this process (``--import``, ``imports=``),
    imported in order; each file kept as where a recorded file of its name now is
    (:func:`given_file`): another checkout, the run folder copied to another machine."""
    if isinstance(items, str):  # one string would be read a character at a time
        raise UserError(f"imports: a list of strings, not one string: write [{items!r}]")
    for item in items:
        import_code(item)
        if item.endswith(".py"):
            path = Path(item).resolve()
            _given[path.name] = path


def given_file(recorded: str) -> Path | None:
    """The file named with ``--import`` in this process that stands for ``recorded``, a file of a
    run's code that is no longer where the run recorded it (a moved checkout, another machine):
    the one of the same name. None where ``recorded`` is still there, or none was given."""
    path = Path(recorded)
    if not recorded.endswith(".py") or path.is_file():
        return None
    return _given.get(path.name)


def import_required(item: str) -> None:
    """One of a spec's ``requires`` (a file or a module), once a process. A file already run
    here is not run again, whatever its module's name: the program itself (``__main__``), or
    the script a controller was forked from. :data:`INTERACTIVE` is this process's own."""
    if item in _required or item == INTERACTIVE:
        return
    if not item.endswith(".py") or not any(
        _same_file(getattr(m, "__file__", None), item) for m in list(sys.modules.values())
    ):
        import_code(item)
    _required.add(item)


_required: set[str] = set()


def origin_of(module_name: str) -> str:
    """What another process imports to run ``module_name``'s top level again: its name where
    it is of an installed package (importing it runs its packages' ``__init__`` too, where a
    package registers its ids), else its file (a script, a file of yours), else its name:
    :data:`INTERACTIVE` for a ``__main__`` without a file (a notebook), which no other process
    can import."""
    if module_name.partition(".")[0] in _installed():
        return module_name
    return file_of(sys.modules.get(module_name)) or module_name


def module_name_for(path: Path) -> str:
    """A module name for a user file: its stem, unless that would shadow another module."""
    stem = re.sub(r"\W", "_", path.stem)
    if stem.isidentifier() and stem not in sys.modules and stem not in sys.stdlib_module_names:
        return stem
    return f"troupe_user_{stem}"


def user_code_dirs() -> list[Path]:
    value = os.environ.get(USER_CODE_ENV, DEFAULT_USER_CODE_DIR)
    return [Path(p) for p in value.split(os.pathsep) if p]


def _find_source(source: str, name: str) -> Path:
    """The recorded file, else one of its name given with ``--import`` here, else one of its
    name in a user-code folder of the image."""
    path = Path(source)
    if path.is_file():
        return path
    given = given_file(source)
    if given is not None:
        return given
    for folder in user_code_dirs():
        candidate = folder / path.name
        if candidate.is_file():
            return candidate
    raise RegistryError(
        f"cannot import '{name}': its file {source} is not here, nor in "
        f"{[str(d) for d in user_code_dirs()]}. On another machine or in a container, add it "
        f"to the worker image (troupe image build --add {path.name}), mount its folder, or "
        f"install it as a package; where it has moved, name it: --import NEW/PATH/{path.name}"
    )


def _is_missing(error: ModuleNotFoundError, name: str) -> bool:
    """Whether ``name`` itself (or a parent package) is what is missing, not something it
    imports: a user module that fails on its own imports must say so."""
    return error.name is not None and (name == error.name or name.startswith(error.name + "."))


def _same_file(a: str | None, b: str) -> bool:
    if not a:
        return False
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False
