"""The package has no import circles (data flows one way: manifest -> plan -> compile ->
store -> package -> runtime), lazy imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _module_graph() -> dict[str, set[str]]:
    mods: dict[str, Path] = {}
    for p in (REPO / "gemmar_aot").rglob("*.py"):
        rel = p.relative_to(REPO).with_suffix("")
        mods[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = p
    graph: dict[str, set[str]] = {}
    for name, p in mods.items():
        pkg = name if p.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    m = ".".join(base + ([node.module] if node.module else []))
                else:
                    m = node.module or ""
                # ``from pkg import submodule`` depends on the submodule, not on pkg's other parts.
                deps.update(f"{m}.{a.name}" if f"{m}.{a.name}" in mods else m for a in node.names)
        resolved = set()
        for d in deps:
            while d and d not in mods:
                d = d.rsplit(".", 1)[0] if "." in d else ""
            if d and d != name:
                resolved.add(d)
        graph[name] = resolved
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    assert _cycles(_module_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_cli_command_modules_do_not_import_the_cli_package():
    graph = _module_graph()
    for name in ("gemmar_aot.cli.build", "gemmar_aot.cli.store", "gemmar_aot.cli.runtime", "gemmar_aot.cli.wheel"):
        assert "gemmar_aot.cli" not in graph[name], name
    assert "gemmar_aot.store.maint" not in graph["gemmar_aot.store.cas"]


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others (lazy imports included)."""
    seen, todo = set(), [start]
    while todo:
        for d in graph.get(todo.pop(), ()):
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


#: What the build side is, for the layer rules below: the modules that plan, compile, store and
#: package kernels (the runtime's own import rule, ``tests/test_runtime.py``, checks what a pod loads).
BUILD_SIDE = ("gemmar_aot.build", "gemmar_aot.compiler", "gemmar_aot.store", "gemmar_aot.wheel", "gemmar_aot.keys",
              "gemmar_aot.cli")


def _under(mod: str, prefixes) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def test_the_model_layer_imports_nothing_of_the_build_store_compiler_or_package():
    """gemmar_aot.model is what the build and the runtime share: it imports, at any depth, the
    standard-library-only modules it builds on and nothing of the sides that use it."""
    graph = _module_graph()
    model = [m for m in graph if _under(m, ("gemmar_aot.model",))]
    assert len(model) >= 7, model  # the package and its six modules
    for m in model:
        bad = sorted(d for d in _reaches(graph, m) if _under(d, BUILD_SIDE) or _under(d, ("gemmar_aot.runtime",)))
        assert bad == [], f"{m} reaches {bad}"


def test_the_runtime_imports_no_build_side_module():
    graph = _module_graph()
    for m in (m for m in graph if _under(m, ("gemmar_aot.runtime",))):
        # the runtime reads lock files and stores: the store's reading half is shared by design
        bad = sorted(d for d in graph[m] if _under(d, BUILD_SIDE) and not _under(d, ("gemmar_aot.store",)))
        assert bad == [], f"{m} imports {bad}"


def test_the_layer_rule_sees_a_violation():
    graph = {"gemmar_aot.model.lock": {"gemmar_aot.model.types"}, "gemmar_aot.model.types": {"gemmar_aot.store.cas"}}
    assert _reaches(graph, "gemmar_aot.model.lock") == {"gemmar_aot.model.types", "gemmar_aot.store.cas"}
