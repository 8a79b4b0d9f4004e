"""The symmetric window's layout the kernels were compiled for: :class:`WindowLayout`, the per-M
values of a call, :class:`CallLayout`, and :func:`window_layout`, which computes both from the
op's rules (:mod:`gemmar_aot.model.rules`). Because every offset is a constant inside the code objects,
the runtime has to reproduce them exactly: a window one byte different is a different (wrong)
layout. Standard library only."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache

from gemmar_aot.model import rules
from gemmar_aot.model.rules import (BF16_BYTES, GATHER_BANDS, K_MAX_BLOCKS, LSA_BLOCK_CAP, MAX_CHUNKS, MAX_WORLD,
                              PACK_BYTES, SDMA_REDUCE_BLOCK_CAP, THREADS, align_up)


# ---------------------------------------------------------------------------
# Window layout
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CallLayout:
    """The window values that depend on the padded M being served (one op call)."""

    m: int
    slot: int  # counter set (rules.counter_slot)
    counter_off: int
    gather_counter_off: int
    counter_chunks: int
    slice_rows: int
    num_packs: int
    packs_per_rank: int
    largest_pack_part: int
    slice_bytes: int
    chunk_bytes: int
    gather_slice_bytes: int
    gather_scale_slice_bytes: int
    reduce_blocks: int
    lsa_stage: int
    lsa_blocks: int

    def to_json(self) -> dict:
        return {f: getattr(self, f) for f in _CALL_FIELDS}


@dataclass(frozen=True)
class WindowLayout:
    """Every offset of one op's symmetric window (``window_layout``), in bytes.

    The window is ``[control | input | output | (gout | gout scales) | tmp | recv]``. All
    fields but ``call`` are the same for every M the window serves; ``call`` holds the
    values of one padded M (None for the map alone).
    """

    # configuration
    world: int
    n: int
    m_max: int
    block_m: int
    gather_dtype: str
    gather_transport: str
    max_shapes: int
    counter_capacity: int
    recv_slots: int
    gather_bands: int
    # control area
    start_off: int
    end_off: int
    flag_off: int
    counter_region_off: int
    counter_set_bytes: int
    counter_bytes: int
    lock_off: int
    lock_bytes: int
    gather_counter_region_off: int
    gather_counter_set_bytes: int
    gather_counter_bytes: int
    signal_bytes: int
    # payload
    input_off: int
    output_off: int
    output_end: int
    gout_off: int
    gout_scale_off: int
    tmp_off: int
    tmp_bytes: int
    recv_off: int
    recv_slot_bytes: int
    recv_slot_offs: tuple[int, ...]  # one per landing slot
    gout_scale_slice_offs: tuple[int, ...]  # one per peer
    window_bytes: int
    call: CallLayout | None = None

    def shared(self) -> "WindowLayout":
        """The map without the per-M values: equal for every M one window serves."""
        return self if self.call is None else replace(self, call=None)

    def flat(self) -> dict:
        """Every field by name in one dict (the per-M values included when present)."""
        out = {f: getattr(self, f) for f in _WINDOW_FIELDS}
        if self.call is not None:
            out.update(self.call.to_json())
        return out

    def to_json(self) -> dict:
        out = {f: getattr(self, f) for f in _WINDOW_FIELDS}
        out["recv_slot_offs"] = list(self.recv_slot_offs)
        out["gout_scale_slice_offs"] = list(self.gout_scale_slice_offs)
        out["call"] = None if self.call is None else self.call.to_json()
        return out


_CALL_FIELDS = tuple(f.name for f in fields(CallLayout))
_WINDOW_FIELDS = tuple(f.name for f in fields(WindowLayout) if f.name != "call")
_WINDOW_STR_FIELDS = ("gather_dtype", "gather_transport")
_WINDOW_TUPLE_FIELDS = ("recv_slot_offs", "gout_scale_slice_offs")


# ---------------------------------------------------------------------------
# Computing it (mori 1.2.4's GemmAllReduceOp window, as plain arithmetic)
# ---------------------------------------------------------------------------


def _payload_packs(m: int, n: int) -> int:
    return m * n * BF16_BYTES // PACK_BYTES


def _check_window(world: int, n: int, m_max_pad: int, block_m: int, gather_dtype: str, gather_transport: str,
                  max_shapes: int | None, recv_slots: int | None) -> tuple[int, int]:
    """(max_shapes, recv_slots) resolved, after the op's checks of a window; raises ValueError."""
    why = (
        rules.check_world(world)
        or rules.check_gather_dtype(gather_dtype)
        or rules.check_gather_transport(gather_transport)
        or (None if block_m >= 1 else "block_m must be >= 1")
        or (None if n >= 1 else "n must be >= 1")
        or (None if m_max_pad >= 1 else "m_max_pad must be >= 1")
        or rules.check_fp8_gather_n(n, gather_dtype)
    )
    if why:
        raise ValueError(why)
    if m_max_pad % (world * block_m):
        raise ValueError(f"m_max_pad={m_max_pad} is not a multiple of world*block_m = {world * block_m}")
    if max_shapes is None:
        max_shapes = rules.default_max_shapes(m_max_pad, world, block_m)
    if max_shapes < 1:
        raise ValueError("max_shapes must be >= 1")
    if recv_slots is None:
        recv_slots = world
    if not 0 <= recv_slots <= world:
        raise ValueError(f"recv_slots must be in [0, {world}]")
    why = rules.check_payload(m_max_pad, n, world)
    if why:
        raise ValueError(why)
    return max_shapes, recv_slots


