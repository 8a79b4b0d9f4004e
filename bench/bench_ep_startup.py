"""EP ops in a pod: time to ready and the first call of each bucket, ours against mori's JIT path (issue 32).

Usage::

    python bench/bench_ep_startup.py [--manifest manifests/dsv4-pro-ep.toml] [--entry 0] [--rank 0]
                                     [--rounds 2] [--store DIR] [--json-out FILE]

One rank of one ``[[ep]]`` entry (default: dsv4-pro-ep's bf16 EP8 entry, rank 0; every rank of an
entry does the same work), each arm a fresh process on the HIP test double (tests/hipstub: it loads
and launches nothing, so what is timed is the host's work) and the communicator double, rounds
interleaved:

* ``ours``: ``import gemmar_aot.runtime`` and ``EpDispatchCombineOp(cfg, comm)`` from the entry's
  lock (every kernel of the rank verified, loaded, resolved; the window allocated and zeroed), then
  per bucket of the schedule the first ``dispatch`` + ``combine`` and a second one;
* ``mori``, **the anchor**: mori 1.2.4's own ``EpDispatchCombineOpFlyDSL`` through FlyDSL's own
  path (tests/parity/shims.py 1, 7-10: the same doubles; FlyDSL's location capture left on, as in
  a pod): importing it, constructing it (the same window, zeroed), then per bucket the first call,
  which traces and compiles that bucket's dispatch and combine variants, and a second one.

Both arms zero the window (941 MB for the shipped entry) in host memory here; on a GPU that is
a device memset of well under a millisecond, so ``ready`` here is an upper bound for both.
Beside them, the speed reference of ``bench_runtime.py``. The store is built first (the
entry alone, ``-j 2``) unless ``--store`` holds it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests")]
from _results import commit, emit  # noqa: E402


def _child(arm: str, job: dict) -> dict:
    """One arm in this process (started by :func:`run_arm` with the double on LD_LIBRARY_PATH)."""
    from hipstub import HipStub

    stub = HipStub(job["stub"])
    from parity import shims
    from parity.ep_scenario import EpOperands, EpScenario

    sc = EpScenario.from_json(job["scenario"])
    stream = shims.install_stream_shim(stub)
    c0, t0 = time.process_time(), time.perf_counter()
    if arm == "ours":
        from fakes import FakeCommunicator

        from gemmar_aot.runtime import EpDispatchCombineConfig, EpDispatchCombineOp
        from gemmar_aot.runtime.hip import HipDriver
        import torch

        t_import, c_import = time.perf_counter() - t0, time.process_time() - c0
        kw = {k: v for k, v in sc.mori_config(torch).items() if k != "kernel_backend"}
        make = lambda comm: EpDispatchCombineOp(EpDispatchCombineConfig(**kw), comm,  # noqa: E731
                                                artifacts=job["lock"], driver=HipDriver(job["stub"]))
    else:
        from parity.oracle import _environment

        _environment()
        cls = shims.install_ep_shims(stream)
        from fakes import FakeCommunicator
        from mori.ops.dispatch_combine_v2.dispatch_combine_op import EpDispatchCombineConfig
        import torch

        t_import, c_import = time.perf_counter() - t0, time.process_time() - c0
        make = lambda comm: cls(EpDispatchCombineConfig(**sc.mori_config(torch)), comm)  # noqa: E731
    zeroed = _time_window_zeroing(arm)
    comm = FakeCommunicator(rank=sc.rank, nranks=sc.world, lazy=True)
    shims.COMMUNICATORS.append(comm)
    c1, t1 = time.process_time(), time.perf_counter()
    op = make(comm)
    ready, ready_cpu = time.perf_counter() - t1, time.process_time() - c1
    ops = EpOperands(sc)
    calls = {}
    for n in job["tokens"]:
        x, w, s, idx = ops.dispatch(n)
        times = []
        for _ in range(2):
            t = time.perf_counter()
            *_, handle = op.dispatch(x, w, s, idx, return_routing=True)
            op.combine(op.combine_in_view()[:min(n * sc.topk, sc.recv_cap)], routing=handle)
            times.append(round(time.perf_counter() - t, 6))
        calls[str(n)] = {"first_s": times[0], "second_s": times[1]}
    op.close()
    return {"import_s": round(t_import, 4), "import_cpu_s": round(c_import, 4), "ready_s": round(ready, 4),
            "window_zero_s": round(zeroed[0], 4), "ready_less_zero_s": round(ready - zeroed[0], 4),
            "ready_cpu_s": round(ready_cpu, 4), "calls": calls, "launches": len(stub.launches()),
            "first_calls_s": round(sum(c["first_s"] for c in calls.values()), 4)}


def _time_window_zeroing(arm: str) -> list:
    """Seconds spent zeroing the window (host memory here; a device memset on a GPU), summed into
    the returned one-element list: ours through the driver's memset, mori's through SymmArena.zero."""
    spent = [0.0]
    if arm == "ours":
        from gemmar_aot.runtime.hip import HipDriver as owner
        name = "memset"
    else:
        from mori.ops.dispatch_combine_v2.symm_arena import SymmArena as owner
        name = "zero"
    real = getattr(owner, name)

    def timed(*args, **kw):
        t = time.perf_counter()
        try:
            return real(*args, **kw)
        finally:
            spent[0] += time.perf_counter() - t

    setattr(owner, name, timed)
    return spent


def run_arm(arm: str, job: dict, work: Path) -> dict:
    path = work / f"job-{arm}.json"
    path.write_text(json.dumps(job))
    env = {**os.environ, "LD_LIBRARY_PATH": str(Path(job["stub"]).parent)}
    p = subprocess.run([sys.executable, __file__, "--child", arm, str(path)], capture_output=True, text=True,
                       cwd=ROOT, env=env)
    if p.returncode != 0:
        raise SystemExit(f"the {arm} arm failed:\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.splitlines()[-1])


def _entry_store(manifest: Path, entry: int, store: Path) -> Path:
    """The store holding ``entry`` alone (built, or all hits); returns its lock."""
    head, *entries = manifest.read_text().split("[[ep]]")
    m = store.parent / f"{manifest.stem}-ep{entry}.toml"
    m.write_text(head + "[[ep]]" + entries[entry])
    p = subprocess.run([sys.executable, "-m", "gemmar_aot", "build", str(m), "--store", str(store), "-j", "2",
                        "-q", "--json"], cwd=ROOT, capture_output=True, text=True)  # all hits when built before
    if p.returncode != 0:
        raise SystemExit(f"building the entry failed:\n{p.stderr[-4000:]}")
    return Path(json.loads(p.stdout)["lock_file"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--manifest", type=Path, default=ROOT / "manifests" / "dsv4-pro-ep.toml")
    ap.add_argument("--entry", type=int, default=0)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--store", type=Path)
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(_child(a.child[0], json.loads(Path(a.child[1]).read_text()))))
        return 0

    from bench_runtime import python_speed_ms
    from hipstub import build
    from parity.ep_scenario import EpScenario

    from gemmar_aot.builder.manifest import load_manifest
    from gemmar_aot.model.ep import pick

    c = load_manifest(a.manifest).eps[a.entry].config
    sc = EpScenario("bench", c.world, a.rank, c.hidden, c.max_tokens, c.experts, c.topk, c.dispatch_dtype,
                    c.combine_dtype, c.quant_type, c.combine_mode, c.scale_dim, c.scale_type_size,
                    c.max_total_recv_tokens, c.std_moe, c.replay)
    # one token count per bucket: each bucket's bound (the last: the capacity)
    tokens = sorted({min(b[0] or c.max_tokens, c.max_tokens) for b in c.schedule})
    speed_before = python_speed_ms()
    with tempfile.TemporaryDirectory(prefix="bench-ep-startup-") as tmp:
        work = Path(tmp)
        store = a.store or work / "store"
        lock = _entry_store(a.manifest, a.entry, store)
        job = {"stub": str(build(work / "hipstub")), "lock": str(lock), "scenario": sc.to_json(), "tokens": tokens}
        runs: dict[str, list] = {"ours": [], "mori": []}
        for _ in range(a.rounds):
            for arm in ("ours", "mori"):
                runs[arm].append(run_arm(arm, job, work))

    def med(arm: str, f) -> float:
        return round(statistics.median(f(r) for r in runs[arm]), 4)

    result = {"manifest": str(a.manifest), "entry": a.entry, "config": c.to_json(), "rank": a.rank,
              "tokens": tokens, "buckets": {str(n): [list(v) for v in pick(c, n)] for n in tokens},
              "rounds": a.rounds, "runs": runs}
    for arm in runs:
        result[arm] = {"import_s_median": med(arm, lambda r: r["import_s"]),
                       "ready_s_median": med(arm, lambda r: r["ready_s"]),
                       "ready_cpu_s_median": med(arm, lambda r: r["ready_cpu_s"]),
                       "ready_less_zero_s_median": med(arm, lambda r: r["ready_less_zero_s"]),
                       "first_calls_s_median": med(arm, lambda r: r["first_calls_s"]),
                       "first_call_s_median": {str(n): med(arm, lambda r: r["calls"][str(n)]["first_s"]) for n in tokens},
                       "second_call_s_median": {str(n): med(arm, lambda r: r["calls"][str(n)]["second_s"])
                                                for n in tokens}}
    result["python_speed_ms"] = {"before": speed_before, "after": python_speed_ms()}
    result["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    result["commit"] = commit()
    return emit(result, a.json_out)


if __name__ == "__main__":
    raise SystemExit(main())
