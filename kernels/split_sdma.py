"""split-sdma: the unfused GEMM, then the SDMA all-reduce (mori's ``--mode split-sdma``).

Per call: GEMM(fuse=False) into the window's input region -- the same kernel as
Mxfp8GemmOp's and split-lsa's, built once (:mod:`.gemm_only`) -- then
``build_sdma_phases(...)["order"]``: scatter -> reduce -> (fp8 inserts) -> gather,
the very sequence ``self_test`` runs (so the self-test adds no kernels).

Plan half only: every kernel here is a spec of the ``gemm-only`` or
``sdma-phases`` recipe.
"""

from __future__ import annotations

from . import sdma_phases
from ._common import RankKernels
from .gemm_only import unfused_gemm_spec


def specs(w, layout, env: dict) -> tuple[RankKernels, ...]:
    gemm = unfused_gemm_spec(n=w.n, k=w.k, quant=w.quant, block_m=w.block_m, block_n=w.block_n)
    cfg = sdma_phases.tuple_cfg(w, layout)
    out = []
    for rank in range(w.world):
        order = sdma_phases.self_test(w, rank, cfg, env)
        out.append(RankKernels(rank=rank, launches=(gemm,) + order, self_test=order))
    return tuple(out)
