"""The ``[[tuple]]`` TOML that would build missing M values into the same window layout.

Used by the runtime's strict-miss error, by ``gemmar-aot coverage`` and by ``gemmar-aot
suggest``: shared, so the build side prints the very lines a pod's error names. The snippet pins
``m_max`` to the window the existing artifacts were built for, so the new
kernels share their layout (every offset, including each M's counter slot, is
compiled in); when an M exceeds that window the snippet says so, because then
every M has to be rebuilt for the larger window.
"""

from __future__ import annotations

from typing import Sequence

from gemmar_aot.model import rules
from gemmar_aot.model.types import TupleKey


def m_field(ms: Sequence[int]) -> str:
    """``m = ...`` in the shortest manifest form: one value, a range table, or a list."""
    ms = sorted(set(int(m) for m in ms))
    if len(ms) == 1:
        return f"m = {ms[0]}"
    step = ms[1] - ms[0]
    if len(ms) > 2 and all(b - a == step for a, b in zip(ms, ms[1:])):
        return f"m = {{ start = {ms[0]}, stop = {ms[-1]}, step = {step} }}"
    return "m = [" + ", ".join(str(m) for m in ms) + "]"


def manifest_snippet(key: TupleKey, ms: Sequence[int], m_max: int | None) -> str:
    """A ``[[tuple]]`` block building ``ms`` for ``key`` (one block per 1024 M values)."""
    ms = sorted(set(int(m) for m in ms))
    chunks = [ms[i:i + 1024] for i in range(0, len(ms), 1024)] or [[]]
    blocks = []
    for chunk in chunks:
        lines = ["[[tuple]]", f'transport = "{key.transport}"', m_field(chunk), f"n = {key.n}",
                 f"k = {key.k}", f"world = {key.world}", f'quant = "{key.quant}"']
        if key.transport not in rules.COLLECTIVE_TRANSPORTS:  # gemm-only, gemv: no window, no wire
            blocks.append("\n".join(lines))
            continue
        lines.append(f'gather_dtype = "{key.gather_dtype}"')
        if key.gather_transport is not None:
            lines.append(f'gather_transport = "{key.gather_transport}"')
        if key.block_m != rules.default_block_m(key.quant):
            lines.append(f"block_m = {key.block_m}")
        if key.sdma_queues != 1:
            lines.append(f"sdma_queues = {key.sdma_queues}")
        if m_max is not None:
            lines.append(f"m_max = {max([m_max] + chunk)}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def nearest(m: int, available: Sequence[int]) -> tuple[int, ...]:
    """The closest available M below and the closest above ``m`` (either may be absent)."""
    below = [x for x in available if x < m]
    above = [x for x in available if x > m]
    return tuple(([max(below)] if below else []) + ([min(above)] if above else []))
