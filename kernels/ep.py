"""ep: mori's EP dispatch/combine v2, FlyDSL backend, intranode (mori 1.2.4
``dispatch_combine_v2/flydsl_backend.py`` and ``intranode_kernels.py``).

Per rank, the kernels ``EpDispatchCombineOpFlyDSL`` wraps, in this order: one dispatch per
(block, warp) variant its device table's schedule selects, one combine per combine variant
(``make_combine``, or ``make_combine_scatter`` for a scatter combine), with ``replay`` one
replay dispatch per dispatch variant (mori makes those lazily, on the first replay call;
a pod has them from the start), the local expert count, and with ``std_moe`` the two
converts. The rank is compiled in (rank 3's bytes differ from rank 0's) while every rank's
symbol is the same (``ep_dispatch_0``): an artifact is identified by its record, never by
its symbol.

The spec carries every keyword argument of the factory call exactly as the backend passes
them -- arena offsets included, computed from the backend's region list
(``gemmar_aot.model.ep.arena_layout``) -- so the plan needs no mori import and identical
calls dedupe (a combine does not read the expert count). The build half calls mori's own
factory with them and compiles its ``@flyc.jit`` wrapper; every argument is a scalar.
"""

from __future__ import annotations

import os

from gemmar_aot.model.spec import KernelSpec

from ._common import RankKernels

RECIPE = "ep"
#: What the kernels are compiled for: mori reads MORI_WAVE_SIZE when its kernel module is
#: imported and MORI_GPU_ARCHS at every dispatch trace. Set from the spec, never the host.
COMPILE_ENV = {"MORI_WAVE_SIZE": "64", "MORI_GPU_ARCHS": "gfx950"}
#: Positional scalar arguments of each factory's ``run`` (every one an i64 or i32).
NARGS = {"make_dispatch": 11, "make_combine": 9, "make_combine_scatter": 9, "make_local_expert_count": 3,
         "make_convert_dispatch_output": 8, "make_convert_combine_input": 5}
#: Keywords the 1.2.4 backend passes that a later mori's factory no longer takes, and why
#: dropping them is what that mori's own backend does. The plan leaves them out of the specs it
#: makes for that mori (``gemmar_aot.model.ep.factory_kwargs``), so every record states exactly the
#: call its build made; ``build`` meets one only in a spec planned for another mori.
DROPPED_LATER = {"reset_total_recv": "mori 1.2.5 removed it: its combine no longer zeroes total_recv, and "
                                     "its backend no longer passes it"}


def specs(c, rank: int) -> tuple[KernelSpec, ...]:
    """One rank's kernels of the resolved configuration ``c`` (gemmar_aot.model.ep.EpConfig)."""
    from gemmar_aot.model.ep import arena_layout, variants  # plan half only

    a = arena_layout(c)
    disp, comb = variants(c)
    db, dw, cb, cw = c.geometry
    base = {"rank": rank, "npes": c.world, "experts_per_token": c.topk, "hidden_dim": c.hidden,
            "max_tok_per_rank": c.max_tokens, "max_recv": c.recv_cap}
    dispatch = {**base, "experts_per_rank": c.experts_per_rank, "hidden_elem_size": c.elem_size,
                "off_tok_off": a.offset("tok_off"), "off_recv_num": a.offset("recv_num"),
                "off_tis": a.offset("recv_to_src_token"), "off_out_idx": a.offset("out_idx"),
                "off_out_wts": a.offset("out_wts"), "off_out_tok": a.offset("disp_out"),
                "off_out_scales": a.offset("out_scales") if a.has("out_scales") else 0,
                "scale_dim": c.scale_dim, "scale_type_size": c.scale_type_size, "fp4": c.is_fp4}
    if c.is_scatter:
        combine_factory = "make_combine_scatter"
        combine = {**base, "hidden_elem_size": c.elem_size, "off_out_tok": a.offset("out_tok"),
                   "off_comb_inp": a.offset("comb_inp"), "off_tis": a.offset("recv_to_src_token"),
                   "off_xdb_mem": a.offset("cross_device_barrier"), "off_out_wts": a.offset("out_wts"),
                   "off_comb_wts": a.offset("comb_wts"),
                   "off_comb_scales": a.offset("comb_scales") if c.fp8_blockwise else 0,
                   "fp8_direct_cast": c.fp8_direct_cast, "fp8_blockwise": c.fp8_blockwise,
                   "scale_dim": c.combine_scale_dim, "reset_total_recv": False}
    else:
        combine_factory = "make_combine"
        combine = {**base, "hidden_elem_size": c.combine_elem_size, "off_out_tok": a.offset("out_tok"),
                   "off_xdb_mem": a.offset("cross_device_barrier"), "off_out_wts": a.offset("out_wts"),
                   "reset_total_recv": True, "fp4": c.combine_dtype == "fp4"}

    def spec(kind, factory, kwargs):
        return KernelSpec.make(RECIPE, kind, rank, {"factory": factory, "kwargs": kwargs, "env": COMPILE_ENV})

    out = [spec("dispatch", "make_dispatch", {**dispatch, "block_num": b, "warp_num_per_block": w})
           for b, w in disp]
    out += [spec("combine", combine_factory, {**combine, "block_num": b, "warp_num_per_block": w}) for b, w in comb]
    if c.replay:
        out += [spec("dispatch_replay", "make_dispatch",
                     {**dispatch, "block_num": b, "warp_num_per_block": w, "replay": True}) for b, w in disp]
    out.append(spec("local_expert_count", "make_local_expert_count",
                    {"rank": rank, "experts_per_rank": c.experts_per_rank, "experts_per_token": c.topk,
                     "block_num": db, "warp_num_per_block": dw}))
    if c.std_moe:
        conv = {"rank": rank, "experts_per_rank": c.experts_per_rank, "experts_per_token": c.topk,
                "hidden_dim": c.hidden, "hidden_elem_size": c.elem_size, "max_tok_per_expert": c.world * c.max_tokens}
        out.append(spec("convert_dispatch", "make_convert_dispatch_output",
                        {**conv, "block_num": db, "warp_num_per_block": dw}))
        out.append(spec("convert_combine", "make_convert_combine_input",
                        {**conv, "block_num": cb, "warp_num_per_block": cw}))
    return tuple(out)


def rank_kernels(c) -> tuple[RankKernels, ...]:
    """Every rank's kernels of the configuration ``c``."""
    return tuple(RankKernels(rank=r, launches=specs(c, r)) for r in range(c.world))


def build(spec: KernelSpec):
    import inspect

    p = spec.param_dict()
    for k, v in p["env"].items():
        os.environ[k] = v  # before mori's kernel module is first imported: it reads the wave size then
    from mori.ops.dispatch_combine_v2 import intranode_kernels as ik

    if ik.WAVE != int(p["env"]["MORI_WAVE_SIZE"]):
        raise RuntimeError(f"mori's EP kernels were imported with wave size {ik.WAVE} in this worker, the spec "
                           f"needs {p['env']['MORI_WAVE_SIZE']}: its MORI_WAVE_SIZE was read before the recipe set it")
    factory = getattr(ik, p["factory"])
    takes = set(inspect.signature(factory).parameters)
    kwargs = dict(p["kwargs"])
    for k in set(kwargs) - takes:
        if k not in DROPPED_LATER:
            raise RuntimeError(f"this mori's {p['factory']} takes no {k!r} (it takes {sorted(takes)}): "
                               f"update kernels/ep.py to its backend's call")
        del kwargs[k]
    return factory(**kwargs), (0,) * NARGS[p["factory"]]


def build_group(spec: KernelSpec) -> str | None:
    return None
