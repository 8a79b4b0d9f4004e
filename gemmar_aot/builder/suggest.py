"""``gemmar-aot suggest``: miss reports from the pods -> the manifest lines that would have served them.

The pods append each distinct miss to a report (:mod:`gemmar_aot.runtime.misses`). This merges
any number of reports, groups the misses by tuple (transport, N, K, world, quant, wire, block_m,
SDMA queues and the window's m_max), leaves out the M values the manifest already builds (the
pod ran older artifacts: rebuild and redeploy), and writes the rest as ``[[tuple]]`` blocks in
the form the runtime's own miss error prints (:func:`gemmar_aot.model.manifest_lines.manifest_snippet`),
pinned to the pod's window so the new kernels share its layout. An EP op's misses become
``[[ep]]`` entries (:func:`gemmar_aot.model.ep.manifest_entry`, the block its error prints), one per
configuration, with the capacity raised to the largest dispatch it refused. ``--write`` appends them to the
manifest after a comment naming the reports, so the file keeps its comments and layout; the
new text must parse as a manifest before it replaces the old (atomically).
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Sequence

from gemmar_aot.model.types import TupleKey
from gemmar_aot.util.atomic_write import atomic_write_bytes
from gemmar_aot.util.errors import GemmarError

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
    from gemmar_aot.model.manifest_lines import manifest_snippet

    wanted: dict[tuple, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    ep = _ep_suggestions([d for d in lines if isinstance(d.get("ep"), dict)], manifest)
    hip = _hipcc_suggestions([d for d in lines if isinstance(d.get("hipcc"), dict)], manifest)
    jit = _jitv2_suggestions([d for d in lines if isinstance(d.get("jitv2"), dict)])
    for k in ep:
        ep[k] += hip[k] + jit[k]
    lines = [d for d in lines if isinstance(d.get("tuple"), dict)]
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
    return {"misses": sum(sum(v.values()) for v in wanted.values()) + ep["misses"], "groups": groups + ep["groups"],
            "snippet": "\n\n".join(blocks + ep["blocks"]), "already_built": already + ep["already_built"]}


def _ep_suggestions(lines: Sequence[dict], manifest: Any) -> dict:
    """The ``[[ep]]`` entries for the EP ops' misses: one per configuration, its capacity raised to
    the largest dispatch that found it too small; those the manifest builds already, apart."""
    from gemmar_aot.model.ep import SERVED_FIELDS, EpConfig, manifest_entry, served_key

    wanted: dict[tuple, list] = defaultdict(list)
    for d in lines:
        if d.get("served") is None:
            wanted[tuple(d["ep"].get(f) for f in SERVED_FIELDS)].append(d.get("m"))
    have = {served_key(e.config) for e in getattr(manifest, "eps", ())}
    out: dict = {"misses": 0, "groups": [], "blocks": [], "already_built": []}
    for key in sorted(wanted, key=lambda k: tuple(str(x) for x in k)):
        fields = dict(zip(SERVED_FIELDS, key))
        tokens = [int(m) for m in wanted[key] if m is not None]
        try:
            c = EpConfig(**{**fields, "max_tokens": max([int(fields["max_tokens"]), *tokens])})
        except (TypeError, ValueError):
            continue  # a line of another schema's fields: read_reports' caller shows the count
        out["misses"] += len(wanted[key])
        built = served_key(c) in have
        group = {"ep": c.to_json(), "reports": len(wanted[key]), "tokens": sorted(set(tokens)), "already_built": built}
        out["groups"].append(group)
        (out["already_built"] if built else out["blocks"]).append(group if built else manifest_entry(c))
    return out


def _hipcc_suggestions(lines: Sequence[dict], manifest: Any) -> dict:
    """The ``[[hipcc]]`` entries for the code objects mori asked for and the artifacts lacked: one per
    (arch, NIC variant, host proxy), naming its sources; those the manifest builds already, apart."""
    from gemmar_aot.model.hipcc import ARCHS, NICS, SOURCES, HipccVariant

    wanted: dict[HipccVariant, int] = defaultdict(int)
    for d in lines:
        h = d["hipcc"]
        v = HipccVariant(h.get("source"), h.get("arch"), h.get("nic"), bool(h.get("host_proxy")))
        if v.source in SOURCES and v.arch in ARCHS and v.nic in NICS:
            wanted[v] += 1
    have = {v for e in getattr(manifest, "hipcc", ()) for v in e.variants}
    out: dict = {"misses": sum(wanted.values()), "groups": [], "blocks": [], "already_built": []}
    by_group: dict[tuple, list[str]] = defaultdict(list)
    for v in sorted(wanted):
        group = {"hipcc": v.to_json(), "reports": wanted[v], "already_built": v in have}
        out["groups"].append(group)
        if v in have:
            out["already_built"].append(group)
        else:
            by_group[(v.arch, v.nic, v.host_proxy)].append(v.source)
    for (arch, nic, proxy), sources in sorted(by_group.items()):
        out["blocks"].append(f"[[hipcc]]\nsources = {json.dumps(sources)}\narchs = {json.dumps([arch])}\n"
                             f"nics = {json.dumps([nic])}\n" + ("host_proxy = true\n" if proxy else ""))
    return out


def _jitv2_suggestions(lines: Sequence[dict]) -> dict:
    """The HIP-backend ``[[ep]]`` entries for mori's JIT v2 plans the artifacts lacked: each entry the
    pod wrote for the config it constructed, once (a plan made outside mori's EP op has none)."""
    blocks: dict[str, int] = defaultdict(int)
    unnamed = 0
    for d in lines:
        snippet = d["jitv2"].get("manifest_lines")
        if isinstance(snippet, str) and snippet.startswith("[[ep]]"):
            blocks[snippet] += 1
        else:
            unnamed += 1
    groups = [{"jitv2": {"manifest_lines": b}, "reports": n, "already_built": False} for b, n in sorted(blocks.items())]
    groups += [{"jitv2": {"manifest_lines": None}, "reports": unnamed, "already_built": False}] if unnamed else []
    return {"misses": sum(blocks.values()) + unnamed, "groups": groups, "blocks": sorted(blocks), "already_built": []}


def write_into(manifest_path: str | os.PathLike, snippet: str, sources: Iterable[str]) -> Path:
    """Append ``snippet`` to the manifest at ``manifest_path`` after a comment naming ``sources``;
    the result must parse as a manifest (else GemmarError, nothing written)."""
    from gemmar_aot.builder.manifest import parse_manifest

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


# ---------------------------------------------------------------------------
# bucket planning: which M values to build for a token-count histogram
# ---------------------------------------------------------------------------


def read_histogram(path: str | os.PathLike) -> dict[int, int]:
    """A token-count histogram as a serving log gives it: JSON (``{"M": count}``, ``[[M, count], ...]``
    or a list of M values) or CSV (``M,count`` lines; a header line is skipped). M -> count."""
    import csv
    import json

    p = Path(path)
    text = p.read_text(encoding="utf-8")
    out: dict[int, int] = defaultdict(int)
    try:
        if p.suffix.lower() == ".json" or text.lstrip()[:1] in "[{":
            d = json.loads(text)
            items = (d.items() if isinstance(d, dict) else
                     ((x[0], x[1]) if isinstance(x, (list, tuple)) else (x, 1) for x in d))
        else:
            items = [row[:2] for row in csv.reader(text.splitlines()) if row and row[0].strip().isdigit()]
        for m, c in items:
            m, c = int(m), int(c)
            if m < 1 or c < 0:
                raise ValueError(f"M={m} count={c}")
            out[m] += c
    except (ValueError, TypeError, IndexError) as exc:
        raise GemmarError(f"{p}: not a token-count histogram ({exc}); give JSON {{\"M\": count}} or CSV "
                          f"lines M,count") from None
    if not out:
        raise GemmarError(f"{p}: the histogram is empty")
    return dict(out)


def padded_work(hist: dict[int, int], buckets: Sequence[int]) -> tuple[int, int]:
    """(rows computed, rows asked for) serving ``hist`` with ``buckets``: each M at the smallest bucket
    at or above it. Raises ValueError when an M is above every bucket."""
    bs = sorted(buckets)
    import bisect

    done = asked = 0
    for m, c in hist.items():
        i = bisect.bisect_left(bs, m)
        if i == len(bs):
            raise ValueError(f"M={m} is above every bucket ({bs[-1] if bs else 'none'})")
        done += c * bs[i]
        asked += c * m
    return done, asked


def plan_buckets(hist: dict[int, int], budget: int, step: int, m_max: int | None = None) -> list[int]:
    """The at most ``budget`` M buckets (multiples of ``step``, the largest covering every M) that
    minimise the padded work of ``hist`` -- exactly, by dynamic programming over the candidates
    (each M rounded up to ``step``: a bucket between two of them only pads more)."""
    if budget < 1:
        raise GemmarError(f"--budget must be at least 1, got {budget}")
    weight: dict[int, int] = defaultdict(int)
    for m, c in hist.items():
        p = -(-m // step) * step
        if m_max is not None and p > m_max:
            raise GemmarError(f"M={m} (padded {p}) is above the window's m_max {m_max}: no bucket can serve it")
        weight[p] += c
    cand = sorted(weight)
    n = len(cand)
    budget = min(budget, n)
    # prefix sums of counts over the candidates: rows of a bucket b serving (lo, b] = b * count
    pre = [0]
    for b in cand:
        pre.append(pre[-1] + weight[b])
    inf = float("inf")
    # best[j][i]: least work serving cand[:i+1] with j+1 buckets, the last at cand[i]
    best = [[inf] * n for _ in range(budget)]
    back = [[-1] * n for _ in range(budget)]
    for i in range(n):
        best[0][i] = cand[i] * pre[i + 1]
    for j in range(1, budget):
        for i in range(j, n):
            for p in range(j - 1, i):
                v = best[j - 1][p] + cand[i] * (pre[i + 1] - pre[p + 1])
                if v < best[j][i]:
                    best[j][i], back[j][i] = v, p
    j = min(range(budget), key=lambda j: best[j][n - 1])
    out, i = [], n - 1
    while i >= 0 and j >= 0:
        out.append(cand[i])
        i, j = back[j][i], j - 1
    return sorted(out)
