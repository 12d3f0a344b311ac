"""A component's constructor signature, read from its source when that avoids a heavy import.

The config check compares every component's ``args`` with its constructor's parameters before
any process starts. Importing a trainer or a policy to ask ``inspect.signature`` imports torch,
which is most of the time a bad override takes to be reported (about 2 of 3 CPU seconds on a
2-core machine). A class whose ``__init__`` is written out in its module can be read without
running the module: :func:`static_signature` parses the source with :mod:`ast` and evaluates the
annotations against builtins and :mod:`typing` only (plus the module's own simple aliases such
as ``Activation = Literal["tanh", "relu"]``). An annotation it cannot resolve gives no type
check, exactly as an unresolvable forward reference does on the imported path.

Anything unusual (an inherited or decorated constructor, a ``check_args`` hook, a module that is
not a plain file) returns None, and the caller imports the component as before.
"""

from __future__ import annotations

import ast
import collections.abc
import importlib.machinery
import importlib.util
import inspect
import sys
import typing
from dataclasses import dataclass
from typing import Any

_NAMESPACE: dict[str, Any] = {
    **{name: getattr(typing, name) for name in typing.__all__},
    **{name: getattr(collections.abc, name) for name in collections.abc.__all__},
    "typing": typing,
    "None": None,
}
"""Names an annotation may use and still be judged, besides :data:`_BUILTINS`."""

_BUILTINS = {
    t.__name__: t
    for t in (int, float, bool, str, bytes, list, tuple, dict, set, frozenset, type, object)
}
"""The builtin types an annotation may name; no function is reachable from an annotation."""


@dataclass(frozen=True)
class StaticSignature:
    """A constructor's parameters and the annotations that could be resolved."""

    signature: inspect.Signature
    hints: dict[str, Any]


def static_signature(entry_point: str) -> StaticSignature | None:
    """The signature of ``"package.module:Class"`` (or a function) without importing the module."""
    module_name, _, attr = entry_point.partition(":")
    tree = _module_tree(module_name) if attr and "." not in attr else None
    if tree is None:
        return None
    function, is_class = _constructor(tree, attr)
    if function is None:
        return None
    namespace = _aliases(tree)
    params, hints = _parameters(function.args, namespace, drop_first=is_class)
    try:
        return StaticSignature(inspect.Signature(params), hints)
    except ValueError:  # e.g. an odd parameter order the AST allowed: let the import decide
        return None


UNKNOWN = object()
"""What :func:`static_class_attribute` returns when only an import could tell."""


def static_class_attribute(entry_point: str, name: str, depth: int = 4) -> Any:
    """A class attribute set to a literal (``needs_replay = True``) in the class or its bases,
    read from source; :data:`UNKNOWN` when the source does not say it plainly.

    Bases imported from :mod:`api` (the contract, cheap to import) are asked directly."""
    module_name, _, attr = entry_point.partition(":")
    tree = _module_tree(module_name) if depth > 0 and attr and "." not in attr else None
    cls = (
        next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == attr), None)
        if tree is not None
        else None
    )
    if cls is None or cls.decorator_list or cls.keywords:
        return UNKNOWN
    for node in cls.body:
        target = (
            node.targets[0]
            if isinstance(node, ast.Assign) and len(node.targets) == 1
            else (
                node.target if isinstance(node, ast.AnnAssign) and node.value is not None else None
            )
        )
        if isinstance(target, ast.Name) and target.id == name:
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return UNKNOWN
    imported = _imported_names(tree, module_name)
    for base in cls.bases:
        if not isinstance(base, ast.Name):
            return UNKNOWN
        origin = imported.get(base.id, f"{module_name}:{base.id}")
        if origin.startswith("api."):
            value = getattr(_load(origin), name, UNKNOWN)
        else:
            value = static_class_attribute(origin, name, depth - 1)
        if value is not UNKNOWN:
            return value
    return UNKNOWN


def _module_tree(module_name: str) -> ast.Module | None:
    """A module's parsed source, found without running it or its parent packages."""
    try:
        spec = _find_spec_without_importing(module_name)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return None
        with open(spec.origin, encoding="utf-8") as f:
            return ast.parse(f.read(), filename=spec.origin)
    except (ImportError, OSError, SyntaxError, ValueError):
        return None


