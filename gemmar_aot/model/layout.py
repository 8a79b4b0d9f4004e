"""The symmetric window's layout the kernels were compiled for: :class:`WindowLayout`, and the
per-M values of a call, :class:`CallLayout` (``rules.window_layout`` returns one). Standard library only."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


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
    """Every offset of one op's symmetric window (``rules.window_layout``), in bytes.

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
