"""A manifest's ``[[hipcc]]`` entries checked: the kernels mori compiles with hipcc at first use.

One entry asks for every combination of its sources, archs and NIC variants::

    [[hipcc]]
    sources = ["ep_intranode", "ep_internode_v1"]   # mori's names (compile_genco), or "all"
    archs = ["gfx950"]                              # gfx950 (MI355X) | gfx942 (MI300X); default: [manifest] arch
    nics = ["mlx5"]                                 # mlx5 | bnxt | ionic | ionic-ccqe; default: ["mlx5"]
    host_proxy = false                              # mori's MORI_ENABLE_HOST_PROXY=1 build (-DMORI_PROXY_ENABLED)
    profiler = false                                # mori's ENABLE_PROFILER build: not built here (yet)

Each combination is one code object (``gemmar_aot.model.hipcc.HipccVariant``). Every problem
names the file, the entry and its line, the field, the value, mori's own list and a fix, like a
``[[tuple]]``'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gemmar_aot.builder.manifest_check import Checker, open_entry, type_name
from gemmar_aot.model.hipcc import ARCH_GPUS, ARCHS, NICS, SOURCES, HipccVariant

#: Every key an entry may have: (required, an example).
HIPCC_KEYS: dict[str, tuple[bool, str]] = {
    "sources": (True, 'sources = ["ep_intranode"]'),
    "archs": (False, 'archs = ["gfx950"]'),
    "nics": (False, 'nics = ["mlx5"]'),
    "host_proxy": (False, "host_proxy = false"),
    "profiler": (False, "profiler = false"),
}
_HEADER_RE = re.compile(r"""^[ \t]*\[\[[ \t]*(?:hipcc|"hipcc"|'hipcc')[ \t]*\]\]""")
#: Why an arch mori knows is not built, and what to do.
UNREACHABLE_ARCHS = {"gfx1250": "mori's gfx1250 kernels include amd_gfx1250_TDM.h, which no package this build "
                                "installs carries; let mori compile them on the node"}
PROFILER_FIX = ("mori's profiler build generates its binding headers at compile time, which this build does not "
                "do yet; build without it (profiler = false), or let mori JIT the profiler build in the pod")


@dataclass(frozen=True)
class HipccEntry:
    """A checked ``[[hipcc]]``: the code objects it asks for and where it was written."""

    variants: tuple[HipccVariant, ...]
    source: str  # "path:hipcc[i] (line L)"


def entry_lines(ck: Checker, count: int) -> list[int | None]:
    heads = [i + 1 for i, line in enumerate(ck.text.splitlines()) if _HEADER_RE.match(line)]
    return heads if len(heads) == count else [None] * count


def _names(ck: Checker, entry: str, field: str, raw: Any, known, what: str, extra=None) -> list[str] | None:
    """A list of names from ``known`` (``"all"`` for every one), or None after reporting."""
    if raw == "all":
        return list(known)
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        ck.bad(entry, field, raw, f"must be a non-empty list of {what}" if isinstance(raw, list)
               else f"must be a list of {what}, not {type_name(raw)}", f'write e.g. {HIPCC_KEYS[field][1]}')
        return None
    out, bad = [], 0
    for v in raw:
        if isinstance(v, str) and v in known:
            if v not in out:
                out.append(v)
            continue
        bad += 1
        why = (extra or {}).get(v) if isinstance(v, str) else None
        ck.bad(entry, field, v, why or f"{what} are {', '.join(known)}",
               f"pick from {', '.join(known)}" + ("" if field != "sources" else ' (or write sources = "all")'))
    return None if bad else out


def check_hipcc(ck: Checker, i: int, raw: Any, line: int | None, default_arch: str) -> HipccEntry | None:
    """The entry ``raw`` (the i-th ``[[hipcc]]``) checked; None after reporting its problems."""
    before = len(ck.problems)
    entry = open_entry(ck, "hipcc", i, raw, line, HIPCC_KEYS)
    if entry is None:
        return None
    if "sources" not in raw:
        ck.problem(entry, f"missing sources; add e.g. {HIPCC_KEYS['sources'][1]} (mori's are {', '.join(SOURCES)})")
        return None
    sources = _names(ck, entry, "sources", raw["sources"], tuple(SOURCES), "mori's hipcc-JIT sources")
    archs = _names(ck, entry, "archs", raw.get("archs", [default_arch]), ARCHS,
                   "the archs built here (" + ", ".join(f"{a}: {g}" for a, g in ARCH_GPUS.items()) + ")",
                   UNREACHABLE_ARCHS)
    nics = _names(ck, entry, "nics", raw.get("nics", ["mlx5"]), tuple(NICS), "mori's NIC variants")
    flags = {}
    for key in ("host_proxy", "profiler"):
        v = raw.get(key, False)
        if not isinstance(v, bool):
            ck.bad(entry, key, v, f"{key} must be true or false", f"write {key} = false")
        flags[key] = v
    if flags["profiler"] is True:
        ck.bad(entry, "profiler", True, "not built here", PROFILER_FIX)
    if len(ck.problems) > before or not (sources and archs and nics):
        return None
    variants = tuple(HipccVariant(s, a, n, flags["host_proxy"]) for s in sources for a in archs for n in nics)
    return HipccEntry(variants, f"{ck.path}:{entry}")
