"""The symmetric window a collective op owns: its size, and the check that one layout serves every M.

Every kernel has the window's offsets compiled in, so the runtime recomputes the layout
(:func:`gemmar_aot.model.layout.window_layout`) and refuses artifacts whose recorded layout is any
other: a window one byte different is a different, wrong, layout.
"""

from __future__ import annotations

from typing import Any, Mapping

from gemmar_aot.model.layout import window_layout
from gemmar_aot.model import rules

from .artifact_errors import ArtifactMismatchError


def window_bytes_for(world_size: int, *, m_max: int, n: int, block_m: int = 128, gather_dtype: str = "bf16",
                     gather_transport: str = "lsa", max_shapes: int | None = None) -> int:
    """Symmetric-window bytes an op for this shape allocates (size the communicator's VMM with it).

    Like mori's, this has no ``quant``: for mxfp8 pass ``block_m=256``.
    """
    m_pad = rules.padded_m(m_max, world_size, block_m)
    return window_layout(world_size, n, m_pad, block_m, gather_dtype, gather_transport,
                               max_shapes or rules.default_max_shapes(m_pad, world_size, block_m)).window_bytes


def differing_fields(a: dict, b: dict) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def check_layouts(entries: Mapping[int, Any], *, world: int, n: int, m_max: int, block_m: int, block_n: int,
                  gather_dtype: str, max_shapes: int) -> int:
    """Every M of ``entries`` (padded M -> RankEntry) must share one window layout, the one
    recomputed here for the op's shape. Returns the window's bytes; raises ArtifactMismatchError."""
    first: Any = None
    for m, e in sorted(entries.items()):
        lay = e.layout
        if lay is None or lay.call is None:
            raise ArtifactMismatchError(f"{e.where}: M={m} has no window layout in the lock; rebuild it")
        if lay.m_max != m_max:
            raise ArtifactMismatchError(
                f"the artifacts were built for m_max {lay.m_max} (window of {lay.window_bytes} bytes, "
                f"{e.where}), but this op pads m_max to {m_max}: the window layout is compiled into "
                f"every kernel. Construct the op with m_max={lay.m_max}, or rebuild the manifest with "
                f"m_max = {m_max}")
        if lay.max_shapes != max_shapes:
            raise ArtifactMismatchError(
                f"the artifacts were built with max_shapes {lay.max_shapes} ({e.where}), this op "
                f"asks for {max_shapes}; pass max_shapes={lay.max_shapes} (or leave it unset)")
        if e.tuple.id.block_n != block_n:
            raise ArtifactMismatchError(f"{e.where}: built with block_n {e.tuple.id.block_n}")
        if first is None:
            first = e
        want = window_layout(world, n, m_max, block_m, gather_dtype, e.tuple.id.gather_transport,
                                   max_shapes, m_pad=m)
        # Every M's recomputed layout shares the first's window (only m_pad differs), so a layout
        # equal to its own is one the first's shares; one that is not is first compared with the
        # first M's, whose window it must share (only the per-M values, lay.call, may differ).
        if lay != want and first is not e:
            diff = differing_fields(first.layout.shared().flat(), lay.shared().flat())
            if diff:
                raise ArtifactMismatchError(
                    f"the artifacts' window layouts differ between M={first.m} ({first.where}) and "
                    f"M={m} ({e.where}) in {diff}: one window cannot serve both. Rebuild them together "
                    f"from one manifest")
        if lay != want:
            raise ArtifactMismatchError(
                f"{e.where}: the recorded window layout for M={m} is not the one this runtime computes "
                f"(differs in {differing_fields(want.flat(), lay.flat())}); the kernels would address the "
                f"wrong bytes. Rebuild with this gemmar-aot version")
    return first.layout.window_bytes
