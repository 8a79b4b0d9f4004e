"""The normal form of our own Python code that an action key hashes.

A key covers the code that can change an action's outputs, and nothing else. Hashing a
module's file bytes (what key schema 2 did) also hashes its comments, docstrings,
formatting and path, so a docstring fix re-keyed every kernel of every store. The normal
form is the module's *import name* and its syntax tree:

* comments, blank lines, line breaks, indentation style, parentheses and quote style are
  not in a syntax tree at all;
* docstrings (a string literal standing alone as the first statement of a module, class
  or function) are dropped. Code that reads ``__doc__`` would see the difference; none of
  the compile or derive code does (``tests/test_source_form.py`` checks the lists);
* every other node, name, operator and constant is kept, with its type, so any change a
  program can observe changes the digest.

The tree is written by :func:`_dump`, not :func:`ast.dump`, because keys travel across
Pythons (3.11 and 3.12 runners share a cache): ``ast.dump``'s text changes between
versions, and newer versions add fields (``type_params``) that are empty for code that
does not use the new syntax. ``_dump`` writes each node's type and its fields in sorted
order and leaves out fields that are ``None`` or empty, and writes an f-string's literal
parts joined (:func:`_fstring_parts`), so a tree that means the same under 3.10 to 3.13 is
written the same (``tests/test_source_form.py`` checks the whole package under every
CPython it finds). Source positions are not fields, so they are never written.

Standard library only.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from functools import lru_cache

#: Bump when the normal form itself changes (it is part of every digest made here).
FORM_VERSION = 1


class SourceFormError(RuntimeError):
    """A module the key needs could not be found or parsed."""


def _is_docstring(node: ast.AST) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str))


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and _is_docstring(body[0]):
                # A module may be empty; a class or function body may not: there a lone
                # docstring becomes ``...``, which does what it did (nothing).
                node.body = body[1:] or ([] if isinstance(node, ast.Module) else [ast.Expr(ast.Constant(...))])
    return tree


def _fstring_parts(values: list) -> list:
    """An f-string's parts with empty literals dropped and adjacent literals joined: CPython
    3.12.0-3.12.1 put an empty ``Constant('')`` after a nested format spec's last field, where
    3.10, 3.11 and 3.13 put nothing; both mean the same string."""
    out: list = []
    for v in values:
        if isinstance(v, ast.Constant) and isinstance(v.value, str):
            if not v.value:
                continue
            if out and isinstance(out[-1], ast.Constant) and isinstance(out[-1].value, str):
                out[-1] = ast.Constant(out[-1].value + v.value)
                continue
        out.append(v)
    return out


def _dump(node: object, out: list[str]) -> None:
    if isinstance(node, ast.JoinedStr):
        node = ast.JoinedStr(values=_fstring_parts(node.values))
    if isinstance(node, ast.AST):
        out.append(type(node).__name__)
        out.append("(")
        for name in sorted(node._fields):
            value = getattr(node, name, None)
            if value is None or value == []:
                continue
            if name == "kind" and isinstance(node, ast.Constant):
                continue  # the u"" prefix: no meaning in Python 3
            out.append(name)
            out.append("=")
            _dump(value, out)
            out.append(",")
        out.append(")")
    elif isinstance(node, list):
        out.append("[")
        for item in node:
            _dump(item, out)
            out.append(",")
        out.append("]")
    else:
        # Constants, identifiers, operators' names: the type keeps 1, 1.0, True and "1" apart.
        out.append(f"{type(node).__name__}:{node!r}")


def normal_form(source: str | bytes, *, filename: str = "<source>") -> str:
    """The text :func:`module_digest` hashes: ``source``'s tree without docstrings."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as e:
        raise SourceFormError(f"{filename}: cannot parse ({e.msg}, line {e.lineno})") from None
    out: list[str] = []
    _dump(_strip_docstrings(tree), out)
    return "".join(out)


def module_source(name: str) -> tuple[str, bytes]:
    """(origin path, bytes) of the module ``name`` as this interpreter would import it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as e:
        raise SourceFormError(f"module {name}: {e}") from None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise SourceFormError(
            f"module {name} has no Python source (found {getattr(spec, 'origin', None)!r}); "
            f"the key hashes the source of every compile and derive module: install the "
            f"package from source (pip install -e .)")
    with open(spec.origin, "rb") as f:
        return spec.origin, f.read()


@lru_cache(maxsize=None)
def module_digest(name: str) -> str:
    """sha256 of the import name and the normal form of module ``name``; never its path."""
    origin, data = module_source(name)
    h = hashlib.sha256()
    h.update(f"source-form {FORM_VERSION}\0{name}\0".encode())
    h.update(normal_form(data, filename=origin).encode())
    return h.hexdigest()


def modules_digest(names) -> str:
    """One digest over the modules ``names`` (order and duplicates do not matter)."""
    h = hashlib.sha256()
    for name in sorted(set(names)):
        h.update(f"{name}\0{module_digest(name)}\0".encode())
    return h.hexdigest()
