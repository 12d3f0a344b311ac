"""Every key of a resolved experiment with its type, default, value and documentation.

``troupe show-config EXP`` prints this. The documentation of a config field is the docstring
written under it in its dataclass (read from the source, as Sphinx does); a component argument's
is its line in the constructor's ``Args:`` section, its type the annotation and its default the
signature's.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import re
import textwrap
import typing
from dataclasses import dataclass
from typing import Any

from api.config.arguments import close_names, describe
from api.config.schema import ExperimentConfig
from api.errors import RegistryError, UserError
from api.registry import REGISTRIES

MISSING = "-"


@dataclass
class KeyDoc:
    path: str
    type: str
    default: Any
    value: Any
    doc: str


def matching(rows: list[KeyDoc], keys: list[str]) -> list[KeyDoc]:
    """The rows under any of ``keys``: a key is a whole dotted path or a run of its parts
    (``trainer`` shows ``policies.default.trainer.*``, ``lr`` every learning rate, ``stop`` the
    stopping rule). Raises UserError naming a key that matches none, with the closest parts.
    ``troupe show-config`` printed some 400 lines, through which a user looked for one."""
    for key in keys:
        if not any(_under(row.path, key) for row in rows):
            close = _closest(rows, key)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise UserError(f"no key of this experiment is or holds '{key}'{hint}")
    return [row for row in rows if any(_under(row.path, key) for key in keys)]


def _closest(rows: list[KeyDoc], key: str) -> list[str]:
    """The parts closest to the key's last, by spelling or by the name other libraries use
    (``learning_rate`` is ``lr``); with the key's other parts in front where that matches."""
    parts = sorted({part for row in rows for part in row.path.split(".")})
    *head, last = key.split(".")
    close = close_names(last, parts, n=3)
    whole = [".".join([*head, c]) for c in close]
    found = [w for w in whole if head and any(_under(row.path, w) for row in rows)]
    return found or close


def _under(path: str, key: str) -> bool:
    return f".{key}." in f".{path}." or f".{path}.".startswith(f".{key}.")


def describe_config(config: ExperimentConfig) -> list[KeyDoc]:
    """One entry per settable key, in the config's own order."""
    rows: list[KeyDoc] = []
    _dataclass_rows(config, type(config)(), "", rows)
    return rows


def _dataclass_rows(obj: Any, default_obj: Any, path: str, rows: list[KeyDoc]) -> None:
    docs = field_docs(type(obj))
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        key = f"{path}.{f.name}" if path else f.name
        value = getattr(obj, f.name)
        default = getattr(default_obj, f.name, MISSING) if default_obj is not None else MISSING
        if dataclasses.is_dataclass(value):
            _dataclass_rows(value, default, key, rows)
        elif f.name == "policies" and isinstance(value, dict):
            for name, pc in value.items():
                _dataclass_rows(pc, type(pc)(), f"{key}.{name}", rows)
        elif f.name == "args" and path:
            kind = _component_kind(path)
            rows.append(KeyDoc(f"{key}", "dict", {}, value, docs.get(f.name, "")))
            rows.extend(_argument_rows(kind, obj.type, key, value))
        else:
            rows.append(KeyDoc(key, describe(hints[f.name]), default, value, docs.get(f.name, "")))


def _component_kind(path: str) -> str:
    last = path.rsplit(".", 1)[-1]
    if path == "environment":
        return "environment"
    return {"policy": "policy", "trainer": "trainer"}.get(last, "callback")


SKIP = {"policy": ("observation_space", "action_space"), "trainer": ("policy",)}


def _argument_rows(kind: str, name: str, path: str, values: dict[str, Any]) -> list[KeyDoc]:
    if not name:
        return []
    try:
        spec = REGISTRIES[kind].spec(name)
        factory = spec.load()
        sig = inspect.signature(factory)
        values = {**spec.kwargs, **values}  # the registered defaults, e.g. a gymnasium id
    except (RegistryError, TypeError, ValueError):
        return []
    target = factory.__init__ if inspect.isclass(factory) else factory
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # unresolvable annotations: show the parameter without a type
        hints = {}
    docs = argument_docs(factory)
    rows = []
    for pname, param in sig.parameters.items():
        if pname in SKIP.get(kind, ()) or param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
            continue
        default = MISSING if param.default is param.empty else param.default
        value = values.get(pname, default)
        kind_text = describe(hints[pname]) if pname in hints else ""
        rows.append(KeyDoc(f"{path}.{pname}", kind_text, default, value, docs.get(pname, "")))
    return rows


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` from the string literal written under each field."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def argument_docs(factory: Any) -> dict[str, str]:
    """``{argument: text}`` from a Google-style ``Args:`` section of the docstring."""
    doc = inspect.getdoc(factory) or ""
    match = re.search(r"^Args:\n(.*?)(?:\n\S|\Z)", doc, flags=re.S | re.M)
    if not match:
        return {}
    docs: dict[str, str] = {}
    current = None
    for line in match.group(1).splitlines():
        head = re.match(r"^\s{2,4}(\w+)(?: \(.*?\))?: ?(.*)$", line)
        if head:
            current = head.group(1)
            docs[current] = head.group(2).strip()
        elif current and line.strip():
            docs[current] += " " + line.strip()
    return docs
