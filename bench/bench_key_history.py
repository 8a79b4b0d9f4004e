"""Replay this repository's history: which commits re-key the reference manifest under the old
key scheme (our source files' bytes, key schema 2) and under the new one (compile code by normal
form and per recipe, derive code out of the key: key schema 3), beside whether any code-object
byte really changed.

For every first-parent commit C since the store existed that touched one of our code files:

* **old scheme**: C's own ``keys.COMPILER_SOURCES`` (read from C's keys.py) hashed the way C's
  keys.py did (path, length and bytes of each file), plus the version constants in the key
  (gemmar-aot's version, RECIPE_VERSION, KEY_SCHEMA); a change against C's parent re-keys every
  kernel of every manifest.
* **new scheme**: today's ``keys.COMPILE_CODE`` and ``keys.RECIPE_CODE`` mapped to C's files and
  hashed by ``source_form`` (a module C does not have hashes as absent). A recipe whose digest
  changed re-keys its kernels only; the reference manifest's count is today's plan's kernels of
  those recipes. Today's lists are applied to old code: what an older compile path imported
  beyond them is not seen (the test that guards the lists runs on today's code).
* **bytes**: ``--compile`` builds C's and its parent's own ``manifests/smoke.toml`` (every mode
  each had) with this checkout's toolchain into scratch stores and compares the code object of
  every spec both built. A commit whose code cannot build with today's toolchain says so.

    python bench/bench_key_history.py [--since 968760a] [--compile] [--json OUT]

Writes a Markdown table (stdout) and, with ``--json``, the rows.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gemmar_aot import keys  # noqa: E402
from gemmar_aot.compiler.source_form import FORM_VERSION, normal_form  # noqa: E402

#: The commit that created the store (action keys over COMPILER_SOURCES).
FIRST = "968760a"


def git(*args: str, check: bool = True) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=check).stdout


def show(commit: str, path: str) -> bytes | None:
    p = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True)
    return p.stdout if p.returncode == 0 else None


def module_path(name: str) -> list[str]:
    """Where module ``name`` lives in a checkout: a .py file or a package's __init__.py."""
    top, _, rest = name.partition(".")
    base = {"gemmar_aot": "gemmar_aot", "gemmar_aot_kernels": "kernels"}[top]
    parts = [base] + (rest.split(".") if rest else [])
    return ["/".join(parts) + ".py", "/".join(parts) + "/__init__.py"]


