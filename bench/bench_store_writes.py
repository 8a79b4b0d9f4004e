"""How fast one process stores compiled results: serially, and from a few threads.

The Ray executor's driver is the one process that writes the store: every kernel the
cluster compiles is verified there and written under its claim (zstd -19 blob, record,
fsyncs). This replays that write path with the entries of an existing store (its code
objects and record fields), into a fresh store per run, with 1 and more writer threads:

    .venv/bin/python bench/bench_store_writes.py --source <a built store> --threads 1,2,4,8 \\
        --json-out bench/results/store-writes-dsv4-pro-wo_b-YYYY-MM-DD-<commit>.json

What is timed is ``store.claim(key)`` + ``claim.put(code, fields)`` per entry, the same
calls as ``RayExecutor._store``; reading the source store is not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gemmar_aot.store import Store  # noqa: E402
from gemmar_aot.store.backend import RESERVED_FIELDS  # noqa: E402


def entries(source: Path) -> list[tuple[str, bytes, dict]]:
    src = Store(source, readonly=True)
    out = []
    for key, _ in src.local.iter_record_files():
        rec = src.get_record(key)
        code = src.load_blob(rec["blob"]["hash"])
        out.append((key, code, {k: v for k, v in rec.items() if k not in RESERVED_FIELDS}))
    return out


def write_all(root: Path, items: list, threads: int) -> dict:
    st = Store(root)
    st.init()

    def write(item) -> None:
        key, code, fields = item
        with st.claim(key) as claim:
            if claim.hit is None:
                claim.put(code, fields)

    t0, c0 = time.perf_counter(), time.process_time()
    if threads == 1:
        for it in items:
            write(it)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(write, items))
    return {"threads": threads, "wall_seconds": round(time.perf_counter() - t0, 3),
            "cpu_seconds": round(time.process_time() - c0, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, required=True, help="a built store whose entries are replayed")
    ap.add_argument("--threads", default="1,2,4,8")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    items = entries(args.source)
    runs = []
    with tempfile.TemporaryDirectory(prefix="gemmar-bench-writes-") as tmp:
        for n in (int(x) for x in args.threads.split(",")):
            root = Path(tmp) / f"t{n}"
            r = write_all(root, items, n)
            r["load_average_after"] = list(os.getloadavg())
            runs.append(r)
            print(f"{n} writer thread(s): {len(items)} entries in {r['wall_seconds']:.2f} s wall, "
                  f"{r['cpu_seconds']:.2f} s CPU", file=sys.stderr)
            shutil.rmtree(root)
    out = {"source": str(args.source), "entries": len(items), "cpus": os.cpu_count(), "runs": runs}
    if args.json_out:
        args.json_out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
