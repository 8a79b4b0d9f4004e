"""What a change of derive code costs: the reference manifest's records derived again, no compile.

A copy of our tree whose code-object parser is rewritten without changing what it returns
(``tests/test_key_stability.py``'s edit) builds the manifest against a copy of a warm store:
every record is stale and is derived again from its stored blobs. Measured, interleaved,
``--rounds`` times on one store copy:

* ``warm``: our tree, every record current (the anchor: a build that only looks up);
* ``rederive``: the edited tree (all records derived again, written back);
* ``back``: our tree again (all derived back).

Plus the derive step alone, in this process: load the two blobs and derive, for every
record of the lock (``derive_seconds``), and a pure-Python speed reference.

    python bench/bench_rederive.py --store artifacts [--manifest manifests/dsv4-pro-wo_b.toml]
                                   [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import tree_copy  # noqa: E402  (the test helper that copies and runs our tree)


def speed_reference() -> float:
    t0 = time.perf_counter()
    x = 0
    for i in range(2_000_000):
        x += i * i % 7
    return time.perf_counter() - t0


def derive_all(store: Path, lock_path: Path) -> tuple[float, int]:
    from gemmar_aot.model.lock import read_lock
    from gemmar_aot.compiler.derive import derive
    from gemmar_aot.store import Store

    st = Store(store, readonly=True)
    lock = read_lock(lock_path)
    recs = [st.read_record_file(k) for k in sorted(lock.action_keys())]
    t0 = time.perf_counter()
    for rec in recs:
        code = st.load_blob(rec["blob"]["hash"], rec["blob"]["size"])
        launcher = st.load_blob(rec["launcher"]["hash"], rec["launcher"]["size"])
        derive(code, launcher)
    return time.perf_counter() - t0, len(recs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True, help="a warm store holding the manifest's kernels")
    ap.add_argument("--manifest", default="manifests/dsv4-pro-wo_b.toml")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()

    from gemmar_aot.builder.manifest import load_manifest

    name = load_manifest(ROOT / args.manifest).name
    scratch = Path(tempfile.mkdtemp(prefix="gemmar-rederive-"))
    store = scratch / "store"
    shutil.copytree(args.store, store, ignore=shutil.ignore_patterns("claims", "quarantine"))
    edited = tree_copy.rewrite_parser(tree_copy.copy_tree(scratch / "tree"))
    runs: dict[str, list[dict]] = {"warm": [], "rederive": [], "back": []}
    refs = []
    for _ in range(args.rounds):
        refs.append(speed_reference())
        for what, tree in (("warm", None), ("rederive", edited), ("back", None)):
            s = tree_copy.build(tree, args.manifest, store)
            assert s["compiled"] == 0, s
            runs[what].append({"wall_seconds": s["wall_seconds"], "rederived": s["rederived"]})
    alone, n = derive_all(store, store / "locks" / f"{name}.lock.json")
    out = {
        "manifest": args.manifest,
        "kernels": n,
        "rounds": args.rounds,
        "median_wall_seconds": {k: statistics.median(r["wall_seconds"] for r in v) for k, v in runs.items()},
        "rederived": {k: [r["rederived"] for r in v] for k, v in runs.items()},
        "derive_seconds_in_process": round(alone, 3),
        "speed_reference_seconds": round(statistics.median(refs), 3),
        "runs": runs,
    }
    print(json.dumps(out, indent=1))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1) + "\n")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
