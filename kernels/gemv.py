"""gemv: ``Mxfp8GemvOp``, the skinny mxfp8 matmul for M <= 32 (mori 1.2.4 gemv.py).

One kernel per (N, K, M bucket), buckets 1, 2, 4, 8, 16, 32: the token tile is a
compile-time width, M a runtime argument the tile masks. The op picks each
bucket's configuration (waves, steps, rows, tokens, ksplit) from a table tuned per
shape, with a heuristic for every other shape, and widens the token tile to 32
for a bucket above 16; it then calls ``compile_mxfp8_gemv(n, k, m_max=tokens,
**config)``. No collective, no window, no cco.

The spec carries the resolved configuration explicitly (so the plan needs no mori
import, and a change of mori's table cannot hide behind an unchanged spec): the
table below is mori 1.2.4's, as data. The build half asks mori's own
``select_config`` for the same bucket and refuses to compile when the two
disagree -- which is what a mori with a retuned table would do -- naming both.
"""

from __future__ import annotations

from gemmar_aot.model.spec import KernelSpec

from ._common import RankKernels

RECIPE = "gemv"

#: mori 1.2.4's tuned configurations, per (N, K): a "wWsSrRtT[k|n]" code per bucket
#: (waves, steps, rows, tokens, k-split or n-split).
TUNED = {
    (8192, 1280): {1: "w4s4r16t16k", 2: "w4s4r16t16k", 4: "w4s4r16t16k", 8: "w4s4r16t16k",
                   16: "w4s4r32t16k", 32: "w16s2r32t32k"},
    (5120, 2048): {1: "w16s1r32t16k", 2: "w16s2r32t16k", 4: "w16s4r32t16k", 8: "w16s4r32t16k",
                   16: "w16s2r32t16k", 32: "w16s4r32t32k"},
}
#: mori 1.2.4's configuration for every untuned shape.
HEURISTIC = {"waves": 4, "steps": 2, "rows": 16, "tokens": 16, "ksplit": True}


def _decode(code: str) -> dict:
    import re

    g = re.fullmatch(r"w(\d+)s(\d+)r(\d+)t(\d+)([kn])", code)
    return {"waves": int(g[1]), "steps": int(g[2]), "rows": int(g[3]), "tokens": int(g[4]),
            "ksplit": g[5] == "k"}


def config(n: int, k: int, bucket: int) -> dict:
    """What ``select_config(n, k, bucket)`` returns."""
    from gemmar_aot.model import rules

    code = TUNED.get((n, k), {}).get(bucket)
    cfg = _decode(code) if code else dict(HEURISTIC)
    if cfg["tokens"] < bucket:
        cfg["tokens"] = rules.GEMV_MAX_M
    return cfg


def specs(w, layout, env: dict) -> tuple[RankKernels, ...]:
    cfg = config(w.n, w.k, w.m)
    gemv = KernelSpec.make(RECIPE, "gemv", 0, {"n": w.n, "k": w.k, "bucket": w.m, "m_max": cfg["tokens"],
                                               "config": cfg})
    return (RankKernels(rank=0, launches=(gemv,)),)


def placeholders(*, m: int, n: int, k: int):
    """Flat int32 CPU tensors as Mxfp8GemvOp passes them: W, W scale, X, X scale, then C (bf16)."""
    import torch

    from gemmar_aot.model import rules

    kb = k // rules.MXFP8_BLOCK
    w = torch.empty(n * k // 4, dtype=torch.int32)
    ws = torch.empty((n // rules.MXFP8_BLOCK) * kb // 4, dtype=torch.int32)
    x = torch.empty(m * k // 4, dtype=torch.int32)
    xs = torch.empty(m * kb // 4, dtype=torch.int32)
    c = torch.empty(m * n, dtype=torch.bfloat16)
    return (w, ws, x, xs, c, m, n)


def build(spec: KernelSpec):
    from mori.ops.gemm_ar.gemv import select_config
    from mori.ops.gemm_ar.kernels_gemv import compile_mxfp8_gemv

    p = spec.param_dict()
    theirs = select_config(p["n"], p["k"], p["bucket"])
    if dict(theirs) != p["config"]:
        raise RuntimeError(
            f"mori's Mxfp8GemvOp picks {dict(theirs)} for N={p['n']} K={p['k']} M bucket {p['bucket']}, "
            f"the recipe {p['config']} (mori 1.2.4's table): this mori retuned the skinny kernel; "
            f"update kernels/gemv.py's TUNED/HEURISTIC to its table")
    launch = compile_mxfp8_gemv(n=p["n"], k=p["k"], m_max=p["m_max"], **p["config"])
    return launch, placeholders(m=p["bucket"], n=p["n"], k=p["k"])


def build_group(spec: KernelSpec) -> str | None:
    return None
