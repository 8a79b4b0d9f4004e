"""split-sdma: the unfused GEMM, then the SDMA all-reduce (mori's ``--mode split-sdma``).

Per call: GEMM(fuse=False) into the window's input region -- built per rank with the
tuple's queue count, as mori's benchmark builds it, and shared with split-lsa
(:mod:`.gemm_only`) -- then
``build_sdma_phases(...)["order"]``: scatter -> reduce -> (fp8 inserts) -> gather,
the very sequence ``self_test`` runs (so the self-test adds no kernels).

Plan half only: every kernel here is a spec of the ``gemm-only`` or
``sdma-phases`` recipe.
"""

from __future__ import annotations

from . import sdma_phases
from ._common import RankKernels
from .gemm_only import split_gemm_spec


def specs(w, layout, env: dict) -> tuple[RankKernels, ...]:
    cfg = sdma_phases.tuple_cfg(w, layout)
    out = []
    for rank in range(w.world):
        order = sdma_phases.self_test(w, rank, cfg, env)
        out.append(RankKernels(rank=rank, launches=(split_gemm_spec(w, rank),) + order, self_test=order))
    return tuple(out)
