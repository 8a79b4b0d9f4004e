"""Keys are a contract with every cache our users run: the shipped manifests' action keys, pinned.

``tests/fixtures/action-keys.json`` holds every action key of the shipped manifests under the
default toolchain profile, as this tree computes them. A change that moves one recompiles that
kernel in every local store and remote cache of every user, so it must be deliberate: this test
fails naming how many keys of which manifest moved, and the fix is to say so in the commit (with
the count) and write the new keys::

    .venv/bin/python tests/test_key_contract.py --update

A move is right only when the bytes can change (a new toolchain pin, a builder argument, a
recipe's code). Comments, docstrings, formatting, moving or renaming a module (key schema 4:
modules are hashed under logical names, ``gemmar_aot.compiler.keys.MODULES``) and derive code never move
a key (``tests/test_key_stability.py`` and the move/rename tests below edit a copy of the tree
to show it; this test holds the whole tree to it, commit after commit).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "action-keys.json"
#: The reference manifest, every mode (modes), and the tests' (smoke); the fp8 wires' manifest adds
#: 1,160 keys of the same recipes and is left out to keep the pin small.
MANIFESTS = ("manifests/dsv4-pro-wo_b.toml", "manifests/dsv4-pro-wo_b-modes.toml", "manifests/smoke.toml",
             "manifests/dsv4-pro-ep.toml", "manifests/dsv4-pro-hipcc.toml", "manifests/mi300x-hipcc.toml",
             "manifests/dsv4-pro-ep-hip.toml")


def current_keys() -> dict:
    """{"key_schema", "profile", "manifests": {path: {spec id: [spec label, action key]}}} for this tree."""
    from gemmar_aot.compiler.keys import KEY_SCHEMA, action_key, ingredients
    from gemmar_aot.builder.manifest import load_manifest
    from gemmar_aot.builder.plan import make_plan
    from gemmar_aot.toolchain import load_toolchain

    tc = load_toolchain(profile="default")
    fp = tc.fingerprint
    out: dict = {"key_schema": KEY_SCHEMA, "profile": "default", "manifests": {}}
    for m in MANIFESTS:
        plan = make_plan(load_manifest(ROOT / m), mori_version=tc.profile.mori.version)
        out["manifests"][m] = {s.spec_id: [s.label(), action_key(ingredients(s, fp))] for s in plan.specs}
    return out


def test_the_shipped_manifests_keys_are_the_pinned_ones():
    pinned = json.loads(FIXTURE.read_text())
    now = current_keys()
    assert now["key_schema"] == pinned["key_schema"], (
        f"key schema {pinned['key_schema']} -> {now['key_schema']}: every key moves; say so in the commit "
        f"and update {FIXTURE.name} (python tests/test_key_contract.py --update)")
    problems = []
    for m in MANIFESTS:
        old, new = pinned["manifests"][m], now["manifests"][m]
        moved = sorted(old[sid][0] for sid in set(old) & set(new) if old[sid][1] != new[sid][1])
        if moved or set(old) != set(new):
            problems.append(f"{m}: {len(moved)} of {len(old)} keys moved (e.g. {moved[:3]}), "
                            f"{len(set(new) - set(old))} new, {len(set(old) - set(new))} gone")
    assert not problems, (
        "action keys moved -- every store and remote cache of every user recompiles these kernels:\n  "
        + "\n  ".join(problems) + "\nIf the bytes can change, say so in the commit with the count and run "
        "`python tests/test_key_contract.py --update`; if they cannot, the change must not move a key")


def test_the_pin_covers_every_kernel_of_the_shipped_manifests():
    pinned = json.loads(FIXTURE.read_text())
    counts = {m: len(pinned["manifests"][m]) for m in MANIFESTS}
    assert counts["manifests/dsv4-pro-wo_b.toml"] == 424 and counts["manifests/smoke.toml"] == 143, counts
    assert counts["manifests/dsv4-pro-ep.toml"] == 184, counts
    assert counts["manifests/dsv4-pro-hipcc.toml"] == counts["manifests/mi300x-hipcc.toml"] == 11, counts
    assert counts["manifests/dsv4-pro-ep-hip.toml"] == 12, counts


# ---- a module moved or renamed moves no key (key schema 4: logical module names) ----

#: In a copy of the tree: compile code moved into another package (``util.filedigest`` into
#: ``model``), and renamed (``toolchain.pins`` as ``toolchain.versions``), each importer
#: rewritten and the registry entry pointed at the new place, as a refactoring does.
_MOVES = (
    ("gemmar_aot/util/filedigest.py", "gemmar_aot/model/filedigest.py",
     (("from gemmar_aot.util.filedigest import", "from gemmar_aot.model.filedigest import"),
      ('"gemmar_aot.util.filedigest"', '"gemmar_aot.model.filedigest"'))),
    ("gemmar_aot/toolchain/pins.py", "gemmar_aot/toolchain/versions.py",
     (("from .pins import", "from .versions import"),
      ('"gemmar_aot.toolchain.pins"', '"gemmar_aot.toolchain.versions"'))),
)


def _moved_tree(dest: Path) -> Path:
    import tree_copy

    tree = tree_copy.copy_tree(dest)
    for src, dst, rewrites in _MOVES:
        (tree / src).rename(tree / dst)
        for f in tree_copy.python_files(tree):
            text = f.read_text()
            new = text
            for a, b in rewrites:
                new = new.replace(a, b)
            if new != text:
                f.write_text(new)
    return tree


def test_a_compile_module_moved_into_another_package_and_one_renamed_move_no_key(tmp_path):
    import tree_copy

    tree = _moved_tree(tmp_path / "moved")
    assert not (tree / "gemmar_aot" / "util" / "filedigest.py").exists() and (tree / "gemmar_aot/toolchain/versions.py").exists()
    p = tree_copy.run(tree, "-c", "import gemmar_aot.toolchain.versions, gemmar_aot.model.filedigest, sys; "
                                  "print('gemmar_aot.util.filedigest' in sys.modules)")
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stderr  # the copy really runs the moved modules
    ours, theirs = tree_copy.keys(None, *MANIFESTS), tree_copy.keys(tree, *MANIFESTS)
    assert theirs == ours and sum(len(v) for v in ours.values()) == (
        424 + len(ours["manifests/dsv4-pro-wo_b-modes.toml"]) + 143 + 184 + 11 + 11 + 12)


def test_a_move_the_registry_was_not_told_of_is_an_error_naming_the_module_and_the_fix(tmp_path):
    """Never a silent pass: a key over code the registry cannot place would be a key over nothing."""
    import tree_copy

    tree = _moved_tree(tmp_path / "moved")
    keys_py = tree / "gemmar_aot" / "compiler" / "keys.py"
    keys_py.write_text(keys_py.read_text().replace('"gemmar_aot.toolchain.versions"', '"gemmar_aot.toolchain.pins"'))
    p = tree_copy.run(tree, "-c", tree_copy.KEYS_SCRIPT, str(ROOT / "manifests" / "smoke.toml"))
    assert p.returncode != 0
    assert "gemmar_aot.toolchain.versions" in p.stderr and "gemmar_aot.compiler.keys.MODULES" in p.stderr, p.stderr[-2000:]


def test_after_a_move_and_a_rename_the_smoke_build_compiles_nothing_and_derives_nothing(smoke_store, tmp_path):
    import shutil

    import tree_copy

    tree = _moved_tree(tmp_path / "moved")
    store = tmp_path / "store"
    shutil.copytree(smoke_store, store)
    summary = tree_copy.build(tree, "manifests/smoke.toml", store)
    assert (summary["compiled"], summary["rederived"], summary["hits"]) == (0, 0, 143), summary
    assert (store / "locks" / "smoke.lock.json").read_bytes() == (smoke_store / "locks" / "smoke.lock.json").read_bytes()


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        raise SystemExit(f"usage: {sys.argv[0]} --update   (writes {FIXTURE})")
    keys = current_keys()
    FIXTURE.write_text(json.dumps(keys, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}: " + ", ".join(f"{m} {len(v)}" for m, v in keys["manifests"].items()))
