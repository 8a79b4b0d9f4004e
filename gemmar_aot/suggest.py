"""``gemmar-aot suggest``: miss reports from the pods -> the manifest lines that would have served them.

The pods append each distinct miss to a report (:mod:`gemmar_aot.runtime.misses`). This merges
any number of reports, groups the misses by tuple (transport, N, K, world, quant, wire, block_m,
SDMA queues and the window's m_max), leaves out the M values the manifest already builds (the
pod ran older artifacts: rebuild and redeploy), and writes the rest as ``[[tuple]]`` blocks in
the form the runtime's own miss error prints (:func:`gemmar_aot.runtime.manifest_lines.manifest_snippet`),
pinned to the pod's window so the new kernels share its layout. ``--write`` appends them to the
manifest after a comment naming the reports, so the file keeps its comments and layout; the
new text must parse as a manifest before it replaces the old (atomically).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Sequence

from gemmar_aot.artifact_model import TupleKey
from gemmar_aot.atomic_write import atomic_write_bytes
from gemmar_aot.errors import GemmarError

#: The tuple fields of a miss line, in the order a group is named by.
FIELDS = ("transport", "n", "k", "world", "quant", "gather_dtype", "gather_transport", "block_m", "sdma_queues",
          "m_max")


def _group(t: dict) -> tuple:
    t = dict(t)
    if t.get("gather_dtype") == "bf16":
        t["gather_transport"] = None  # only an fp8 gather has a transport (as the runtime indexes it)
    return tuple(t.get(f) for f in FIELDS)


def manifest_ms(manifest: Any) -> dict[tuple, set[int]]:
    """group -> padded M values the manifest builds (m_max resolved as the plan resolves it)."""
    widest: dict[tuple, int] = defaultdict(int)
    for w in manifest.workloads:
        if w.collective:
            base = _group({f: getattr(w, f) for f in FIELDS if f != "m_max"} | {"m_max": None})
            widest[base] = max(widest[base], w.m)
    out: dict[tuple, set[int]] = defaultdict(set)
    for w in manifest.workloads:
        if not w.collective:
            continue
        fields = {f: getattr(w, f) for f in FIELDS if f != "m_max"}
        m_max = w.m_max if w.m_max is not None else widest[_group(fields | {"m_max": None})]
        out[_group(fields | {"m_max": m_max})].add(w.m)
    return out


def suggest(lines: Sequence[dict], manifest: Any = None) -> dict:
    """The manifest lines for the misses ``lines`` (:func:`gemmar_aot.runtime.misses.read_reports`).
    Returns ``{"groups": [...], "snippet": TOML, "already_built": [...], "misses": N}``."""
    from gemmar_aot.runtime.manifest_lines import manifest_snippet

    wanted: dict[tuple, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for d in lines:
        t = d["tuple"]
        m = d.get("m") if d.get("m") is not None else t.get("m_max")
        if m is None or d.get("served") is not None:
            continue  # served by another bucket: a padding cost, not a miss
        wanted[_group(t)][int(m)] += 1
    have = manifest_ms(manifest) if manifest is not None else {}
    groups, blocks, already = [], [], []
    for g in sorted(wanted, key=lambda g: tuple(str(x) for x in g)):
        t = dict(zip(FIELDS, g))
        ms = wanted[g]
        built = sorted(m for m in ms if m in have.get(g, ()))
        new = sorted(m for m in ms if m not in have.get(g, ()))
        key = TupleKey.make(transport=t["transport"], n=t["n"], k=t["k"], world=t["world"], quant=t["quant"],
                            gather_dtype=t["gather_dtype"], gather_transport=t["gather_transport"] or "lsa",
                            block_m=t["block_m"], sdma_queues=t["sdma_queues"])
        if built:
            already.append({"tuple": t, "m": built})
        if new:
            blocks.append(manifest_snippet(key, new, t["m_max"]))
        groups.append({"tuple": t, "m": new, "reports": {str(m): ms[m] for m in sorted(ms)}, "already_built": built})
    return {"misses": sum(sum(v.values()) for v in wanted.values()), "groups": groups,
            "snippet": "\n\n".join(blocks), "already_built": already}


def write_into(manifest_path: str | os.PathLike, snippet: str, sources: Iterable[str]) -> Path:
    """Append ``snippet`` to the manifest at ``manifest_path`` after a comment naming ``sources``;
    the result must parse as a manifest (else GemmarError, nothing written)."""
    from gemmar_aot.manifest import parse_manifest

    path = Path(manifest_path)
    text = path.read_text(encoding="utf-8")
    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    names = ", ".join(sorted(set(sources)))
    new = (text.rstrip("\n") + "\n\n" + f"# Added by gemmar-aot suggest on {stamp}: M values the pods missed\n"
           f"# (reports: {names}).\n" + snippet.rstrip("\n") + "\n")
    try:
        parse_manifest(new, str(path))
    except GemmarError as exc:
        raise GemmarError(f"the suggested lines do not make a valid manifest of {path}; nothing was written:\n"
                          f"{exc}") from None
    atomic_write_bytes(path, new.encode("utf-8"))
    return path
