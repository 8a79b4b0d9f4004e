"""Why did a lookup miss? Name exactly which ingredient of the key changed.

Three questions, each answered as plain data (the CLI prints it or dumps JSON):

* ``explain_key``: what went into one key (its record's ingredients, flattened).
* ``diff_keys`` / ``diff_locks``: two builds (keys or lock files) -- which
  ingredients differ; for lock files, which launches changed key and why.
* ``check_lock``: a lock file against the current toolchain -- recompute every key
  from the recorded spec and the toolchain installed now; any launch whose key
  moved is listed with the ingredients that moved it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping

from gemmar_aot.model.lock import Lock
from gemmar_aot.model.types import LaunchEntry
from gemmar_aot.util.errors import GemmarError
from gemmar_aot.compiler.keys import action_key, diff_ingredients, flatten, ingredients
from gemmar_aot.model.spec import KernelSpec


def _record(store, key: str) -> dict:
    rec = store.read_record_file(key)
    if rec is None:
        raise GemmarError(f"no record for key {key} in the store at {store.root}; "
                          f"pass --store, or build the manifest that produced it")
    return rec


def explain_key(store, key: str) -> dict:
    rec = _record(store, key)
    ingr = rec.get("ingredients") or {}
    return {"key": key, "recomputed": action_key(ingr) if ingr else None,
            "blob": rec["blob"], "ingredients": flatten(ingr)}


def diff_keys(store, a: str, b: str) -> dict:
    ra, rb = _record(store, a), _record(store, b)
    changes = diff_ingredients(ra.get("ingredients") or {}, rb.get("ingredients") or {})
    return {"a": a, "b": b, "changed": [{"ingredient": p, "a": x, "b": y} for p, x, y in changes]}


def _launch_index(lock: Lock) -> dict[tuple, LaunchEntry]:
    """(tuple or EP entry identity, rank, role, position) -> launch entry."""
    out = {}
    for t in lock.tuples:
        ident = tuple(t.id.to_json().values())
        for r in t.ranks:
            for role in ("launches", "self_test"):
                for i, e in enumerate(getattr(r, role)):
                    out[ident + (r.rank, role, i)] = e
    for ep in lock.eps:
        ident = ("ep", *ep.config.to_json().values())
        for r in ep.ranks:
            for i, e in enumerate(r.launches):
                out[ident + (r.rank, "launches", i)] = e
    for h in lock.hipcc:
        out[("hipcc", *h.variant.to_json().values())] = h.entry
    for j in lock.jitv2:
        out[("jitv2", j.variant.arch, j.variant.nic, j.cache_entry)] = j.entry
    return out


def _toolchain(lock: Lock) -> dict:
    return {"digest": lock.toolchain.digest, "profile": lock.toolchain.profile, **lock.toolchain.ingredients}


def diff_locks(a: Lock, b: Lock, store=None) -> dict:
    toolchain = diff_ingredients(_toolchain(a), _toolchain(b))
    ia, ib = _launch_index(a), _launch_index(b)
    changed, why = [], Counter()
    for ident in sorted(set(ia) & set(ib), key=str):
        ka, kb = ia[ident].key, ib[ident].key
        if ka == kb:
            continue
        item = {"launch": list(ident), "a": ka, "b": kb}
        if store is not None:
            ra, rb = store.read_record_file(ka), store.read_record_file(kb)
            if ra and rb:
                paths = [p for p, _, _ in diff_ingredients(ra.get("ingredients", {}), rb.get("ingredients", {}))]
                item["ingredients"] = paths
                why.update(paths)
        changed.append(item)
    return {
        "toolchain_changed": [{"ingredient": p, "a": x, "b": y} for p, x, y in toolchain],
        "only_in_a": len(set(ia) - set(ib)),
        "only_in_b": len(set(ib) - set(ia)),
        "launches_changed": len(changed),
        "launches_same": len(set(ia) & set(ib)) - len(changed),
        "changed_by_ingredient": dict(why.most_common()),
        "changes": changed,
    }


def check_lock(lock: Lock, store, fingerprint: Mapping[str, Any]) -> dict:
    """Recompute each launch's key with the current toolchain; explain every one that moved."""
    from gemmar_aot.compiler.keys import toolchain_ingredients

    now_tool = toolchain_ingredients(fingerprint)
    toolchain = diff_ingredients(lock.toolchain.ingredients, now_tool)
    stale, missing, why = [], 0, Counter()
    seen = set()
    for ident, e in sorted(_launch_index(lock).items(), key=lambda kv: str(kv[0])):
        if e.key in seen:
            continue
        seen.add(e.key)
        rec = store.read_record_file(e.key)
        if rec is None:
            missing += 1
            continue
        now = ingredients(KernelSpec.from_json(rec["spec"]), fingerprint)
        new_key = action_key(now)
        if new_key != e.key:
            paths = [p for p, _, _ in diff_ingredients(rec.get("ingredients", {}), now)]
            why.update(paths)
            stale.append({"launch": list(ident), "key": e.key, "now": new_key, "ingredients": paths})
    return {
        "toolchain_changed": [{"ingredient": p, "locked": x, "now": y} for p, x, y in toolchain],
        "distinct_keys": len(seen),
        "stale": len(stale),
        "records_missing": missing,
        "stale_by_ingredient": dict(why.most_common()),
        "details": stale,
        "up_to_date": not stale and not toolchain and missing == 0,
    }
