"""The SDMA all-reduce's phase kernels: ``build_sdma_phases`` (mori 1.2.4 kernels_sdma.py).

One recipe for every mode whose tail runs them, so the plan builds a phase once
however many modes need it:

    fused-sdma  drain -> tail          (self-test: scatter -> tail)
    split-sdma  scatter -> tail        (self-test: the same)
    fused-lsa   drain -> tail, with ``reduce_self_from_recv`` (self-test: scatter -> tail)

    tail: bf16 wire        reduce -> gather
          fp8 wire, lsa    reduce -> quantize -> gather_barrier -> pull
          fp8 wire, sdma   reduce -> quantize -> gather -> dequantize

Dedup: drain and gather_barrier are ``_push_kernel`` over the control area's
constant offsets only, so their spec carries (world, rank, queues) and they are
built against one canonical config; every other kernel carries the tuple's full
config. ``reduce_self_from_recv`` changes only the reduce kernels (the Direct-LSA
GEMM leaves a rank's own slice in its recv slot), so only fused-lsa's reduce spec
carries it, together with ``recv_uncached``: in Direct LSA the peers' CUs store into a
rank's recv slot over xGMI, which never invalidates its L2, so the reduce must load recv
with SC1 (mori's benchmark builds fused-lsa's phases with ``recv_uncached=True``; the
parity tier found the difference). ``tests/test_compile.py`` checks the canonical drain
against the op's own.
"""

from __future__ import annotations

from gemmar_aot.model.spec import KernelSpec

from ._common import PHASE_FIXED, build_phase, op_cfg, phase_build_group

RECIPE = "sdma-phases"
#: Phases whose code reads only the control area (start/end/flag offsets, which
#: no shape changes), the world, the rank and the queue count.
CONTROL_ONLY_PHASES = ("drain", "gather_barrier")
#: Phases whose code reads ``reduce_self_from_recv``.
REDUCE_PHASES = ("reduce", "reduce_quant", "reduce_push")


def tail(gather_dtype: str, gather_transport: str) -> tuple[str, ...]:
    """What follows the scatter (or drain): ``build_sdma_phases(...)["order"][1:]``, from the one
    table the runtime checks locks against (imported here, by the plan half only)."""
    from gemmar_aot.model.launch_sequence import tail

    return tail(gather_dtype, gather_transport)


def _canonical_control_cfg(world: int) -> dict:
    # fp8 + lsa so that both control-only phases exist in the builder's table.
    return op_cfg(world=world, m_pad=world * 128, n=1024, block_m=128, gather_dtype="fp8",
                  gather_transport="lsa", shape_slots=1, shape_index=0, capacity_m=0)


def tuple_cfg(w, layout) -> dict:
    """The op's ArConfig for one tuple at its M, in its group's window."""
    return op_cfg(world=w.world, m_pad=w.m, n=w.n, block_m=w.block_m, gather_dtype=w.gather_dtype,
                  gather_transport=w.gather_transport, shape_slots=layout.max_shapes,
                  shape_index=layout.slot, capacity_m=layout.m_max)


def phase_spec(w, rank: int, phase: str, cfg: dict, env: dict, *, reduce_self_from_recv: bool = False,
               recv_uncached: bool = False) -> KernelSpec:
    builder = {"queues": w.sdma_queues, **PHASE_FIXED}
    if phase in REDUCE_PHASES:
        builder["reduce_self_from_recv"] = reduce_self_from_recv
        builder["recv_uncached"] = recv_uncached
    if phase in CONTROL_ONLY_PHASES:
        cfg = _canonical_control_cfg(w.world)
    params = {"cfg": cfg, "builder": builder, "phase": phase}
    if phase == "pull":
        params["env"] = {"MORI_GEMM_AR_PULL_BLOCKS": env.get("MORI_GEMM_AR_PULL_BLOCKS")}
    return KernelSpec.make(RECIPE, phase, rank, params)


def sequence(w, rank: int, phases, cfg: dict, env: dict, **kw) -> tuple[KernelSpec, ...]:
    return tuple(phase_spec(w, rank, ph, cfg, env, **kw) for ph in phases)


def self_test(w, rank: int, cfg: dict, env: dict) -> tuple[KernelSpec, ...]:
    """What ``self_test`` runs: mori's split order, scatter -> tail, with the op's phase options."""
    return sequence(w, rank, ("scatter",) + tail(w.gather_dtype, w.gather_transport), cfg, env)


def build(spec: KernelSpec):
    return build_phase(spec)


def build_group(spec: KernelSpec) -> str | None:
    return phase_build_group(spec)
