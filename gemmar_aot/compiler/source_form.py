"""The normal form of our own Python code that an action key hashes.

A key covers the code that can change an action's outputs, and nothing else. Hashing a
module's file bytes (what key schema 2 did) also hashes its comments, docstrings,
formatting and path, so a docstring fix re-keyed every kernel of every store; hashing its
import name (key schema 3) re-keyed them all when a module moved. The normal form is the
module's *logical name* and its syntax tree (form 2, key schema 4):

* the logical name comes from one registry (:class:`ModuleNames`, ``gemmar_aot.compiler.keys.MODULES``):
  what the module is, never where it lives. Every import of a module of ours (absolute or
  relative, ``from pkg import module`` included) is written with the logical name of the
  module it resolves to, so moving or renaming a module -- its importers updated, the
  registry's entry pointed at its new place -- changes no digest. An import of a module of
  ours the registry does not name is an error, never a silent pass;

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
import importlib.machinery
import importlib.util
from functools import lru_cache

#: Bump when the normal form itself changes (it is part of every digest made here).
#: 2: logical module names instead of import names (key schema 4).
FORM_VERSION = 2
#: The top-level packages whose modules are "ours": written by logical name.
OUR_PACKAGES = ("gemmar_aot", "gemmar_aot_kernels")


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


class ModuleNames:
    """The registry of logical module names: logical name <-> import name, one to one.
    Hashable (a digest is cached per registry)."""

    __slots__ = ("_by_import", "_by_logical", "_hash")

    def __init__(self, logical_to_import: dict[str, str]):
        by_import = {imp: name for name, imp in logical_to_import.items()}
        if len(by_import) != len(logical_to_import):
            dup = sorted(imp for imp in by_import if list(logical_to_import.values()).count(imp) > 1)
            raise SourceFormError(f"the module registry names {dup} twice: one logical name per module")
        self._by_logical = dict(logical_to_import)
        self._by_import = by_import
        self._hash = hash(tuple(sorted(self._by_logical.items())))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ModuleNames) and self._by_logical == other._by_logical

    def import_name(self, logical: str) -> str:
        try:
            return self._by_logical[logical]
        except KeyError:
            raise SourceFormError(f"no module is registered as {logical!r} (gemmar_aot.compiler.keys.MODULES)") from None

    def logical(self, import_name: str, *, imported_by: str = "") -> str:
        got = self._by_import.get(import_name)
        if got is None:
            by = f" (imported by {imported_by})" if imported_by else ""
            raise SourceFormError(
                f"module {import_name}{by} has no logical name: every module of ours that compile or derive "
                f"code is or imports must be in gemmar_aot.compiler.keys.MODULES; add it (a name for what it is)")
        return got

    def has(self, import_name: str) -> bool:
        return import_name in self._by_import


def _ours(name: str | None) -> bool:
    return bool(name) and name.split(".", 1)[0] in OUR_PACKAGES


def _resolve(module: str | None, level: int, package: str) -> str:
    """The absolute name a ``from`` import names (``level`` dots, relative to ``package``)."""
    if level == 0:
        return module or ""
    base = package.split(".")
    if level > 1:
        base = base[:-(level - 1)]
    return ".".join(base + ([module] if module else []))


class _LogicalImports(ast.NodeTransformer):
    """Every import of a module of ours written as ``import @<logical>`` / ``from @<logical> import``."""

    def __init__(self, names: ModuleNames, package: str, where: str):
        self.names, self.package, self.where = names, package, where

    def visit_Import(self, node: ast.Import) -> ast.AST:
        for a in node.names:
            if _ours(a.name):
                a.name = "@" + self.names.logical(a.name, imported_by=self.where)
        return node

    def visit_ImportFrom(self, node: ast.ImportFrom):
        target = _resolve(node.module, node.level, self.package)
        if not _ours(target):
            return node
        out: list[ast.AST] = []
        rest = []
        for a in node.names:  # ``from pkg import module``: an import of that module, wherever pkg is
            sub = f"{target}.{a.name}"
            if a.name != "*" and (self.names.has(sub) or _is_module(sub)):
                out.append(ast.Import(names=[ast.alias(name="@" + self.names.logical(sub, imported_by=self.where),
                                                       asname=a.asname or a.name)]))
            else:
                rest.append(a)
        if rest:
            out.insert(0, ast.ImportFrom(module="@" + self.names.logical(target, imported_by=self.where), names=rest,
                                         level=0))
        return out


def _is_module(name: str) -> bool:
    """Whether ``name`` is a module, found in its parent package's directories without importing
    the parent (``importlib.util.find_spec(name)`` would import it: hashing our code must not run it)."""
    parent = name.rpartition(".")[0]
    try:
        spec = importlib.util.find_spec(parent)
    except (ImportError, ValueError, AttributeError):
        return False
    locations = spec.submodule_search_locations if spec is not None else None
    return bool(locations) and importlib.machinery.PathFinder.find_spec(name, list(locations)) is not None


def normal_form(source: str | bytes, *, filename: str = "<source>", package: str | None = None,
                names: ModuleNames | None = None) -> str:
    """The text :func:`module_digest` hashes: ``source``'s tree without docstrings; with ``names``
    (and the ``package`` relative imports resolve against), its imports of our modules by
    logical name."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as e:
        raise SourceFormError(f"{filename}: cannot parse ({e.msg}, line {e.lineno})") from None
    tree = _strip_docstrings(tree)
    if names is not None:
        tree = _LogicalImports(names, package or "", filename).visit(tree)
    out: list[str] = []
    _dump(tree, out)
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
def module_digest(logical: str, names: ModuleNames) -> str:
    """sha256 of the logical name and the normal form of the module registered as ``logical``:
    never its import name or its path."""
    name = names.import_name(logical)
    origin, data = module_source(name)
    package = name if origin.endswith("__init__.py") else name.rpartition(".")[0]
    h = hashlib.sha256()
    h.update(f"source-form {FORM_VERSION}\0{logical}\0".encode())
    h.update(normal_form(data, filename=origin, package=package, names=names).encode())
    return h.hexdigest()


def modules_digest(logicals, names: ModuleNames) -> str:
    """One digest over the modules registered as ``logicals`` (order and duplicates do not matter)."""
    h = hashlib.sha256()
    for logical in sorted(set(logicals)):
        h.update(f"{logical}\0{module_digest(logical, names)}\0".encode())
    return h.hexdigest()