def old_scheme(commit: str) -> str:
    """The key ingredients of our own code under the old scheme, as C computed them."""
    src = show(commit, "gemmar_aot/compiler/keys.py")
    if src is None:
        return "no keys.py"
    tree = ast.parse(src)
    consts = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                consts[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    sources = consts.get("COMPILER_SOURCES", ())
    h = hashlib.sha256()
    for pkg, name in sources:
        base = {"gemmar_aot": "gemmar_aot", "gemmar_aot_kernels": "kernels"}.get(pkg.split(".")[0])
        sub = pkg.split(".")[1:]
        path = "/".join([base, *sub, name])
        data = show(commit, path) or b""
        h.update(f"{pkg}/{name}\0{len(data)}\0".encode())
        h.update(data)
    init = show(commit, "gemmar_aot/__init__.py") or b""
    recipes = show(commit, "kernels/__init__.py") or b""
    version = [line for line in init.decode().splitlines() if line.startswith("__version__")]
    rv = [line for line in recipes.decode().splitlines() if line.startswith("RECIPE_VERSION")]
    h.update(repr((version, rv, consts.get("KEY_SCHEMA"))).encode())
    return h.hexdigest()


def new_scheme(commit: str) -> dict[str, str]:
    """recipe -> digest of its compile code at C (today's lists, C's files, today's normal form),
    and ``"<derive>"`` -> the derive code's."""
    digests = {}
    for name in sorted(set(keys.COMPILE_CODE) | set(keys.DERIVE_CODE)
                       | {m for own in keys.RECIPE_CODE.values() for m in own}):
        data = None
        for path in module_path(name):
            data = show(commit, path)
            if data is not None:
                break
        try:
            form = "<absent>" if data is None else normal_form(data, filename=name)
        except Exception as e:  # noqa: BLE001 - a file that does not parse is its own value
            form = f"<unparsable: {e}>"
        digests[name] = hashlib.sha256(f"{FORM_VERSION}\0{name}\0{form}".encode()).hexdigest()
    rv = [line for line in (show(commit, "kernels/__init__.py") or b"").decode().splitlines()
          if line.startswith("RECIPE_VERSION")]
    out = {}
    for recipe, own in keys.RECIPE_CODE.items():
        h = hashlib.sha256(repr(rv).encode())
        for name in sorted(set(keys.COMPILE_CODE) | set(own)):
            h.update(f"{name}\0{digests[name]}\0".encode())
        out[recipe] = h.hexdigest()
    out["<derive>"] = hashlib.sha256("".join(digests[n] for n in sorted(keys.DERIVE_CODE)).encode()).hexdigest()
    return out


def reference_counts() -> dict[str, int]:
    from gemmar_aot.builder.manifest import load_manifest
    from gemmar_aot.builder.plan import make_plan

    counts: dict[str, int] = {}
    for s in make_plan(load_manifest(ROOT / "manifests" / "dsv4-pro-wo_b.toml")).specs:
        counts[s.recipe] = counts.get(s.recipe, 0) + 1
    return counts


# ---- bytes ----

#: The first commit whose stores (format 3) today's store reader opens.
FORMAT_3 = "80ce2bb"


def build_commit(commit: str, scratch: Path) -> dict[str, str] | str:
    """canonical spec JSON -> code-object sha256 of C's smoke manifest built by C's code, or why not."""
    if subprocess.run(["git", "merge-base", "--is-ancestor", FORMAT_3, commit], cwd=ROOT).returncode != 0:
        return f"not compared (before {FORMAT_3}: a store format today's reader does not open)"
    out = scratch / f"store-{commit}"
    cache = scratch / f"blobs-{commit}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    tree = scratch / f"tree-{commit}"
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=ROOT, check=True,
                       capture_output=True)
    py = scratch / f"py-{commit}"
    py.mkdir(exist_ok=True)
    for link, target in (("gemmar_aot", tree / "gemmar_aot"), ("gemmar_aot_kernels", tree / "kernels")):
        if not (py / link).exists():
            (py / link).symlink_to(target)
    from gemmar_aot.toolchain.paths import toolchain_root

    env = {**os.environ, "PYTHONPATH": str(py), "GEMMAR_AOT_TOOLCHAIN": str(toolchain_root())}
    env.pop("GEMMAR_AOT_STORE", None)
    p = subprocess.run([sys.executable, "-c", "import sys; from gemmar_aot.cli import main; sys.exit(main())",
                        "build", str(tree / "manifests" / "smoke.toml"), "--store", str(out), "-j", "2", "--json"],
                       cwd=py, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        return f"does not build with today's toolchain: {(p.stderr.strip().splitlines() or ['?'])[-1][:160]}"
    blobs = {}
    sys.path.insert(0, str(ROOT))
    from gemmar_aot.store import Store

    st = Store(out, readonly=True)
    for key, path in st.local.iter_record_files():
        rec = st.local.get_record(key)
        if rec is not None:
            blobs[json.dumps(rec["spec"], sort_keys=True)] = rec["blob"]["hash"]
    cache.write_text(json.dumps(blobs))
    return blobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--since", default=FIRST)
    ap.add_argument("--until", default="HEAD")
    ap.add_argument("--compile", action="store_true", help="build smoke.toml at each commit and its parent")
    ap.add_argument("--scratch", default=None, help="where worktrees and stores go (default: a temp dir)")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()

    ours = ["gemmar_aot", "kernels"]
    commits = git("rev-list", "--first-parent", "--reverse", f"{args.since}..{args.until}", "--", *ours).split()
    counts = reference_counts()
    total = sum(counts.values())
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="gemmar-key-history-"))
    rows = []
    for c in commits:
        parent = git("rev-parse", f"{c}^").strip()
        old_moves = old_scheme(c) != old_scheme(parent)
        a, b = new_scheme(parent), new_scheme(c)
        moved_recipes = sorted(r for r in keys.RECIPE_CODE if a[r] != b[r])
        rederive = a["<derive>"] != b["<derive>"]
        if not old_moves and not moved_recipes and not rederive:
            continue
        new_count = sum(counts.get(r, 0) for r in moved_recipes)
        row = {"commit": git("rev-parse", "--short", c).strip(), "subject": git("log", "-1", "--format=%s", c).strip(),
               "old_rekeys": total if old_moves else 0, "new_rekeys": new_count, "new_recipes": moved_recipes,
               "rederive": rederive}
        if args.compile:
            before, after = build_commit(parent[:7], scratch), build_commit(c[:7], scratch)
            if isinstance(before, str) or isinstance(after, str):
                row["bytes"] = before if isinstance(before, str) else after
            else:
                common = set(before) & set(after)
                changed = sorted(json.loads(s)["recipe"] + ":" + json.loads(s)["kind"]
                                 for s in common if before[s] != after[s])
                row["bytes"] = {"specs_compared": len(common), "changed": len(changed),
                                "changed_kinds": sorted(set(changed)),
                                # a spec the commit changed is a new spec: its key moves by the spec itself
                                "new_specs": sorted({json.loads(s)["recipe"] + ":" + json.loads(s)["kind"]
                                                     for s in set(after) - set(before)}),
                                "new_spec_count": len(set(after) - set(before))}
        rows.append(row)
        print(f"{row['commit']}: old {row['old_rekeys']}, new {row['new_rekeys']} {moved_recipes} "
              f"{row.get('bytes', '')}", file=sys.stderr, flush=True)
    print(f"| commit | what it did | old scheme re-keys (of {total}) | new scheme re-keys | "
          f"new scheme re-derives | code objects changed, of the smoke specs both built |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        b = r.get("bytes", "not built")
        if isinstance(b, dict):
            b = (f"{b['changed']} of {b['specs_compared']}"
                 + (f" ({', '.join(b['changed_kinds'])})" if b["changed"] else "")
                 + (f"; {b['new_spec_count']} new specs ({', '.join(b['new_specs'])})" if b["new_spec_count"] else ""))
        new = f"{r['new_rekeys']}" + (f" ({', '.join(r['new_recipes'])})" if r["new_recipes"] else "")
        print(f"| {r['commit']} | {r['subject'][:90]} | {r['old_rekeys']} | {new} | "
              f"{'yes' if r['rederive'] else ''} | {b} |")
    print(f"\nold scheme: {sum(1 for r in rows if r['old_rekeys'])} full re-keys; new scheme: "
          f"{sum(1 for r in rows if r['new_rekeys'])} commits re-key some kernels")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"since": args.since, "rows": rows, "reference_kernels": counts},
                                                  indent=1) + "\n")


if __name__ == "__main__":
    main()
