"""What moving a manifest to another toolchain profile would recompile, and why.

For every distinct spec of the manifest, the action key under the current profile
and under the target profile (both installed, both fingerprinted): a key that
moves is a recompile unless the store already holds the target key. Why it moves
is the key ingredients that differ between the two profiles, plus -- one level
down -- the mori files behind them (generator sources and device-ABI files that
were added, removed or changed between the two releases). When the store holds
both keys' records, the report also says whether the code object's bytes really
changed (same blob digest) -- the only way to know, short of compiling.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from gemmar_aot.model.device_abi import device_abi_files
from gemmar_aot.util.filedigest import sha256_file
from gemmar_aot.compiler.keys import action_key, diff_ingredients, ingredients, toolchain_ingredients
from gemmar_aot.store.backend import record_blob


def _mori_files(mori_dir: Path) -> dict[str, str]:
    from gemmar_aot.toolchain.fingerprint import mori_source_files

    rels = set(mori_source_files(mori_dir)) | set(device_abi_files(mori_dir))
    return {r: sha256_file(Path(mori_dir) / r) for r in sorted(rels)}


def mori_file_changes(a_dir: Path, b_dir: Path) -> dict[str, list[str]]:
    fa, fb = _mori_files(a_dir), _mori_files(b_dir)
    return {
        "changed": sorted(r for r in set(fa) & set(fb) if fa[r] != fb[r]),
        "added": sorted(set(fb) - set(fa)),
        "removed": sorted(set(fa) - set(fb)),
        "same": len([r for r in set(fa) & set(fb) if fa[r] == fb[r]]),
    }


def profile_move(manifest_path: Path, to: str, *, frm: str | None = None, store: Path | None = None,
                 toolchain_root: str | None = None) -> dict:
    from gemmar_aot.builder.manifest import load_manifest
    from gemmar_aot.builder.plan import make_plan, plan_order
    from gemmar_aot.store import Store, default_store_root
    from gemmar_aot.toolchain import load_toolchain

    manifest = load_manifest(manifest_path)
    ta, tb = load_toolchain(toolchain_root, frm), load_toolchain(toolchain_root, to)
    # Each profile's plan (EP specs carry their mori's factory keywords), paired kernel by kernel
    plan = make_plan(manifest, mori_version=ta.profile.mori.version)
    target = dict(zip(plan_order(plan), plan_order(make_plan(manifest, mori_version=tb.profile.mori.version))))
    root = default_store_root(str(store) if store is not None else None)
    st = Store(root, readonly=True) if Path(root).is_dir() else None

    why = [{"ingredient": p, "from": x, "to": y}
           for p, x, y in diff_ingredients(toolchain_ingredients(ta.fingerprint),
                                           toolchain_ingredients(tb.fingerprint))]
    by_kind: dict[str, dict] = defaultdict(lambda: {"specs": 0, "keys_moved": 0, "in_store": 0, "to_compile": 0,
                                                    "bytes_same": 0, "bytes_changed": 0})
    specs = []
    for s in plan.specs:
        ka = action_key(ingredients(s, ta.fingerprint))
        kb = action_key(ingredients(target[s], tb.fingerprint))
        ra = st.read_record_file(ka) if st is not None else None
        rb = st.read_record_file(kb) if st is not None else None
        k = by_kind[f"{s.recipe}:{s.kind}"]
        k["specs"] += 1
        moved = ka != kb
        k["keys_moved"] += moved
        if rb is not None:
            k["in_store"] += 1
        elif moved:
            k["to_compile"] += 1
        same = None
        if ra is not None and rb is not None:
            same = record_blob(ra) == record_blob(rb)
            k["bytes_same" if same else "bytes_changed"] += 1
        specs.append({"spec": s.label(), "kind": f"{s.recipe}:{s.kind}", "from_key": ka, "to_key": kb,
                      "in_store": rb is not None, "same_bytes": same})
    totals = {f: sum(k[f] for k in by_kind.values())
              for f in ("specs", "keys_moved", "in_store", "to_compile", "bytes_same", "bytes_changed")}
    return {
        "manifest": manifest.name,
        "from": ta.profile.describe(),
        "to": tb.profile.describe(),
        "store": str(root),
        "totals": totals,
        "by_kind": dict(sorted(by_kind.items())),
        "why": why,
        "mori_files": mori_file_changes(ta.mori_dir, tb.mori_dir),
        "specs": specs,
    }


def format_report(r: dict) -> str:
    t = r["totals"]
    lines = [f"moving {r['manifest']} from [{r['from']}] to [{r['to']}] (store {r['store']}):",
             f"  {t['specs']} distinct specs: {t['keys_moved']} keys move, {t['in_store']} already in the store "
             f"under the target profile, {t['to_compile']} to compile"]
    if t["bytes_same"] or t["bytes_changed"]:
        lines.append(f"  both profiles built here: {t['bytes_changed']} code objects differ, "
                     f"{t['bytes_same']} are byte-identical (their keys move all the same: the inputs changed)")
    lines.append("  why the keys move (key ingredients that differ):")
    for w in r["why"]:
        a, b = str(w["from"]), str(w["to"])
        lines.append(f"    {w['ingredient']:<34} {a[:24]:<24} -> {b[:24]}")
    mf = r["mori_files"]
    lines.append(f"  mori files behind them: {len(mf['changed'])} changed, {len(mf['added'])} added, "
                 f"{len(mf['removed'])} removed, {mf['same']} unchanged")
    for tag in ("changed", "added", "removed"):
        for f in mf[tag]:
            lines.append(f"    {tag:<8} {f}")
    lines.append(f"  {'kind':<28} {'specs':>5} {'moved':>5} {'stored':>6} {'compile':>7} {'bytes=':>6} {'bytes≠':>6}")
    for kind, k in r["by_kind"].items():
        lines.append(f"  {kind:<28} {k['specs']:>5} {k['keys_moved']:>5} {k['in_store']:>6} {k['to_compile']:>7} "
                     f"{k['bytes_same']:>6} {k['bytes_changed']:>6}")
    return "\n".join(lines)
