"""The kernel sequence each mode launches: what a call runs and what its self-test runs, by kind.

Each mode fixes its sequence (the PR's kernels and mori's op, read in ``kernels/``): the
recipes build exactly these kinds in this order (``kernels/sdma_phases.tail`` reads the
tail from here; ``tests/test_plan.py`` compares every planned tuple with it), and the
runtime refuses a lock whose launches or self-test for a tuple and rank are another
sequence -- reordered, dropped or duplicated launches would otherwise run. A lock is
checked against this table, never against itself.

Standard library only: the runtime imports it.
"""

from __future__ import annotations

import re


def tail(gather_dtype: str, gather_transport: str) -> tuple[str, ...]:
    """The SDMA all-reduce after its scatter (or the fused GEMM's drain), by wire:
    ``build_sdma_phases(...)["order"][1:]`` in mori 1.2.4."""
    if gather_dtype == "fp8":
        if gather_transport == "lsa":
            return ("reduce", "quantize", "gather_barrier", "pull")
        return ("reduce", "quantize", "gather", "dequantize")
    return ("reduce", "gather")


def expected(transport: str, gather_dtype: str, gather_transport: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the kinds a call launches, the kinds its self-test launches), in order."""
    t = tail(gather_dtype, gather_transport)
    if transport in ("fused-sdma", "fused-lsa"):
        return ("gemm", "drain") + t, ("scatter",) + t
    if transport == "split-sdma":
        return ("gemm", "scatter") + t, ("scatter",) + t
    if transport == "split-lsa":
        return ("gemm", "lsa_ar"), ("lsa_ar",)
    if transport == "gemm-only":
        return ("gemm",), ()
    if transport == "gemv":
        return ("gemv",), ()
    raise ValueError(f"no launch sequence for transport {transport!r}")


_RANK_SUFFIX = re.compile(r"_r(\d+)$")


def symbol_rank(symbol: str) -> int | None:
    """The rank a kernel's symbol names (mori names a rank's GEMM ``..._r<rank>``), else None."""
    m = _RANK_SUFFIX.search(symbol)
    return int(m.group(1)) if m else None


def sequence_problems(transport: str, gather_dtype: str, gather_transport: str, rank: int,
                      launches, self_test) -> list[str]:
    """What is wrong with one rank's launch entries (objects with ``kind`` and ``launch.kernel``)
    for one tuple; empty when they are the mode's sequence and every rank-named kernel is this rank's."""
    want_launches, want_self_test = expected(transport, gather_dtype, gather_transport)
    out = []
    got = tuple(e.kind for e in launches)
    if got != want_launches:
        out.append(f"launches {list(got)}, where {transport} with a {gather_dtype} wire launches "
                   f"{list(want_launches)}")
    got = tuple(e.kind for e in self_test)
    if got != want_self_test:
        out.append(f"self-tests with {list(got)}, where {transport} with a {gather_dtype} wire self-tests "
                   f"with {list(want_self_test)}")
    for e in (*launches, *self_test):
        r = symbol_rank(e.launch.kernel)
        if r is not None and r != rank:
            out.append(f"its {e.kind} is {e.launch.kernel}, rank {r}'s kernel, in rank {rank}'s slot")
    return out