def _control_area(world: int, max_shapes: int) -> dict:
    """The offsets of the window's control area (barriers, counters, locks): independent of M."""
    end_off = align_up(K_MAX_BLOCKS * MAX_WORLD * 4)
    flag_off = 2 * end_off
    counter_region_off = align_up(flag_off + K_MAX_BLOCKS * 4)
    counter_set_bytes = world * MAX_CHUNKS * 4
    counter_bytes = align_up(counter_set_bytes * max_shapes)
    lock_off = counter_region_off + counter_bytes
    lock_bytes = align_up(world * 4)
    gather_counter_region_off = lock_off + lock_bytes
    gather_counter_set_bytes = GATHER_BANDS * 4
    gather_counter_bytes = align_up(gather_counter_set_bytes * max_shapes)
    return {"start_off": 0, "end_off": end_off, "flag_off": flag_off, "counter_region_off": counter_region_off,
            "counter_set_bytes": counter_set_bytes, "counter_bytes": counter_bytes, "lock_off": lock_off,
            "lock_bytes": lock_bytes, "gather_counter_region_off": gather_counter_region_off,
            "gather_counter_set_bytes": gather_counter_set_bytes, "gather_counter_bytes": gather_counter_bytes,
            "signal_bytes": gather_counter_region_off + gather_counter_bytes}


