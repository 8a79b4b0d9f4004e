"""Keys are a contract with every cache our users run: the shipped manifests' action keys, pinned.

``tests/fixtures/action-keys.json`` holds every action key of the shipped manifests under the
default toolchain profile, as this tree computes them. A change that moves one recompiles that
kernel in every local store and remote cache of every user, so it must be deliberate: this test
fails naming how many keys of which manifest moved, and the fix is to say so in the commit (with
the count) and write the new keys::

    .venv/bin/python tests/test_key_contract.py --update

A move is right only when the bytes can change (a new toolchain pin, a builder argument, a
recipe's code). Comments, docstrings, formatting, file moves and derive code never move a key
(``tests/test_key_stability.py`` edits a copy of the tree to show it; this test holds the
whole tree to it, commit after commit).
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
             "manifests/dsv4-pro-ep.toml")


def current_keys() -> dict:
    """{"key_schema", "profile", "manifests": {path: {spec id: [spec label, action key]}}} for this tree."""
    from gemmar_aot.keys import KEY_SCHEMA, action_key, ingredients
    from gemmar_aot.build.manifest import load_manifest
    from gemmar_aot.build.plan import make_plan
    from gemmar_aot.toolchain import load_toolchain

    fp = load_toolchain(profile="default").fingerprint
    out: dict = {"key_schema": KEY_SCHEMA, "profile": "default", "manifests": {}}
    for m in MANIFESTS:
        plan = make_plan(load_manifest(ROOT / m))
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
    assert counts["manifests/dsv4-pro-wo_b.toml"] == 424 and counts["manifests/smoke.toml"] == 120, counts
    assert counts["manifests/dsv4-pro-ep.toml"] == 184, counts


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        raise SystemExit(f"usage: {sys.argv[0]} --update   (writes {FIXTURE})")
    keys = current_keys()
    FIXTURE.write_text(json.dumps(keys, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}: " + ", ".join(f"{m} {len(v)}" for m, v in keys["manifests"].items()))