def _find_spec_without_importing(module_name: str) -> importlib.machinery.ModuleSpec | None:
    """``importlib.util.find_spec`` imports a dotted name's parent packages, and a package's
    ``__init__`` may import torch (``algorithm.modules`` does): walk the packages' search
    locations instead, running none of them."""
    if module_name in sys.modules:
        return getattr(sys.modules[module_name], "__spec__", None)
    top, *rest = module_name.split(".")
    spec = _top_level_spec(top)
    name = top
    for part in rest:
        if spec is None or spec.submodule_search_locations is None:
            return None
        name = f"{name}.{part}"
        if name in sys.modules:
            spec = getattr(sys.modules[name], "__spec__", None)
            continue
        spec = importlib.machinery.PathFinder.find_spec(name, spec.submodule_search_locations)
    return spec


def _top_level_spec(top: str) -> importlib.machinery.ModuleSpec | None:
    """A top-level package's spec (a lookup that imports nothing). A folder of the same name
    without an ``__init__.py`` on ``sys.path`` (``tests/algorithm``, with ``tests`` on the path
    as pytest puts it) is a namespace package, and the path finder offers it before an editable
    install's finder is asked: then the other finders are asked for the real package."""
    spec = importlib.util.find_spec(top)
    if spec is None or spec.origin not in (None, "namespace"):
        return spec
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        try:
            other = find(top, None) if find is not None else None
        except (ImportError, TypeError, ValueError):
            continue
        if other is not None and other.origin not in (None, "namespace"):
            return other
    return spec


def _imported_names(tree: ast.Module, module_name: str) -> dict[str, str]:
    """``local name -> "module:attribute"`` for the module's top-level ``from X import Y``."""
    names = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}:{alias.name}"
    return names


def _load(entry_point: str) -> Any:
    module_name, _, attr = entry_point.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError):
        return None


def _constructor(tree: ast.Module, name: str) -> tuple[ast.FunctionDef | None, bool]:
    """The ``__init__`` of class ``name`` (or function ``name``) when it is plainly written."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return (None, False) if node.decorator_list else (node, False)
        if isinstance(node, ast.ClassDef) and node.name == name:
            if node.decorator_list or node.keywords:
                return None, True
            methods = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
            if "check_args" in methods or "__new__" in methods or "__init__" not in methods:
                return None, True
            init = methods["__init__"]
            return (None, True) if init.decorator_list else (init, True)
    return None, False


def _aliases(tree: ast.Module) -> dict[str, Any]:
    """The module's top-level ``Name = <annotation>`` aliases that resolve on their own."""
    namespace = dict(_NAMESPACE)
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and value is not None:
            resolved = _evaluate(value, namespace)
            if resolved is not inspect.Parameter.empty:
                namespace[target.id] = resolved
    return namespace


_ANNOTATION_NODES = (
    ast.Expression,
    ast.Name,
    ast.Attribute,
    ast.Subscript,
    ast.Tuple,
    ast.List,
    ast.Constant,
    ast.BinOp,
    ast.BitOr,
    ast.Load,
    ast.Slice,
)
"""What an annotation is made of; anything else (a call above all) is not evaluated."""


def _evaluate(node: ast.expr, namespace: dict[str, Any]) -> Any:
    """An annotation's value, or ``Parameter.empty`` when it is not a plain type expression or
    names anything we do not know. Strings are forward references: parsed, then judged alike."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return inspect.Parameter.empty
    expression = ast.Expression(body=node)
    if not all(isinstance(n, _ANNOTATION_NODES) for n in ast.walk(expression)):
        return inspect.Parameter.empty
    try:
        code = compile(expression, "<annotation>", "eval")
        return eval(code, {"__builtins__": _BUILTINS}, namespace)
    except Exception:
        return inspect.Parameter.empty


def _parameters(
    args: ast.arguments, namespace: dict[str, Any], drop_first: bool
) -> tuple[list[inspect.Parameter], dict[str, Any]]:
    P = inspect.Parameter
    positional = [(a, P.POSITIONAL_ONLY) for a in args.posonlyargs]
    positional += [(a, P.POSITIONAL_OR_KEYWORD) for a in args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    entries = list(zip(positional, defaults))
    if drop_first and entries:
        entries = entries[1:]
    if args.vararg:
        entries.append(((args.vararg, P.VAR_POSITIONAL), None))
    entries += [((a, P.KEYWORD_ONLY), d) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        entries.append(((args.kwarg, P.VAR_KEYWORD), None))
    params, hints = [], {}
    for (arg, kind), default in entries:
        hint = P.empty
        if arg.annotation is not None:
            hint = _evaluate(arg.annotation, namespace)
            if hint is not P.empty:
                hints[arg.arg] = hint
        params.append(P(arg.arg, kind, default=_default(default), annotation=hint))
    return params, hints


def _default(node: ast.expr | None) -> Any:
    """A literal default as its value; any other default as ``...`` (present, not shown)."""
    if node is None:
        return inspect.Parameter.empty
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ...
