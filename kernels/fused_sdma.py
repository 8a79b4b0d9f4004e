"""fused-sdma: what ``GemmAllReduceOp`` runs (mori 1.2.4 op.py ``_compiled``).

Per call: the GEMM with the scatter fused into its epilogue (SDMA puts as each
destination's chunk completes), then the SDMA tail in
``build_sdma_phases(...)["fused_order"]`` (see :mod:`.sdma_phases`):
drain -> reduce -> (fp8 inserts) -> gather. ``self_test`` runs ``["order"]``
instead: scatter, then the same tail.
"""

from __future__ import annotations

from gemmar_aot.model.spec import KernelSpec

from . import sdma_phases
from ._common import GEMM_FIXED, RankKernels, build_gemm

RECIPE = "fused-sdma"


def fused_gemm_spec(recipe: str, w, rank: int, cfg: dict, *, transport: str) -> KernelSpec:
    """``compile_fused_gemm_scatter(cfg, rank, fuse=True, transport=...)`` as the op calls it."""
    return KernelSpec.make(recipe, "gemm", rank, {
        "cfg": cfg,
        "n": w.n,
        "builder": {"K": w.k, "BLOCK_M": w.block_m, "BLOCK_N": w.block_n, "fuse": True,
                    "transport": transport, "quant": w.quant, "sdma_queues": w.sdma_queues,
                    **GEMM_FIXED},
    })


def specs(w, layout, env: dict) -> tuple[RankKernels, ...]:
    """Per-rank specs for one tuple. ``layout`` carries m_max/max_shapes/slot."""
    cfg = sdma_phases.tuple_cfg(w, layout)
    tail = sdma_phases.tail(w.gather_dtype, w.gather_transport)
    return tuple(
        RankKernels(rank=rank,
                    launches=(fused_gemm_spec(RECIPE, w, rank, cfg, transport="sdma"),)
                    + sdma_phases.sequence(w, rank, ("drain",) + tail, cfg, env),
                    self_test=sdma_phases.self_test(w, rank, cfg, env))
        for rank in range(w.world))


def build(spec: KernelSpec):
    return build_gemm(spec, placeholder_m=spec.param_dict()["cfg"]["m_pad"])


def build_group(spec: KernelSpec) -> str | None:
    return None
