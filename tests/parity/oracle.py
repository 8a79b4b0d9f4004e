"""The oracle: mori 1.2.4's own GemmAllReduceOp, through FlyDSL's own launch path, on the HIP double.

Run as a process of its own (FlyDSL must not be in compile-only mode, and mori's
packages are imported bare), with the double's directory on LD_LIBRARY_PATH:

    python tests/parity/oracle.py SCENARIOS.json OUT.json

For every scenario it constructs mori's op on a communicator double, runs the
steps (calls and self_test) and writes what the HIP double recorded plus the
address map of that op (window, dev comm, window handle, stream, operands).
``self_test`` fails its numerical check here (nothing executes): its verdict is
written down, its launches are what counts. Shims: tests/parity/shims.py.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: fakes, hipstub, parity


def _environment() -> None:
    from gemmar_aot.toolchain import compile_env, import_mori_device, load_toolchain

    tc = load_toolchain()
    env = compile_env(tc)
    env.pop("COMPILE_ONLY")  # FlyDSL's normal mode: compile, load, launch
    for name in list(os.environ):
        if name.startswith(("FLYDSL_", "MORI_")) and name not in env:
            del os.environ[name]
    os.environ.pop("COMPILE_ONLY", None)
    os.environ.update(env)
    import_mori_device(tc)


def run(scenarios: list[dict], stub_path: str, *, fast: bool = True) -> list[dict]:
    from hipstub import HipStub

    stub = HipStub(stub_path)  # first, so FlyDSL's runtime binds to this copy
    _environment()
    from parity import shims

    stream = shims.install_stream_shim(stub)
    if fast:
        shims.disable_location_capture()
    from fakes import FakeCommunicator
    from parity.compare import launch_json
    from parity.scenario import Operands, Scenario, address_map

    results = []
    classes = {}
    for d in scenarios:
        sc = Scenario.from_json(d)
        rule = sc.slots == "rule"
        if rule not in classes:
            classes[rule] = _op_class(rule)
        t0 = time.perf_counter()
        ops = Operands()
        if sc.transport in ("gemm-only", "gemv"):
            cls = classes[rule][1] if sc.transport == "gemm-only" else classes[rule][2]
            results.append(_run_standalone(sc, cls, stub, stream, ops, t0))
            continue
        MoriOp = classes[rule][0]
        comm = FakeCommunicator(rank=sc.rank, nranks=sc.world)
        shims.COMMUNICATORS.append(comm)
        stub.clear()
        op = MoriOp(comm, **sc.op_kwargs())
        verdicts = []
        for kind, m in sc.steps:
            if kind == "self_test":
                try:
                    op.self_test(m)
                    verdicts.append("passed")
                except RuntimeError as exc:
                    verdicts.append(f"failed: {exc}")
            else:
                op(*ops.get(sc, m))
        launches = [launch_json(r) for r in stub.launches()]
        amap = address_map(window=(op.mem.ptr, op.window_bytes), dev_comm=int(op.dev_comm.ptr),
                           win=int(op.win.handle), stream=stream.cuda_stream, operands=ops)
        results.append({"scenario": sc.to_json(), "launches": launches, "address_map": amap,
                        "self_test": verdicts, "seconds": round(time.perf_counter() - t0, 3)})
        op.close()
        shims.COMMUNICATORS.remove(comm)
        print(f"oracle: {sc.name}: {len(launches)} launches in {results[-1]['seconds']} s", file=sys.stderr,
              flush=True)
    return results


def _run_standalone(sc, cls, stub, stream, ops, t0) -> dict:
    """mori's Mxfp8GemmOp / Mxfp8GemvOp: no communicator, no window; the output is the caller's tensor."""
    from parity.compare import launch_json
    from parity.scenario import address_map

    stub.clear()
    op = cls(n=sc.n, k=sc.k)
    for _kind, m in sc.steps:
        *operands, out = ops.get(sc, m)
        op(*operands, out=out)
    amap = address_map(window=(0, 0), dev_comm=0, win=0, stream=stream.cuda_stream, operands=ops)
    return {"scenario": sc.to_json(), "launches": [launch_json(r) for r in stub.launches()], "address_map": amap,
            "self_test": [], "seconds": round(time.perf_counter() - t0, 3)}


def _op_class(rule_slots: bool):
    """mori's (GemmAllReduceOp, Mxfp8GemmOp, Mxfp8GemvOp), shimmed; a fresh import of op.py per slot policy."""
    import importlib
    import sys

    from parity import shims

    sys.modules.pop("mori.ops.gemm_ar.op", None)
    cls = shims.install_oracle_shims(rule_slots=rule_slots)
    importlib.invalidate_caches()
    import mori.ops.gemm_ar.gemm as gemm_mod
    import mori.ops.gemm_ar.gemv as gemv_mod

    return cls, gemm_mod.Mxfp8GemmOp, gemv_mod.Mxfp8GemvOp


def main(argv: list[str]) -> int:
    src, out = Path(argv[1]), Path(argv[2])
    job = json.loads(src.read_text())
    results = run(job["scenarios"], job["stub"], fast=job.get("fast", True))
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"results": results}))
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
