"""gemm-only: the GEMM with ``fuse=False`` -- ``Mxfp8GemmOp``'s, and the split modes'.

``compile_fused_gemm_scatter(fuse=False)`` emits the fused kernel minus its
epilogue tail: it never touches the window, so it does not depend on the rank,
the world, the window layout or M (``c_m`` is a runtime argument and the tail
block masks). It is built at rank 0 against the throwaway config Mxfp8GemmOp
uses, once per (N, K, quant, tile), and shared by gemm-only, split-sdma and
split-lsa. ``sdma_queues`` is the builder's default (8, what Mxfp8GemmOp leaves
it at): with no puts it changes nothing, and one value keeps one spec.

Mxfp8GemmOp (mxfp8 only) owns exactly two kernels per (N, K): the wide tile
(BLOCK_N=256, permlane store) and, when the wide grid would be under 140 blocks,
the narrow tile (BLOCK_N=128, no permlane). A tuple's M picks which one it needs.
"""

from __future__ import annotations

from gemmar_aot import rules
from gemmar_aot.spec import KernelSpec

from ._common import GEMM_FIXED, RankKernels, build_gemm, gemm_only_cfg

RECIPE = "gemm-only"
UNFUSED_SDMA_QUEUES = 8


def unfused_gemm_spec(*, n: int, k: int, quant: str, block_m: int, block_n: int,
                      narrow: bool = False) -> KernelSpec:
    builder = {"K": k, "BLOCK_M": block_m, "BLOCK_N": rules.NARROW_BLOCK_N if narrow else block_n,
               "fuse": False, "transport": "sdma", "quant": quant, "sdma_queues": UNFUSED_SDMA_QUEUES,
               **GEMM_FIXED}
    # The narrow tile gives up the permlane store (it pairs exactly two 256-wide N tiles).
    builder["permlane"] = builder["lane_transpose"] = not narrow
    return KernelSpec.make(RECIPE, "gemm", 0, {"cfg": gemm_only_cfg(n=n, block_m=block_m), "n": n,
                                               "builder": builder})


def specs(w, layout, env: dict) -> tuple[RankKernels, ...]:
    gemm = unfused_gemm_spec(n=w.n, k=w.k, quant="mxfp8", block_m=rules.MXFP8_BLOCK_M, block_n=w.block_n,
                             narrow=rules.gemm_only_wants_narrow(w.m, w.n))
    # No collective: every rank runs the same kernel. Report one rank.
    return (RankKernels(rank=0, launches=(gemm,)),)


def build(spec: KernelSpec):
    # Any M traces the same kernel (c_m is a runtime argument); trace at one band.
    return build_gemm(spec, placeholder_m=spec.param_dict()["builder"]["BLOCK_M"])


def build_group(spec: KernelSpec) -> str | None:
    return None
