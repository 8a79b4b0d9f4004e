"""fused-sdma: what ``GemmAllReduceOp`` runs (mori 1.2.4 op.py ``_compiled``).

Per call: GEMM with the scatter fused into its epilogue, then the SDMA tail in
``build_sdma_phases(...)["fused_order"]``:

    bf16 wire        drain -> reduce -> gather
    fp8 wire, lsa    drain -> reduce -> quantize -> gather_barrier -> pull
    fp8 wire, sdma   drain -> reduce -> quantize -> gather -> dequantize

``self_test`` runs ``["order"]`` instead: scatter, then the same tail.

Dedup: drain and gather_barrier are ``_push_kernel`` over the control area's
constant offsets only, so their spec carries (world, rank, queues) and they are
built against one canonical config; every other kernel carries the tuple's full
config. ``tests/test_compile.py`` checks the canonical drain against the op's own.
"""

from __future__ import annotations

from gemmar_aot.spec import KernelSpec

from ._common import GEMM_FIXED, PHASE_FIXED, RankKernels, build_gemm, build_phase, op_cfg, phase_build_group

RECIPE = "fused-sdma"
#: Phases whose code reads only the control area (start/end/flag offsets, which
#: no shape changes), the world, the rank and the queue count.
CONTROL_ONLY_PHASES = ("drain", "gather_barrier")


def tail(gather_dtype: str, gather_transport: str) -> tuple[str, ...]:
    if gather_dtype == "fp8":
        if gather_transport == "lsa":
            return ("reduce", "quantize", "gather_barrier", "pull")
        return ("reduce", "quantize", "gather", "dequantize")
    return ("reduce", "gather")


def call_sequence(w) -> tuple[str, ...]:
    return ("gemm", "drain") + tail(w.gather_dtype, w.gather_transport)


def self_test_sequence(w) -> tuple[str, ...]:
    return ("scatter",) + tail(w.gather_dtype, w.gather_transport)


def _canonical_control_cfg(world: int) -> dict:
    # fp8 + lsa so that both control-only phases exist in the builder's table.
    return op_cfg(world=world, m_pad=world * 128, n=1024, block_m=128, gather_dtype="fp8",
                  gather_transport="lsa", shape_slots=1, shape_index=0, capacity_m=0)


def _phase_spec(w, rank: int, phase: str, cfg: dict, env_pull_blocks) -> KernelSpec:
    builder = {"queues": w.sdma_queues, **PHASE_FIXED}
    if phase in CONTROL_ONLY_PHASES:
        cfg = _canonical_control_cfg(w.world)
    params = {"cfg": cfg, "builder": builder, "phase": phase}
    if phase == "pull":
        params["env"] = {"MORI_GEMM_AR_PULL_BLOCKS": env_pull_blocks}
    return KernelSpec.make(RECIPE, phase, rank, params)


def specs(w, layout, env: dict) -> tuple[RankKernels, ...]:
    """Per-rank specs for one tuple. ``layout`` carries m_max/max_shapes/slot."""
    cfg = op_cfg(world=w.world, m_pad=w.m, n=w.n, block_m=w.block_m,
                 gather_dtype=w.gather_dtype, gather_transport=w.gather_transport,
                 shape_slots=layout.max_shapes, shape_index=layout.slot,
                 capacity_m=layout.m_max)
    pull = env.get("MORI_GEMM_AR_PULL_BLOCKS")
    out = []
    for rank in range(w.world):
        gemm = KernelSpec.make(RECIPE, "gemm", rank, {
            "cfg": cfg,
            "n": w.n,
            "builder": {"K": w.k, "BLOCK_M": w.block_m, "BLOCK_N": w.block_n, "fuse": True,
                        "transport": "sdma", "quant": w.quant, "sdma_queues": w.sdma_queues,
                        **GEMM_FIXED},
        })
        launches = (gemm,) + tuple(_phase_spec(w, rank, ph, cfg, pull)
                                   for ph in call_sequence(w)[1:])
        st = tuple(_phase_spec(w, rank, ph, cfg, pull) for ph in self_test_sequence(w))
        out.append(RankKernels(rank=rank, launches=launches, self_test=st))
    return tuple(out)


def build(spec: KernelSpec):
    if spec.kind == "gemm":
        return build_gemm(spec, placeholder_m=spec.param_dict()["cfg"]["m_pad"])
    return build_phase(spec)


def build_group(spec: KernelSpec) -> str | None:
    return None if spec.kind == "gemm" else phase_build_group(spec)
