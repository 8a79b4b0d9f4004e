"""mori's JIT v2 kernels (EP v2's HIP backend) ahead of time against mori's own first construction (issue 46).

Usage::

    python bench/bench_jitv2.py [--manifest manifests/dsv4-pro-ep-hip.toml] [--rounds 3] [--json-out FILE]

The manifest is built once into a fresh store (``gemmar-aot build``: wall and CPU seconds, the CI
cost). Then, per (arch, NIC) group of its JIT v2 code objects, ``--rounds`` rounds, the arms
interleaved (the order alternating), one process at a time:

* ``mori``: **the anchor**, what a pod pays today at its first construction of the op: mori's own
  ``libmori_jit`` creating every plan of the group from an empty cache, its hipcc a test double
  running the same clang (``tests/jitv2_mori.py compile``): wall and CPU seconds of the process,
  and each plan's construction time; its bytes are checked equal to ours;
* ``served``: a pod with gemmar-aot's hook (``tests/jitv2_mori.py pod``): the cache seeded with the
  verified code objects (a fresh root: cold), then mori creating the same plans, which it finds:
  wall and CPU seconds of the process, and each plan's construction;
* ``served_warm``: the same, the seeded cache already there (a pod's second start).

Both pod arms run on the HIP double (``tests/hipstub``); beside them a speed reference (a fixed
Python loop, seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests")]
from _results import commit, emit  # noqa: E402
from bench_hipcc import _timed  # noqa: E402  (wall and children's CPU of a command)
from bench_rederive import speed_reference  # noqa: E402


def _mori(mode: str, req: dict, arch: str) -> tuple[dict, float, float]:
    env = {**os.environ, "HIPSTUB_ARCH": arch, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    p, wall, cpu = _timed([sys.executable, str(ROOT / "tests" / "jitv2_mori.py"), mode, json.dumps(req)], cwd=ROOT,
                          env=env, timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"jitv2_mori.py {mode} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.splitlines()[-1]), wall, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--manifest", type=Path, default=ROOT / "manifests" / "dsv4-pro-ep-hip.toml")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args()

    import hipstub

    from gemmar_aot.model.lock import read_lock
    from gemmar_aot.store import Store
    from gemmar_aot.toolchain import load_toolchain

    tc = load_toolchain()
    work = Path(tempfile.mkdtemp(prefix="bench-jitv2-", dir=ROOT / ".toolchain"))
    try:
        store = work / "store"
        p, build_wall, build_cpu = _timed([sys.executable, "-m", "gemmar_aot", "build", str(a.manifest), "--store",
                                           str(store), "-j", "2", "--json", "-q"], cwd=ROOT)
        if p.returncode != 0:
            raise SystemExit(f"build failed:\n{p.stderr[-3000:]}")
        summary = json.loads(p.stdout)
        lock = read_lock(next((store / "locks").glob("*.lock.json")))
        st = Store(store, readonly=True)
        lib = hipstub.build(work / "hipstub").with_name("libamdhip64.so.7")
        hipcc = work / "hipcc"
        hipcc.write_text(f"#!/bin/sh\nGEMMAR_AOT_TOOLCHAIN='{tc.root}' exec '{sys.executable}' "
                         f"'{ROOT / 'tests' / 'hipcc_shim.py'}' \"$@\"\n")
        hipcc.chmod(0o755)
        groups: dict = {}
        for j in lock.jitv2:
            groups.setdefault((j.variant.arch, j.variant.nic), []).append(j)
        out_groups = {}
        for (arch, nic), items in sorted(groups.items()):
            plans = [{"plan": j.plan, "request": st.read_record_named(j.entry.key, j.entry.record)["spec"]["params"]
                      ["request"]} for j in items]
            base = {"mori_dir": str(tc.mori_dir), "hip_lib": str(lib), "arch": arch, "nic": nic, "plans": plans}
            arms: dict[str, list] = {"mori": [], "served": [], "served_warm": []}
            refs = []
            for r in range(a.rounds):
                order = ["mori", "served"] if r % 2 == 0 else ["served", "mori"]
                root = work / f"root-{arch}-{nic}-{r}"
                for arm in order:
                    if arm == "mori":
                        got, wall, cpu = _mori("compile", {**base, "cache": str(work / f"mori-{arch}-{nic}-{r}"),
                                                          "hipcc": str(hipcc)}, arch)
                        same = [m["sha256"] == j.entry.blob.hash for m, j in zip(got["plans"], items)]
                        if not all(same):
                            raise SystemExit(f"mori's own JIT made other bytes for {arch}/{nic}: {same}")
                    else:
                        got, wall, cpu = _mori("pod", {**base, "artifacts": str(store), "root": str(root)}, arch)
                        if any("error" in m for m in got["plans"]):
                            raise SystemExit(f"the served pod failed: {got['plans']}")
                    arms[arm].append({"wall_s": round(wall, 4), "cpu_s": round(cpu, 4)})
                got, wall, cpu = _mori("pod", {**base, "artifacts": str(store), "root": str(root)}, arch)
                arms["served_warm"].append({"wall_s": round(wall, 4), "cpu_s": round(cpu, 4)})
                refs.append(round(speed_reference(), 4))
            out_groups[f"{arch}/{nic}"] = {
                "plans": [j.plan for j in items],
                **{arm: {"runs": runs, "wall_s_median": statistics.median(x["wall_s"] for x in runs),
                         "cpu_s_median": statistics.median(x["cpu_s"] for x in runs)} for arm, runs in arms.items()},
                "speed_reference_s": refs}
        result = {"bench": "jitv2", "commit": commit(), "date": time.strftime("%Y-%m-%d"),
                  "manifest": str(a.manifest.relative_to(ROOT)), "rounds": a.rounds,
                  "build": {"wall_s": round(build_wall, 3), "cpu_s": round(build_cpu, 3),
                            "compiled": summary["compiled"], "distinct_specs": summary["distinct_specs"]},
                  "code_objects": len(lock.jitv2), "groups": out_groups}
        return emit(result, a.json_out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
