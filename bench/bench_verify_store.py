"""What holding every record to its own blobs costs: ``verify`` and a build of hits only, A/B.

Two trees run the same commands on one copy of a warm store, interleaved, ``--rounds`` times:
ours (``verify`` derives every record of the action cache and of each lock's record index
again; the build derives every local hit again) and an anchor tree given by ``--tree
NAME=PATH`` (a checkout of a commit before that, e.g. ``git worktree add /tmp/a e9ff383``).
Each command runs in a fresh interpreter, wall time, with a pure-Python speed reference
beside each round (the machine is shared: compare within a round).

    python bench/bench_verify_store.py --store artifacts --tree anchor-e9ff383=/tmp/a \\
        [--manifest manifests/dsv4-pro-wo_b.toml] [--rounds 5] [--json-out OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def speed_reference() -> float:
    t0 = time.perf_counter()
    x = 0
    for i in range(2_000_000):
        x += i * i % 7
    return time.perf_counter() - t0


def timed(tree: Path, *args: str) -> tuple[float, dict]:
    """``gemmar-aot *args --json`` run by ``tree``'s package: (wall seconds, its JSON)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "GEMMAR_AOT_TOOLCHAIN": str(ROOT / ".toolchain")}
    env.pop("GEMMAR_AOT_STORE", None)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", "import sys; from gemmar_aot.cli import main; sys.exit(main())",
                        *args, "--json"], cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{tree}: gemmar-aot {' '.join(args)} failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return wall, json.loads(p.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True, help="a warm store holding the manifest's kernels")
    ap.add_argument("--tree", required=True, metavar="NAME=PATH", help="the anchor: a checkout of an earlier commit")
    ap.add_argument("--manifest", default="manifests/dsv4-pro-wo_b.toml")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    name, _, path = args.tree.partition("=")
    arms = {".": ROOT, name: Path(path).resolve()}
    scratch = Path(tempfile.mkdtemp(prefix="gemmar-verify-"))
    store = scratch / "store"
    shutil.copytree(args.store, store, ignore=shutil.ignore_patterns("claims", "quarantine"))
    manifest = str(ROOT / args.manifest)
    runs: dict[str, dict[str, list[float]]] = {a: {"verify": [], "build": []} for a in arms}
    refs, records = [], None
    try:
        for _ in range(args.rounds):
            refs.append(speed_reference())
            for arm, tree in arms.items():
                wall, out = timed(tree, "verify", "--store", str(store))
                assert out["ok"], out["problems"][:3]
                runs[arm]["verify"].append(wall)
                wall, s = timed(tree, "build", manifest, "--store", str(store), "-q")
                assert s["compiled"] == 0 and s["failed"] == 0, s
                records = s["hits"]
                runs[arm]["build"].append(wall)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out = {"date": time.strftime("%Y-%m-%d"), "manifest": args.manifest, "rounds": args.rounds,
           "hits": records, "speed_reference_s": refs,
           "arms": {arm: {what: {"runs": v, "median_s": statistics.median(v)} for what, v in r.items()}
                    for arm, r in runs.items()}}
    print(json.dumps(out["arms"], indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
