"""The package's imports, lazy ones inside functions included: no circles, and layers that
import only downwards (shared -> compiler/keys -> store -> build -> package, the runtime a
branch of its own, the CLI on top), data flowing one way: manifest -> plan -> compile -> store
-> package -> runtime."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _module_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports: ``gemmar_aot`` and the recipes (``kernels/``,
    installed as ``gemmar_aot_kernels``)."""
    mods: dict[str, Path] = {}
    for root, top in (("gemmar_aot", "gemmar_aot"), ("kernels", "gemmar_aot_kernels")):
        for p in (REPO / root).rglob("*.py"):
            parts = (top, *p.relative_to(REPO / root).with_suffix("").parts)
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
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
    for name in ("gemmar_aot.cli.build_commands", "gemmar_aot.cli.store_commands", "gemmar_aot.cli.runtime_commands", "gemmar_aot.cli.wheel_commands"):
        assert "gemmar_aot.cli" not in graph[name], name
    # The store never imports its maintenance (none of it is needed at serving time).
    for mod in ("gemmar_aot.store.inventory", "gemmar_aot.store.gc", "gemmar_aot.store.transfer",
                "gemmar_aot.store.dictionaries"):
        assert mod in graph and mod not in _reaches(graph, "gemmar_aot.store.cas"), mod


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
BUILD_SIDE = ("gemmar_aot.builder", "gemmar_aot.compiler", "gemmar_aot_kernels", "gemmar_aot.store", "gemmar_aot.package",
              "gemmar_aot.compiler.keys", "gemmar_aot.cli")


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


# ---------------------------------------------------------------------------
# layers
# ---------------------------------------------------------------------------

#: Every module's layer, lowest first, by import name (a name or a package prefix). A module
#: imports (lazily or not) only modules of its own layer or lower ones. The store is below the
#: compiler: a compile worker (and the Ray executor, and the derive step) writes and reads the
#: store, and the store knows nothing of what compiled its bytes.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("shared", ("gemmar_aot.model", "gemmar_aot.util", "gemmar_aot.trust")),
    ("store", ("gemmar_aot.store",)),
    ("toolchain", ("gemmar_aot.toolchain",)),
    ("compiler", ("gemmar_aot.compiler", "gemmar_aot_kernels")),
    ("build", ("gemmar_aot.builder",)),
    ("package", ("gemmar_aot.package",)),
    # A branch of its own above the store: see RUNTIME_MAY_REACH. mori_patch is the runtime's
    # import hook for servers that import mori's op.
    ("runtime", ("gemmar_aot.runtime", "gemmar_aot.mori_patch")),
    ("cli", ("gemmar_aot.cli", "gemmar_aot.__main__")),
)
#: The package's own ``__init__`` (its docstring and version) is shared.
SHARED_ROOT = "gemmar_aot"
#: The layers the runtime may reach, at any depth: no toolchain, compiler, keys, build or package.
RUNTIME_MAY_REACH = ("shared", "store", "runtime")
#: Store modules only the build side uses (maintenance, writing a pack, the remote cache's
#: backend): the runtime reaches the store's reading half only.
STORE_BUILD_ONLY = ("gemmar_aot.store.inventory", "gemmar_aot.store.gc", "gemmar_aot.store.transfer",
                    "gemmar_aot.store.dictionaries", "gemmar_aot.store.pack_encode", "gemmar_aot.store.remote")


def _layer(mod: str) -> str | None:
    if mod == SHARED_ROOT:
        return "shared"
    found = [(len(p), name) for name, prefixes in LAYERS for p in prefixes if _under(mod, (p,))]
    return max(found)[1] if found else None


def _rank(mod: str) -> int:
    return [name for name, _ in LAYERS].index(_layer(mod))


