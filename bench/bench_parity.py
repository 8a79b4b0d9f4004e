"""Launch parity on the reference manifest's shapes: mori's own op vs our runtime, at the HIP ABI.

The CI tier (tests/test_parity.py) runs small shapes; this runs the same
comparison on a manifest's real ones (default: manifests/dsv4-pro-wo_b.toml,
N 7168, K 2048, world 8, M 4096..16384) against a store that already holds that
manifest (``make build`` fills artifacts/). For every fused-sdma group and each
chosen rank it runs mori's ``GemmAllReduceOp`` through FlyDSL's own launch path
(tests/parity/oracle.py, its own process) and ``gemmar_aot.runtime.GemmAllReduceOp``
through the real ``HipDriver``, both on the HIP test double, with the self-test
first and then every M up and back down, and compares every launch.

Usage::

    python bench/bench_parity.py                                   # ranks 0 and 7, every M
    python bench/bench_parity.py --ranks 3 --m 4096,16384 --json   # a subset
    python bench/bench_parity.py --keep /tmp/parity-ref            # reuse an identical earlier oracle run

Exit status 0 when every scenario is identical, 1 otherwise. The oracle compiles
one GEMM per M and rank (~2 s each here, source locations off) plus its phases.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from hipstub import HipStub, build  # noqa: E402  (the HIP test double)
from parity import candidate, compare, shims  # noqa: E402
from parity.runner import start_oracle  # noqa: E402
from parity.scenario import Scenario  # noqa: E402


def scenarios_for(manifest_path: Path, ranks: list[int] | None, only_m: set[int] | None) -> list[Scenario]:
    from gemmar_aot.builder.manifest import load_manifest

    man = load_manifest(manifest_path)
    groups: dict[tuple, list] = {}
    for w in man.workloads:
        if w.transport == "fused-sdma":
            groups.setdefault(w.group_key(), []).append(w)
    out = []
    for ws in groups.values():
        w0 = ws[0]
        ms = sorted({w.m for w in ws if only_m is None or w.m in only_m})
        if not ms:
            continue
        m_max = max(w.m_max or w.m for w in ws)
        steps = (("self_test", None), *(("call", m) for m in ms), *(("call", m) for m in reversed(ms[:-1])))
        for rank in (ranks if ranks is not None else [0, w0.world - 1]):
            out.append(Scenario(name=f"{man.name}:{w0.quant}:{w0.gather_dtype}/{w0.gather_transport}:w{w0.world}"
                                     f":r{rank}", world=w0.world, rank=rank, n=w0.n, k=w0.k, m_max=m_max,
                                quant=w0.quant, gather_dtype=w0.gather_dtype,
                                gather_transport=w0.gather_transport, steps=steps))
    return out


def _shown(path: str) -> str:
    """A path as results show it: relative to the checkout when inside it (no machine paths)."""
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else p.name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", default=str(ROOT / "manifests" / "dsv4-pro-wo_b.toml"))
    ap.add_argument("--store", default=str(ROOT / "artifacts"), help="a store the manifest was built into")
    ap.add_argument("--ranks", help="comma-separated ranks (default: 0 and the last)")
    ap.add_argument("--m", help="comma-separated padded M values (default: all the manifest's)")
    ap.add_argument("--keep", help="a directory to keep the oracle's record in, reused for identical inputs")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from gemmar_aot.builder.manifest import load_manifest

    name = load_manifest(args.manifest).name
    lock = Path(args.store) / "locks" / f"{name}.lock.json"
    if not lock.is_file():
        print(f"no lock for {name} in {args.store}: build it first (make build, or gemmar-aot build "
              f"{args.manifest} --store {args.store})", file=sys.stderr)
        return 2
    ranks = [int(r) for r in args.ranks.split(",")] if args.ranks else None
    only_m = {int(m) for m in args.m.split(",")} if args.m else None
    scs = scenarios_for(Path(args.manifest), ranks, only_m)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-parity-"))
    stub_path = build(work / "hipstub")
    stub = HipStub(stub_path)
    t0 = time.perf_counter()
    print(f"oracle: {len(scs)} scenarios (mori's op through FlyDSL; log {work / 'oracle.log'})", file=sys.stderr)
    oracle = start_oracle(scs, stub_path, work, reuse=bool(args.keep)).wait()
    oracle_s = time.perf_counter() - t0
    stream = shims.install_stream_shim(stub)
    rows, ok = [], True
    for sc in scs:
        t1 = time.perf_counter()
        cand = candidate.run(sc, artifacts=lock, stub=stub, stub_path=str(stub_path), stream=stream)
        cand["op"].close()
        o, c = compare.canonical_sequence(oracle[sc.name]), compare.canonical_sequence(cand)
        diffs = compare.differences(o, c)
        ok &= not diffs
        rows.append({"scenario": sc.name, "launches": len(c), "identical": not diffs,
                     "differing_launches": len(diffs), "oracle_seconds": oracle[sc.name]["seconds"],
                     "candidate_seconds": round(time.perf_counter() - t1, 3),
                     "explain": None if not diffs else compare.explain(o, c)})
    result = {"manifest": _shown(args.manifest), "store": _shown(args.store), "scenarios": rows, "identical": ok,
              "oracle_wall_seconds": round(oracle_s, 1)}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for r in rows:
            state = "identical" if r["identical"] else f"{r['differing_launches']} launches DIFFER"
            print(f"{r['scenario']:60s} {r['launches']:4d} launches  {state}  "
                  f"(oracle {r['oracle_seconds']:.1f} s, candidate {r['candidate_seconds']:.2f} s)")
            if r["explain"]:
                print(r["explain"])
        print(f"{'all identical' if ok else 'NOT identical'}; oracle wall {oracle_s:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