def _payload_area(world: int, n: int, cm: int, fp8: bool, recv_slots: int, signal_bytes: int) -> dict:
    """The payload's offsets, laid out for the capacity M ``cm`` so every M shares one map."""
    input_off = align_up(signal_bytes)
    payload = cm * n * BF16_BYTES
    # The scatter leg is always bf16 in this op, so its scale region is empty and output follows input.
    output_off = align_up(input_off + payload)
    output_end = align_up(output_off + payload)
    if fp8:
        gout_off, gout_bytes = output_end, cm * n  # one byte per element
        gather_scale_bytes = align_up(cm * 4)  # one fp32 scale per row
    else:
        gout_off, gout_bytes, gather_scale_bytes = output_off, 0, 0  # the bf16 gather pushes out of output
    gout_scale_off = align_up(gout_off + gout_bytes)
    tmp_off = max(output_end, gout_scale_off + gather_scale_bytes)
    cap_packs = _payload_packs(cm, n)
    tmp_bytes = (cap_packs // world + cap_packs % world) * PACK_BYTES
    recv_off = tmp_off + tmp_bytes
    cap_slice_rows = cm // world
    recv_slot_bytes = cap_slice_rows * n * BF16_BYTES
    return {"input_off": input_off, "output_off": output_off, "output_end": output_end, "gout_off": gout_off,
            "gout_scale_off": gout_scale_off, "tmp_off": tmp_off, "tmp_bytes": tmp_bytes, "recv_off": recv_off,
            "recv_slot_bytes": recv_slot_bytes,
            "recv_slot_offs": tuple(recv_off + p * recv_slot_bytes for p in range(recv_slots)),
            "gout_scale_slice_offs": tuple(gout_scale_off + p * cap_slice_rows * 4 for p in range(world)),
            # No scatter-leg scales on a bf16 scatter, so nothing follows the slots.
            "window_bytes": align_up(recv_off + recv_slots * recv_slot_bytes)}


@lru_cache(maxsize=256)
def _shared_window_layout(world: int, n: int, m_max_pad: int, block_m: int, gather_dtype: str,
                          gather_transport: str, max_shapes: int | None, recv_slots: int | None) -> WindowLayout:
    """:func:`window_layout` without ``m_pad``: what every M of one window shares. Cached (the
    values are immutable): a rank checks the layout of each M it serves against it."""
    max_shapes, recv_slots = _check_window(world, n, m_max_pad, block_m, gather_dtype, gather_transport, max_shapes,
                                           recv_slots)
    control = _control_area(world, max_shapes)
    payload = _payload_area(world, n, m_max_pad, gather_dtype == "fp8", recv_slots, control["signal_bytes"])
    return WindowLayout(world=world, n=n, m_max=m_max_pad, block_m=block_m, gather_dtype=gather_dtype,
                        gather_transport=gather_transport, max_shapes=max_shapes, counter_capacity=MAX_CHUNKS,
                        recv_slots=recv_slots, gather_bands=GATHER_BANDS, **control, **payload)


def window_layout(world: int, n: int, m_max_pad: int, block_m: int = 128, gather_dtype: str = "bf16",
                  gather_transport: str = "lsa", max_shapes: int | None = None, m_pad: int | None = None, *,
                  recv_slots: int | None = None) -> WindowLayout:
    """Every window offset the kernels compile in, for one op instance.

    Reproduces the layout ``GemmAllReduceOp`` builds: ``recv_slots = world``, counter region
    sized for ``rules.MAX_CHUNKS`` chunks times ``max_shapes`` sets (default
    ``rules.default_max_shapes``), and every payload offset taken from the capacity
    ``m_max_pad`` so it is the same for every M.

    The window is ``[control | input | output | (gout | gout scales) | tmp | recv]``; the returned
    :class:`WindowLayout` documents its fields. With ``m_pad`` (a padded M this instance serves)
    its ``call`` holds that M's values (:class:`CallLayout`). ``recv_slots`` (keyword only)
    overrides the landing-slot count; the op always uses ``world``; an LSA-only all-reduce needs
    none. Raises ValueError on arguments the op would reject.
    """
    out = _shared_window_layout(world, n, m_max_pad, block_m, gather_dtype, gather_transport, max_shapes,
                                recv_slots)
    if m_pad is None:
        return out
    return replace(out, call=_call_layout(out, world, n, m_max_pad, block_m, gather_dtype == "fp8", m_pad))


def _call_layout(out: WindowLayout, world: int, n: int, m_max_pad: int, block_m: int, fp8: bool,
                 m_pad: int) -> CallLayout:
    """The values of one padded M served from the window ``out``; raises ValueError."""
    if not 1 <= m_pad <= m_max_pad:
        raise ValueError(f"m_pad={m_pad} must be in [1, m_max_pad={m_max_pad}]")
    slot = rules.counter_slot(m_pad, world, block_m)  # also checks the granule
    if slot >= out.max_shapes:
        raise ValueError(f"m_pad={m_pad} needs counter set {slot} but the window has only {out.max_shapes}")
    chunks = rules.counter_chunks(m_pad, world, block_m)
    packs = _payload_packs(m_pad, n)
    packs_per_rank = packs // world
    slice_bytes = packs_per_rank * PACK_BYTES
    slice_rows = m_pad // world
    stage = rules.lsa_stage(world, m_pad * n * BF16_BYTES)
    lsa_cover = packs if stage == 1 else packs_per_rank
    return CallLayout(
        m=m_pad, slot=slot, counter_off=out.counter_region_off + slot * out.counter_set_bytes,
        gather_counter_off=out.gather_counter_region_off + slot * out.gather_counter_set_bytes,
        counter_chunks=chunks, slice_rows=slice_rows, num_packs=packs, packs_per_rank=packs_per_rank,
        largest_pack_part=packs_per_rank + packs % world, slice_bytes=slice_bytes,
        chunk_bytes=slice_bytes // chunks, gather_slice_bytes=slice_rows * n * (1 if fp8 else BF16_BYTES),
        gather_scale_slice_bytes=slice_rows * 4 if fp8 else 0,
        reduce_blocks=max(1, min(SDMA_REDUCE_BLOCK_CAP, -(-packs_per_rank // THREADS))), lsa_stage=stage,
        lsa_blocks=max(1, min(LSA_BLOCK_CAP, -(-lsa_cover // THREADS))))