def _layer_violations(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) for every import from a lower layer to a higher one, and every
    module the runtime reaches outside RUNTIME_MAY_REACH or in STORE_BUILD_ONLY."""
    out = {(m, d) for m, deps in graph.items() for d in deps if _rank(d) > _rank(m)}
    for m in (m for m in graph if _layer(m) == "runtime"):
        out |= {(m, d) for d in _reaches(graph, m)
                if _layer(d) not in RUNTIME_MAY_REACH or _under(d, STORE_BUILD_ONLY)}
    return out


def test_every_module_has_a_layer():
    graph = _module_graph()
    assert sorted(m for m in graph if _layer(m) is None) == []
    assert _layer("gemmar_aot.builder.pipeline") == "build" and _layer("gemmar_aot.compiler.keys") == "compiler"
    assert _layer("gemmar_aot.package.wheel") == "package" and _layer("gemmar_aot.store.cas") == "store"


def test_imports_go_down_the_layers():
    assert sorted(_layer_violations(_module_graph())) == [], "imports from a lower layer to a higher one"


def test_the_layer_checker_sees_violations():
    graph = {
        "gemmar_aot.model.spec": set(),
        "gemmar_aot.model.types": {"gemmar_aot.model.spec", "gemmar_aot.store.cas"},  # shared -> store
        "gemmar_aot.store.cas": {"gemmar_aot.model.spec"},
        "gemmar_aot.store.gc": {"gemmar_aot.store.cas", "gemmar_aot.compiler.keys"},  # store -> keys
        "gemmar_aot.compiler.worker": {"gemmar_aot.store.cas", "gemmar_aot.compiler.keys"},  # down, allowed
        "gemmar_aot.compiler.keys": {"gemmar_aot.builder.plan"},  # keys -> build
        "gemmar_aot.builder.plan": {"gemmar_aot.compiler.keys", "gemmar_aot.package.wheel"},  # build -> package
        "gemmar_aot.package.wheel": {"gemmar_aot.builder.plan"},
        "gemmar_aot.runtime.op": {"gemmar_aot.store.gc"},  # runtime -> store's build half (-> keys)
        "gemmar_aot.cli.build_commands": {"gemmar_aot.runtime.op", "gemmar_aot.builder.plan"},
    }
    assert _layer_violations(graph) == {
        ("gemmar_aot.model.types", "gemmar_aot.store.cas"),
        ("gemmar_aot.store.gc", "gemmar_aot.compiler.keys"),
        ("gemmar_aot.compiler.keys", "gemmar_aot.builder.plan"),
        ("gemmar_aot.builder.plan", "gemmar_aot.package.wheel"),
        ("gemmar_aot.runtime.op", "gemmar_aot.store.gc"),
        ("gemmar_aot.runtime.op", "gemmar_aot.compiler.keys"),
        ("gemmar_aot.runtime.op", "gemmar_aot.builder.plan"),
        ("gemmar_aot.runtime.op", "gemmar_aot.package.wheel"),
    }


# ---------------------------------------------------------------------------
# rooms a reader can find, files and functions a reader can hold
# ---------------------------------------------------------------------------

#: The top of the package: the package itself, ``python -m gemmar_aot``, and the one entry file
#: installed hooks import by name (``mori_patch``: its name is written into every ``.pth``).
TOP_LEVEL = {"__init__.py", "__main__.py", "mori_patch.py"}
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _package_files() -> list[Path]:
    return sorted(p for p in (REPO / "gemmar_aot").rglob("*.py") if "__pycache__" not in p.parts)


def test_every_module_lives_in_the_package_of_its_side():
    top = {p.name for p in (REPO / "gemmar_aot").glob("*.py")}
    assert top == TOP_LEVEL, f"modules at the top of gemmar_aot/: {sorted(top - TOP_LEVEL)}; move each into its package"


def test_no_module_is_longer_than_a_reader_can_hold():
    long = {str(p.relative_to(REPO)): n for p in _package_files()
            if (n := p.read_text().count("\n")) > MAX_MODULE_LINES}
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: {long}; split each by its concerns"


def test_no_function_is_longer_than_a_reader_can_hold():
    import ast

    long = {}
    for p in _package_files():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(REPO)}:{node.lineno} {node.name}"] = n
    assert long == {}, f"functions over {MAX_FUNCTION_LINES} lines: {long}; split each into named steps"


#: Every module of ours a pod imports to serve the collective op (``from gemmar_aot.runtime import
#: GemmAllReduceOp``, torch already imported): the shared model of a lock and its kernels, the
#: store's reading half, the runtime. Not the trust package (only when trusted keys are set),
#: not the store's write side (only when a record or code object is not in the lock's indexes),
#: not the EP op (only when asked for), nothing of the toolchain, compiler, build or package. A
#: change here is a change of what every pod pays.
POD_IMPORTS = {
    "gemmar_aot", "gemmar_aot.model", "gemmar_aot.model.bundle", "gemmar_aot.model.lock_codec", "gemmar_aot.model.codeobject",
    "gemmar_aot.model.device_abi", "gemmar_aot.model.launch", "gemmar_aot.model.launch_sequence",
    "gemmar_aot.model.layout", "gemmar_aot.model.lock", "gemmar_aot.model.manifest_lines", "gemmar_aot.model.rules",
    "gemmar_aot.model.schema", "gemmar_aot.model.spec", "gemmar_aot.model.types", "gemmar_aot.model.validate",
    "gemmar_aot.runtime", "gemmar_aot.runtime.artifacts", "gemmar_aot.runtime.driver", "gemmar_aot.runtime.artifact_errors",
    "gemmar_aot.runtime.gc_pause", "gemmar_aot.runtime.launches",
    "gemmar_aot.runtime.loading", "gemmar_aot.runtime.memory", "gemmar_aot.runtime.misses", "gemmar_aot.runtime.op",
    "gemmar_aot.runtime.operands", "gemmar_aot.runtime.padding", "gemmar_aot.runtime.provenance",
    "gemmar_aot.runtime.record_binding", "gemmar_aot.runtime.self_test", "gemmar_aot.runtime.support",
    "gemmar_aot.runtime.kernel_checks",
    "gemmar_aot.runtime.window", "gemmar_aot.store", "gemmar_aot.store._fs", "gemmar_aot.store.backend",
    "gemmar_aot.store.blob_index", "gemmar_aot.store.blobfmt", "gemmar_aot.store.store_errors", "gemmar_aot.store.record",
    "gemmar_aot.store.record_index", "gemmar_aot.util", "gemmar_aot.util.atomic_write",
    "gemmar_aot.util.canonical_json", "gemmar_aot.util.errors",
    "gemmar_aot.util.filedigest",
}
#: ``import gemmar_aot.runtime`` alone: the errors a caller catches, nothing else.
RUNTIME_PACKAGE_IMPORTS = {"gemmar_aot", "gemmar_aot.runtime", "gemmar_aot.runtime.artifact_errors", "gemmar_aot.util",
                           "gemmar_aot.util.errors"}


def _new_modules(statement: str) -> set[str]:
    import json
    import subprocess
    import sys

    code = f"import json, sys, torch; before = set(sys.modules); {statement}; print(json.dumps(sorted(set(sys.modules) - before)))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert p.returncode == 0, p.stderr
    return set(json.loads(p.stdout))


def test_a_pod_imports_exactly_the_modules_it_uses():
    new = _new_modules("import gemmar_aot.runtime")
    assert {m for m in new if m.split(".")[0] == "gemmar_aot"} == RUNTIME_PACKAGE_IMPORTS
    new = _new_modules("from gemmar_aot.runtime import GemmAllReduceOp")
    ours = {m for m in new if m.split(".")[0] == "gemmar_aot"}
    assert ours == POD_IMPORTS, (f"the pod now imports {sorted(ours - POD_IMPORTS)} and no longer "
                                 f"{sorted(POD_IMPORTS - ours)}")
    assert not {m for m in new if m.split(".")[0] in ("cryptography", "flydsl", "mlir", "filelock", "click", "jsonschema")}


#: The steps of getting kernels ready, and the runtime modules that call each: ``.loading`` (every
#: op, through ``LoadedOp._load``) and ``.hipcc_server`` (mori's own kernels: the same provenance step,
#: then the whole-object check). Another caller is another way to load: fold it into the path.
LOADING_STEPS = {"check_built": ["hipcc_server.py", "jitv2_server.py", "loading.py"], "check_provenance": ["loading.py"],
                 "check_device": ["loading.py"], "verify_kernels": ["loading.py"], "verify_entries": ["loading.py"],
                 "check_installed_mori": ["loading.py"], "load_module": ["loading.py"],
                 "verify_whole_object": ["hipcc_server.py", "jitv2_server.py"]}


def test_every_op_gets_its_kernels_one_way():
    """Each step of the loading path (provenance, device, verification, loading) is called from one
    place in the runtime: the ops state what they load and call ``LoadedOp._load``; mori's hipcc and
    JIT v2 kernels take the same provenance step and their own whole-object check."""
    callers: dict[str, set[str]] = {}
    for p in sorted((REPO / "gemmar_aot" / "runtime").glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
                if name in LOADING_STEPS:
                    callers.setdefault(name, set()).add(p.name)
    assert {k: sorted(v) for k, v in callers.items()} == LOADING_STEPS
    ops = {p.name for p in (REPO / "gemmar_aot" / "runtime").glob("*.py") if "self._load(" in p.read_text()}
    assert ops == {"op.py", "ep_op.py", "gemm.py"}, ops


def test_every_module_has_a_name_of_its_own():
    """No two modules of the package share a file name (``__init__`` and ``__main__`` aside): a
    name says what the module is wherever it is shown alone (a traceback, an editor tab, a
    tool's file list), and a folder named ``build/`` is not one (tools skip it as output)."""
    names: dict[str, list[str]] = {}
    for p in _package_files():
        if p.name not in ("__init__.py", "__main__.py"):
            names.setdefault(p.name, []).append(str(p.relative_to(REPO)))
    assert {n: ps for n, ps in names.items() if len(ps) > 1} == {}
    assert not [p for p in (REPO / "gemmar_aot").rglob("*") if p.is_dir() and p.name in ("build", "dist")]
