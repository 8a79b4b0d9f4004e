"""Which M values a server could request that the artifacts cannot serve.

A server pads every batch of ``t`` tokens to ``padded_m(t)``, so for a token
range the M values it can ask for are the multiples of ``world*block_m`` from
``padded_m(min)`` to ``padded_m(max)``. Each must be built for every rank (or for
the one rank asked about); whatever is not is listed, with the manifest lines
that would add it. M values above the window the artifacts were built for cannot
be added alone -- the window layout is compiled into every kernel -- so then the
lines rebuild every M for the larger window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gemmar_aot.model import rules
from gemmar_aot.model.types import FUSED_SDMA, TupleKey

from .artifacts import Artifacts, load_artifacts
from .artifact_errors import ArtifactError
from gemmar_aot.model.manifest_lines import manifest_snippet


@dataclass
class CoverageReport:
    key: TupleKey
    tokens: tuple[int, int]
    rank: int | None
    needed: list[int]
    present: list[int]
    missing: list[int]
    m_max: int | None  # the window the existing artifacts were built for (None: nothing built)
    beyond_window: list[int]  # missing M values above that window
    manifest_lines: str
    sources: list[str]

    @property
    def ok(self) -> bool:
        return not self.missing

    def to_json(self) -> dict[str, Any]:
        return {
            "tuple": {k: v for k, v in self.key._asdict().items()},
            "tokens": {"min": self.tokens[0], "max": self.tokens[1]},
            "rank": self.rank,
            "needed": self.needed,
            "present": self.present,
            "missing": self.missing,
            "m_max": self.m_max,
            "beyond_window": self.beyond_window,
            "manifest_lines": self.manifest_lines,
            "sources": self.sources,
            "ok": self.ok,
        }

    def format(self) -> str:
        k = self.key
        head = (f"{k.describe()}: tokens {self.tokens[0]}..{self.tokens[1]} pad to {len(self.needed)} M "
                f"values ({self.needed[0]}..{self.needed[-1]} step {k.world * k.block_m})"
                f"{'' if self.rank is None else f', rank {self.rank}'}")
        lines = [head, f"  built: {len(self.present)} M values"
                 + (f" (window m_max {self.m_max})" if self.m_max is not None else "")]
        if self.ok:
            lines.append("  every M the server can request is built")
            return "\n".join(lines)
        lines.append(f"  MISSING {len(self.missing)}: {_compact(self.missing)}")
        if self.beyond_window:
            lines.append(f"  {len(self.beyond_window)} of them exceed the window (m_max {self.m_max}); the "
                         f"window is compiled into every kernel, so every M must be rebuilt for the larger one")
        lines.append("  add to the manifest and rebuild:")
        lines += ["    " + ln for ln in self.manifest_lines.splitlines()]
        return "\n".join(lines)


def _compact(ms: list[int], limit: int = 24) -> str:
    s = ", ".join(map(str, ms[:limit]))
    return s + (f", ... ({len(ms) - limit} more)" if len(ms) > limit else "")


def coverage(artifacts: Any, *, tokens: tuple[int, int], world: int, n: int, k: int, quant: str = "blockscale",
             gather_dtype: str = "bf16", gather_transport: str = "lsa", block_m: int | None = None,
             sdma_queues: int = 1, rank: int | None = None, transport: str = FUSED_SDMA) -> CoverageReport:
    """The coverage of ``tokens`` (inclusive range) by the artifacts. Raises ValueError on bad arguments."""
    lo, hi = int(tokens[0]), int(tokens[1])
    if lo < 1 or hi < lo:
        raise ValueError(f"the token range must be 1 <= min <= max, got {lo}..{hi}")
    bm = rules.default_block_m(quant) if block_m is None else block_m
    if transport not in rules.COLLECTIVE_TRANSPORTS:
        raise ValueError(f"coverage is about the collective modes ({', '.join(rules.COLLECTIVE_TRANSPORTS)}), "
                         f"not {transport!r}")
    why = rules.check_gemm_ar(hi, n, k, world, block_m=bm, gather_dtype=gather_dtype,
                              gather_transport=gather_transport, quant=quant, sdma_queues=sdma_queues,
                              transport=transport)
    if why:
        raise ValueError(f"the op cannot serve {hi} tokens at N={n} K={k} world={world} {quant}: {why}")
    arts: Artifacts = load_artifacts(artifacts)
    key = TupleKey.make(transport=transport, n=n, k=k, world=world, quant=quant, gather_dtype=gather_dtype,
                        gather_transport=gather_transport, block_m=bm, sdma_queues=sdma_queues)
    g = world * bm
    needed = list(range(rules.padded_m(lo, world, bm), rules.padded_m(hi, world, bm) + 1, g))
    built = arts.m_values(key, rank=rank, world=world)
    present = [m for m in needed if m in set(built)]
    missing = [m for m in needed if m not in set(built)]
    m_maxes = sorted({e.layout.m_max for by_rank in arts.index.get(key, {}).values()
                      for e in by_rank.values() if e.layout is not None})
    if len(m_maxes) > 1:
        raise ArtifactError(f"the artifacts for {key.describe()} were built for several windows "
                            f"(m_max {m_maxes}); one op serves one window")
    m_max = m_maxes[0] if m_maxes else None
    beyond = [m for m in missing if m_max is not None and m > m_max]
    if not missing:
        lines = ""
    elif beyond or m_max is None:
        lines = manifest_snippet(key, sorted(set(built) | set(missing)), max(missing + list(built)))
    else:
        lines = manifest_snippet(key, missing, m_max)
    return CoverageReport(key=key, tokens=(lo, hi), rank=rank, needed=needed, present=present, missing=missing,
                          m_max=m_max, beyond_window=beyond, manifest_lines=lines,
                          sources=[str(s) for s in arts.sources])
