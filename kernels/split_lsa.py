"""split-lsa: the unfused baseline. GEMM(fuse=False) -> LSA all-reduce.

The GEMM with ``fuse=False`` never touches the window (no counters, no puts), so
it is built the way ``Mxfp8GemmOp`` builds its GEMM: against a throwaway config at
rank 0, once per (N, K, quant, tile) and shared by every M and rank. ``c_m`` is a
runtime argument; the launch record carries the grid as FlyDSL computes it.

The all-reduce is ``build_lsa_ar(cfg, rank)`` over the op's window layout, in the
place the fused path puts its GEMM output (the window's input region). It picks
1-stage or 2-stage from the payload size itself (``select_stage``).
"""

from __future__ import annotations

from gemmar_aot.spec import KernelSpec

from ._common import GEMM_FIXED, RankKernels, build_gemm, gemm_only_cfg, make_cfg, op_cfg

RECIPE = "split-lsa"
LSA_FIXED = {"force_stage": None, "gather": "interleaved"}


def call_sequence(w) -> tuple[str, ...]:
    return ("gemm", "lsa_ar")


def specs(w, layout, env: dict) -> tuple[RankKernels, ...]:
    gemm = KernelSpec.make(RECIPE, "gemm", 0, {
        "cfg": gemm_only_cfg(n=w.n, block_m=w.block_m),
        "n": w.n,
        "builder": {"K": w.k, "BLOCK_M": w.block_m, "BLOCK_N": w.block_n, "fuse": False,
                    "transport": "sdma", "quant": w.quant, "sdma_queues": 1, **GEMM_FIXED},
    })
    cfg = op_cfg(world=w.world, m_pad=w.m, n=w.n, block_m=w.block_m, gather_dtype="bf16",
                 gather_transport="lsa", shape_slots=layout.max_shapes,
                 shape_index=layout.slot, capacity_m=layout.m_max)
    out = []
    for rank in range(w.world):
        ar = KernelSpec.make(RECIPE, "lsa_ar", rank, {"cfg": cfg, "builder": dict(LSA_FIXED)})
        out.append(RankKernels(rank=rank, launches=(gemm, ar)))
    return tuple(out)


def build(spec: KernelSpec):
    if spec.kind == "gemm":
        # Any M traces the same kernel (c_m is a runtime argument); trace at one band.
        return build_gemm(spec, placeholder_m=spec.param_dict()["builder"]["BLOCK_M"])
    from mori.ops.gemm_ar.kernels_lsa import build_lsa_ar

    p = spec.param_dict()
    run, _stage = build_lsa_ar(make_cfg(p["cfg"]), spec.rank, **p["builder"])
    return run, (0, 0)


def build_group(spec: KernelSpec) -> str | None:
    return None
