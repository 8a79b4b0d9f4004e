"""A copy of our code (``gemmar_aot`` and the recipes) to edit, and a way to run it.

The key-stability tests edit a *copy* of the package -- comments, docstrings, a parser
rewrite, a builder argument -- and run it in a subprocess: ``PYTHONPATH`` puts the copy
ahead of the editable install, and ``$GEMMAR_AOT_TOOLCHAIN`` points it at this checkout's
toolchain (the copy has none of its own).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Prints, as JSON, every action key of each manifest given (plan and keys only, no compile).
KEYS_SCRIPT = """
import json, sys
from gemmar_aot.compiler.keys import action_key, ingredients
from gemmar_aot.builder.manifest import load_manifest
from gemmar_aot.builder.plan import make_plan
from gemmar_aot.toolchain import load_toolchain
import gemmar_aot, gemmar_aot_kernels
fp = load_toolchain().fingerprint
out = {"package": gemmar_aot.__file__, "kernels": gemmar_aot_kernels.__file__, "keys": {}}
for m in sys.argv[1:]:
    plan = make_plan(load_manifest(m))
    out["keys"][m] = {s.spec_id: [s.label(), action_key(ingredients(s, fp))] for s in plan.specs}
print(json.dumps(out))
"""


def copy_tree(dest: Path) -> Path:
    """``dest/gemmar_aot`` and ``dest/gemmar_aot_kernels``, copies of ours; returns ``dest``."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "gemmar_aot", dest / "gemmar_aot", ignore=ignore)
    shutil.copytree(ROOT / "kernels", dest / "gemmar_aot_kernels", ignore=ignore)
    return dest


def env_for(tree: Path) -> dict:
    from gemmar_aot.toolchain.paths import toolchain_root

    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["GEMMAR_AOT_TOOLCHAIN"] = str(toolchain_root())
    env.pop("GEMMAR_AOT_STORE", None)
    return env


def run(tree: Path | None, *args: str, **kw) -> subprocess.CompletedProcess:
    """``python *args`` with the copy ``tree`` (None: this checkout) first on the path, run in
    ``tree`` (``python -c`` puts its working directory first on the path: never ROOT for a copy)."""
    env = env_for(tree) if tree is not None else {**os.environ, "PYTHONPATH": ""}
    return subprocess.run([sys.executable, *args], cwd=tree or ROOT, env=env, capture_output=True, text=True,
                          **kw)


def keys(tree: Path | None, *manifests: str) -> dict[str, dict[str, list[str]]]:
    """manifest -> {spec_id -> [spec label, action key]}, computed by the copy ``tree`` (None: ours)."""
    p = run(tree, "-c", KEYS_SCRIPT, *(str(ROOT / m) for m in manifests), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    if tree is not None:  # the copy, not the editable install, computed them
        assert out["package"].startswith(str(tree)) and out["kernels"].startswith(str(tree)), \
            (out["package"], out["kernels"])
    return {m: out["keys"][str(ROOT / m)] for m in manifests}


def cli(tree: Path | None, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """``gemmar-aot *args`` run by the copy ``tree`` (None: this checkout)."""
    return run(tree, "-c", "import sys; from gemmar_aot.cli import main; sys.exit(main())", *args, timeout=timeout)


def build(tree: Path | None, manifest: str | Path, store: Path, *extra: str, timeout: float = 900) -> dict:
    """``gemmar-aot build MANIFEST --store STORE --json`` run by the copy ``tree``; its summary."""
    p = cli(tree, "build", str(ROOT / manifest), "--store", str(store), "--json", "-j", "2", *extra, timeout=timeout)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return json.loads(p.stdout)


def python_files(tree: Path) -> list[Path]:
    return sorted(p for p in tree.rglob("*.py") if "__pycache__" not in p.parts)


def edit_comments_and_docstrings(path: Path) -> None:
    """Add a comment line and edit (or add) the module docstring of ``path``, keeping its code."""
    src = path.read_text()
    tree = ast.parse(src)
    doc = ast.get_docstring(tree, clean=False)
    lines = src.splitlines(keepends=True)
    if doc is not None:
        node = tree.body[0]
        start, end = node.lineno - 1, node.end_lineno
        lines[start:end] = ['"""An edited module docstring.\n', "\n", "It says something else now.\n", '"""\n']
    else:
        # After any leading comments (a shebang or an encoding line must stay first).
        i = 0
        while i < len(lines) and lines[i].startswith("#"):
            i += 1
        lines.insert(i, '"""A module docstring that was not there before."""\n')
    lines.insert(0, "# A comment line added by the key-stability test.\n")
    path.write_text("".join(lines))


def rewrite_parser(tree: Path) -> Path:
    """Rewrite the copy's code-object parser without changing what it returns for any input: the
    section bounds that fail the one-pass check named by an index loop instead of ``zip`` (a real
    edit of derive code, as a performance change would make it). Returns ``tree``."""
    co = tree / "gemmar_aot" / "model" / "codeobject.py"
    src = co.read_text()
    old = ("        for i, (sh_type, off, size) in enumerate(zip(types, offsets, sizes)):\n"
           "            if off + size > n and sh_type != 8:  # 8 = SHT_NOBITS\n")
    new = ("        for i in range(e_shnum):\n"
           "            sh_type, off, size = types[i], offsets[i], sizes[i]\n"
           "            if off + size > n and sh_type != 8:  # 8 = SHT_NOBITS\n")
    if old not in src:
        raise AssertionError("codeobject.py's section walk changed: update tree_copy.rewrite_parser's edit")
    co.write_text(src.replace(old, new, 1))
    return tree
