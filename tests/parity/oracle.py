"""The oracle: mori 1.2.4's own GemmAllReduceOp, through FlyDSL's own launch path, on the HIP double.

Run as a process of its own (FlyDSL must not be in compile-only mode, and mori's
packages are imported bare), with the double's directory on LD_LIBRARY_PATH:

    python tests/parity/oracle.py SCENARIOS.json OUT.json

For every scenario it constructs mori's op on a communicator double, runs the
steps (calls and self_test) and writes what the HIP double recorded plus the
address map of that op (window, dev comm, window handle, stream, operands).
``self_test`` fails its numerical check here (nothing executes): its verdict is
written down, its launches are what counts. Shims: tests/parity/shims.py.

split-sdma, split-lsa and fused-lsa have no op class in mori: they exist as
mori's builders plus its repository benchmark. For them the oracle is
:func:`_run_benchmark_mode`: mori's builders, launched through FlyDSL's own path
in the order the benchmark runs them (see BENCHMARK below), on the window a
``GemmAllReduceOp`` of the same shape would own.
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
        if d.get("op") == "ep":
            results.append(_run_ep(d, stub, stream))
            print(f"oracle: {d['name']}: {len(results[-1]['launches'])} launches in {results[-1]['seconds']} s",
                  file=sys.stderr, flush=True)
            continue
        sc = Scenario.from_json(d)
        rule = sc.slots == "rule"
        if rule not in classes:
            classes[rule] = _op_class(rule)
        t0 = time.perf_counter()
        ops = Operands()
        if sc.transport in BENCHMARK_MODES:
            # mori's builders, with the op module shimmed above (from_gpu_ptr, CCODevCommRequirements)
            results.append(_run_benchmark_mode(sc, classes[rule][0], stub, stream, ops, t0))
            print(f"oracle: {sc.name}: {len(results[-1]['launches'])} launches in {results[-1]['seconds']} s",
                  file=sys.stderr, flush=True)
            continue
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


#: Where the sequence of :func:`_run_benchmark_mode` comes from: mori's repository benchmark,
#: ``benchmark/cco/flydsl/gemm_ar/bench_gemm_ar.py`` (ROCm/mori at fc89289489cc, the last
#: stored revision before the builders moved into ``mori.ops.gemm_ar``), function ``run()``:
#:
#: * the dev-comm requirements: GDA off, ``sdma_queue_count`` set only when the mode needs
#:   SDMA (``needs_sdma = mode in (split-sdma, fused-sdma, fused-lsa)``);
#: * the GEMM: ``compile_fused_gemm_scatter(cfg, rank, K, BLOCK_M, BLOCK_N,
#:   b_preshuffled=True, quant, sdma_queues, waves_per_eu=2, xcd_swizzle=0, fuse=<fused-*>,
#:   transport="lsa" if fused-lsa else "sdma", swap_ab, permlane, lane_transpose=True,
#:   hoist_scales=False, peer_uncached=False, direct_fence="leader", rotated=None,
#:   n_stripe=None, emit_put=True, atomic_order="acq_rel")`` -- every keyword at the
#:   benchmark's default (``--fence`` and ``--store-probe`` are gone from 1.2.4's builder or
#:   off), called ``gemm(a_i8, b_i8, c_flat, sa, sb, m, n, dc.ptr, win.handle, stream=)``;
#: * the phases: ``build_sdma_phases(cfg, rank, queues=, reduce_self_from_recv=<fused-lsa>,
#:   recv_uncached=<fused-lsa>)`` when the mode needs SDMA, ``build_lsa_ar(cfg, rank)`` for
#:   split-lsa;
#: * ``once()``: GEMM; split-lsa: ``lsa_ar``; else ``parts["drain" if fused else "scatter"]``,
#:   ``parts["reduce"]``, ``parts["gather"]``, each ``(dc.ptr, win.handle, stream=)``.
#:
#: What the oracle takes from mori's op instead of the benchmark, because our runtime serves
#: these modes on a ``GemmAllReduceOp``'s window (one window for every M up to m_max): the
#: window, its handle and the dev comm are those of mori's ``GemmAllReduceOp`` of the same
#: shape, constructed on the communicator double (the benchmark allocates them itself, at
#: exactly M; for split-lsa its dev comm asks for no SDMA queues, which no launch carries);
#: the ``ArConfig`` from ``op._build_cfg`` (the benchmark builds one per run at exactly M,
#: with ``recv_slots=0`` for split-lsa), the counter slot by our rule (shim 5), the op's
#: default ``sdma_queues`` (1; the benchmark's default is 8), the op's block_m per quant, and
#: its A-scale flattening ``op._flatten_a_scale`` (the benchmark's
#: ``sa.t().reshape(-1).contiguous()`` is the same physical order, but a copy, whose address
#: would map to no operand).
#:
#: The self-test (``("self_test", m)`` steps; our runtime runs one at construction): the
#: benchmark has none (it validates a timed run's sum on the device). For split-sdma and
#: fused-lsa the oracle is mori's own ``GemmAllReduceOp.self_test(m)`` on that same op and
#: window (op.py ``self_test``: ``parts["order"]``, scatter -> reduce -> gather, whatever the
#: mode), which is what our runtime runs for them. mori has no self-test of an LSA
#: all-reduce; our split-lsa self-test launches its all-reduce kernel alone over an input of
#: rank + 1, so its oracle is the launch the benchmark's ``once()`` makes after the GEMM,
#: ``lsa_ar(dc.ptr, win.handle)`` at that M (default m_max, as mori's self-test defaults).
#: Only launches are compared: nothing executes on the double, so no verdict can pass.
BENCHMARK = "ROCm/mori benchmark/cco/flydsl/gemm_ar/bench_gemm_ar.py @ fc89289489cc, run()"
BENCHMARK_MODES = ("split-sdma", "split-lsa", "fused-lsa")
#: GemmAllReduceOp's default queue count (op.py: ``sdma_queues=1``), what our runtime's tuples use.
OP_SDMA_QUEUES = 1


def _run_benchmark_mode(sc, MoriOp, stub, stream, ops, t0) -> dict:
    """A mode without an op class: mori's builders, launched in the benchmark's order (BENCHMARK)."""
    import flydsl.expr as fx
    import mori.ops.gemm_ar.op as op_mod
    import torch
    from fakes import FakeCommunicator
    from mori.ops.gemm_ar.kernels_fused import compile_fused_gemm_scatter
    from mori.ops.gemm_ar.kernels_lsa import build_lsa_ar
    from mori.ops.gemm_ar.kernels_sdma import build_sdma_phases

    from parity import shims
    from parity.compare import launch_json
    from parity.scenario import address_map

    mode, ws, rank, bm = sc.transport, sc.world, sc.rank, sc.block_m
    direct_lsa = mode == "fused-lsa"
    fused = mode == "fused-lsa"  # fused-sdma is mori's op, not this path
    needs_sdma = mode in ("split-sdma", "fused-lsa")
    queues = OP_SDMA_QUEUES

    comm = FakeCommunicator(rank=rank, nranks=ws)
    shims.COMMUNICATORS.append(comm)
    stub.clear()
    # The window, its handle and the dev comm: mori's op of this shape (see BENCHMARK).
    op = MoriOp(comm, **sc.op_kwargs(), sdma_queues=queues)
    m_max, max_shapes = op.m_max, op_mod.default_max_shapes(op.m_max, ws, bm)
    mem, win, dc = op.mem, op.win, op.dev_comm

    built: dict[int, tuple] = {}

    def kernels(m: int):
        if m not in built:
            cfg = op_mod._build_cfg(world_size=ws, m_pad=m, n=sc.n, block_m=bm, gather_dtype=sc.gather_dtype,
                                    gather_transport=sc.gather_transport, counter_capacity=op_mod.MAX_CHUNKS,
                                    shape_slots=max_shapes, shape_index=m // (ws * bm) - 1, capacity_m=m_max)
            gemm = compile_fused_gemm_scatter(
                cfg, rank, K=sc.k, BLOCK_M=bm, BLOCK_N=256, b_preshuffled=True, quant=sc.quant,
                sdma_queues=queues, waves_per_eu=2, xcd_swizzle=0, fuse=fused,
                transport="lsa" if direct_lsa else "sdma", swap_ab=True, store_probe=False, permlane=True,
                lane_transpose=True, hoist_scales=False, peer_uncached=False, direct_fence="leader",
                rotated=None, n_stripe=None, emit_put=True, atomic_order="acq_rel")
            parts = (build_sdma_phases(cfg, rank, queues=queues, reduce_self_from_recv=direct_lsa,
                                       recv_uncached=direct_lsa) if needs_sdma else None)
            lsa_ar = build_lsa_ar(cfg, rank)[0] if mode == "split-lsa" else None
            c = op_mod.from_gpu_ptr(mem.ptr + cfg.input_off, (m, sc.n), torch.bfloat16)
            built[m] = (gemm, parts, lsa_ar, c)
        return built[m]

    verdicts = []
    for kind, m in sc.steps:
        stream_arg = fx.Stream(torch.cuda.current_stream())
        if kind == "self_test" and mode == "split-lsa":
            # mori has no LSA self-test: the benchmark's all-reduce launch at that M (BENCHMARK)
            kernels(m or m_max)[2](dc.ptr, win.handle, stream=stream_arg)
            verdicts.append("not mori's: the benchmark's lsa_ar launch (mori has no LSA self-test)")
            continue
        if kind == "self_test":
            try:  # mori's own self-test on this op's window
                op.self_test(m)
                verdicts.append("passed")
            except RuntimeError as exc:
                verdicts.append(f"failed: {exc}")
            continue
        if kind != "call":
            raise ValueError(f"{sc.name}: unknown step {kind!r}")
        a, b, a_scale, b_scale = ops.get(sc, m)
        gemm, parts, lsa_ar, c = kernels(m)
        gemm(a.contiguous().view(torch.int8).view(-1), b.contiguous().view(torch.int8).view(-1), c.view(-1),
             op_mod._flatten_a_scale(a_scale, m, sc.k // 128), b_scale.reshape(-1), m, sc.n, dc.ptr, win.handle,
             stream=stream_arg)
        if mode == "split-lsa":
            lsa_ar(dc.ptr, win.handle, stream=stream_arg)
            continue
        parts["drain" if fused else "scatter"](dc.ptr, win.handle, stream=stream_arg)
        parts["reduce"](dc.ptr, win.handle, stream=stream_arg)
        parts["gather"](dc.ptr, win.handle, stream=stream_arg)

    launches = [launch_json(r) for r in stub.launches()]
    amap = address_map(window=(mem.ptr, op.window_bytes), dev_comm=int(dc.ptr), win=int(win.handle),
                       stream=stream.cuda_stream, operands=ops)
    op.close()
    shims.COMMUNICATORS.remove(comm)
    return {"scenario": sc.to_json(), "launches": launches, "address_map": amap, "self_test": verdicts,
            "seconds": round(time.perf_counter() - t0, 3), "benchmark": BENCHMARK}


_EP_CLASS: list = []


def _run_ep(d: dict, stub, stream) -> dict:
    """mori's own EpDispatchCombineOpFlyDSL (shims 7-10) on the communicator double, the scenario's calls."""
    import torch
    from fakes import FakeCommunicator

    from parity import shims
    from parity.compare import launch_json
    from parity.ep_scenario import EpOperands, EpScenario, address_map, run_steps

    sc = EpScenario.from_json(d)
    if not _EP_CLASS:
        _EP_CLASS.append(shims.install_ep_shims(stream))
    from mori.ops.dispatch_combine_v2.dispatch_combine_op import EpDispatchCombineConfig

    t0 = time.perf_counter()
    comm = FakeCommunicator(rank=sc.rank, nranks=sc.world)
    shims.COMMUNICATORS.append(comm)
    stub.clear()
    cfg = EpDispatchCombineConfig(**sc.mori_config(torch))
    op = _EP_CLASS[0](cfg, comm)
    ops = EpOperands(sc)
    said = run_steps(op, sc, ops)
    launches = [launch_json(r) for r in stub.launches()]
    amap = address_map(op, window=(op.arena._mem.ptr, op.arena.total_bytes), win=int(op.arena.handle),
                       stream=stream.cuda_stream, operands=ops)
    out = {"scenario": sc.to_json(), "launches": launches, "address_map": amap, "said": said,
           "geometry": [cfg.dispatch_block_num, cfg.warp_num_per_block, cfg.combine_block_num,
                        cfg.combine_warp_num_per_block],
           "schedule": [list(b) for b in cfg.schedule] if cfg.schedule else None,
           "seconds": round(time.perf_counter() - t0, 3)}
    op.close()
    shims.COMMUNICATORS.remove(comm)
    return out


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
