"""Whether a GemmAllReduceOp could serve a call here, asked without building one: the shape rules
and the artifacts (:func:`supports`), and which collective modes run which wire
(:func:`transport_problem`), and the op's arguments checked in mori's order
(:func:`checked_arguments`)."""

from __future__ import annotations

from typing import Any

from gemmar_aot.model import rules
from gemmar_aot.model.types import FUSED_SDMA

from . import misses
from .artifacts import TupleKey, load_artifacts
from .artifact_errors import ArtifactError

#: The mode a GemmAllReduceOp serves unless told otherwise (mori's own op).
TRANSPORT = FUSED_SDMA


def padded_m(m: int, world_size: int, block_m: int = 128) -> int:
    """``m`` rounded up to a whole number of row bands per destination (mori's ``padded_m``)."""
    return rules.padded_m(m, world_size, block_m)


def supports(m: int, n: int, k: int, world_size: int, *, block_m: int | None = None,
             block_n: int = rules.DEFAULT_BLOCK_N, gather_dtype: str = "bf16", gather_transport: str = "lsa",
             quant: str = "blockscale", sdma_queues: int = 1, m_max: int | None = None,
             artifacts: Any = None, transport: str = TRANSPORT) -> bool:
    """Whether an op could serve M here: the shape rules hold AND the kernels for padded M exist.

    "Exist" means for every rank of the world, which is what the op itself requires
    (an M only some ranks can run would hang the others). ``m_max`` (optional) must
    also match the window the artifacts were built for. Never raises: no artifacts
    at all is False.
    """
    try:
        if rules.check_gemm_ar(m, n, k, world_size, block_m=block_m, block_n=block_n, gather_dtype=gather_dtype,
                               gather_transport=gather_transport, quant=quant, sdma_queues=sdma_queues,
                               m_max=m_max if m_max is not None else m) is not None:
            return False
        bm = rules.default_block_m(quant) if block_m is None else block_m
        if transport_problem(transport, gather_dtype, gather_transport, sdma_queues):
            return False
        arts = load_artifacts(artifacts)
        key = TupleKey.make(transport=transport, n=n, k=k, world=world_size, quant=quant,
                            gather_dtype=gather_dtype, gather_transport=gather_transport, block_m=bm,
                            sdma_queues=sdma_queues)
        pm = rules.padded_m(m, world_size, bm)
        if pm not in arts.m_values(key, world=world_size):
            return False
        if m_max is not None:
            want = rules.padded_m(m_max, world_size, bm)
            for r in range(world_size):
                e = arts.entry(key, pm, r)
                if e is None or e.layout is None or e.layout.m_max != want:
                    return False
        return True
    except (ArtifactError, ValueError, TypeError, OSError):
        return False


def transport_problem(transport: str, gather_dtype: str, gather_transport: str, sdma_queues: int) -> str | None:
    """Why a collective mode cannot run this wire (or these queues), or None."""
    if transport not in rules.COLLECTIVE_TRANSPORTS:
        return (f"transport={transport!r}: must be one of {', '.join(rules.COLLECTIVE_TRANSPORTS)} (gemm-only and "
                f"gemv are Mxfp8GemmOp and Mxfp8GemvOp)")
    wire = rules.wire_problem(transport, gather_dtype, gather_transport)
    if wire:
        return f"{wire[0]}={gather_dtype if wire[0] == 'gather_dtype' else gather_transport!r}: {wire[2]}"
    if transport not in rules.SDMA_TRANSPORTS and sdma_queues != 1:
        return f"sdma_queues={sdma_queues}: {transport} uses no SDMA queue; leave it at 1"
    return None


def checked_arguments(comm, *, n: int, k: int, m_max: int, block_m: int | None, block_n: int, sdma_queues: int,
                       gather_dtype: str, gather_transport: str, quant: str, max_shapes: int | None,
                       jit_fallback: bool, transport: str, on_miss: str | None) -> tuple[int, int, int, str]:
    """The op's arguments checked in mori's order: (block_m, padded m_max, max_shapes, miss policy),
    or ValueError naming the argument and the rule."""
    why = rules.check_quant(quant)
    if why:
        raise ValueError(f"quant={quant!r}: {why}")
    if block_m is None:
        block_m = rules.default_block_m(quant)
    for why in (rules.check_block_m_for_quant(quant, block_m), rules.check_gather_dtype(gather_dtype),
                rules.check_gather_transport(gather_transport), rules.check_block_n(block_n),
                rules.check_tile(block_m, block_n), transport_problem(transport, gather_dtype, gather_transport,
                                                                      sdma_queues)):
        if why:
            raise ValueError(why)
    on_miss = misses.policy(on_miss)
    if on_miss == "pad" and jit_fallback:
        raise ValueError("on_miss='pad' and jit_fallback=True both serve a missing M: choose one")
    if jit_fallback and transport != TRANSPORT:
        raise ValueError(f"jit_fallback=True needs mori's own op, which only runs {TRANSPORT}; "
                         f"transport {transport!r} has no mori class to fall back to")
    if m_max < 1 or sdma_queues < 1:
        raise ValueError(f"m_max and sdma_queues must both be >= 1; got m_max={m_max} sdma_queues={sdma_queues}")
    world = int(comm.nranks)
    why = rules.check_world(world)
    if why:
        raise ValueError(f"world_size={world}: {why}")
    m_max_pad = rules.padded_m(m_max, world, block_m)
    if max_shapes is None:
        max_shapes = rules.default_max_shapes(m_max_pad, world, block_m)
    if max_shapes < 1:
        raise ValueError(f"max_shapes must be >= 1; got {max_shapes}")
    why = rules.check_gemm_shape(n, k, block_n, quant) or rules.check_gemm_ar(
        m_max_pad, n, k, world, block_m=block_m, block_n=block_n, gather_dtype=gather_dtype,
        gather_transport=gather_transport, quant=quant, sdma_queues=sdma_queues, max_shapes=max_shapes)
    if why:
        raise ValueError(f"unsupported shape: {why}")
    return block_m, m_max_pad, max_shapes, on_miss
