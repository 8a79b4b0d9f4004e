"""Manifests: the TOML files that say which of mori's run-time compiled kernels to build.

A manifest lists entries of three kinds: *tuples* (``[[tuple]]``: mori's GEMM + all-reduce and its
gemm-only and gemv siblings), ``[[ep]]`` entries (EP dispatch/combine v2: its FlyDSL backend, or
with ``kernel_backend = "hip"`` its HIP backend through mori's JIT v2) and ``[[hipcc]]`` entries
(mori's hipcc-JIT kernels: EP v1, collectives, shmem, IO). Each tuple is one mode at one (N, K,
world, quant) with one or more M values. Example::

    # manifests/dsv4-pro-wo_b.toml
    [manifest]
    name = "dsv4-pro-wo_b"        # optional; default: the file's stem
    description = "..."           # optional
    arch = "gfx950"               # optional (the default); or "gfx942" (MI300X): no [[tuple]] or FlyDSL [[ep]] there
    format = 1                    # optional; the only format so far

    [[tuple]]
    transport = "fused-sdma"      # see below
    m = { start = 4096, stop = 16384, step = 1024 }
    n = 7168
    k = 2048
    world = 8
    quant = "blockscale"          # "blockscale" | "mxfp8"

Top level
    Only ``[manifest]``, ``[[tuple]]``, ``[[ep]]`` and ``[[hipcc]]`` are allowed, and there must
    be at least one entry. An ``[[ep]]`` entry is one configuration of mori's EP dispatch/combine
    v2 (:mod:`gemmar_aot.builder.manifest_ep` says what it holds); each counts as one workload,
    and its kernels (every rank's) as compiles. A ``[[hipcc]]`` entry names mori's hipcc-JIT
    sources, archs and NIC variants (:mod:`gemmar_aot.builder.manifest_hipcc`); each code object
    counts against :data:`MAX_HIPCC_COMPILES`.

Required tuple keys
    ``transport``  one of :data:`gemmar_aot.builder.workload.MODES`, the five ways mori's
                   PR measures DSV4-Pro's wo_b plus the skinny GEMM:
                   ``fused-sdma`` (``GemmAllReduceOp``: the GEMM pushes its
                   output from its epilogue, then drain -> reduce -> gather),
                   ``split-sdma`` (unfused GEMM, then the SDMA all-reduce:
                   scatter -> reduce -> gather),
                   ``split-lsa`` (unfused GEMM, then one LSA all-reduce kernel),
                   ``fused-lsa`` (the GEMM's epilogue stores straight into the
                   peers' windows, then barrier -> reduce -> gather),
                   ``gemm-only`` (``Mxfp8GemmOp``: the GEMM alone),
                   ``gemv`` (``Mxfp8GemvOp``: the skinny GEMM for M <= 32, one
                   kernel per M bucket 1, 2, 4, 8, 16, 32).
    ``m``          the M values, in one of three forms: an integer
                   (``m = 4096``), a non-empty array (``m = [256, 512]``), or
                   a range table ``{ start, stop, step }`` whose ``stop`` is
                   inclusive when it falls on the grid. At most
                   :data:`~gemmar_aot.builder.manifest_check.MAX_M_VALUES` values per tuple.
    ``n``, ``k``   the GEMM's N (output columns, the all-reduced row length)
                   and K (the reduction dimension).
    ``world``      ranks in the all-reduce: 2, 4 or 8. For ``gemm-only`` and
                   ``gemv`` any positive integer; it is recorded (so every tuple
                   has the same shape) but does not change their kernels.
    ``quant``      ``blockscale`` (1x128 / 128x128 fp32 scales, DeepSeek-V4-Pro)
                   or ``mxfp8`` (32-wide ue8m0 scales). ``gemm-only`` and
                   ``gemv`` are mxfp8 only.

Optional tuple keys (each only where its mode has it; elsewhere it is an error)
    ``gather_dtype``      ``"bf16"`` (default) or ``"fp8"``: what the gather
                          leg carries. Collective modes; fp8 needs N a multiple
                          of 1024 and is not offered by split-lsa (one LSA
                          kernel) or fused-lsa (measured on bf16 only).
    ``gather_transport``  ``"lsa"`` (default) or ``"sdma"``: who moves an fp8
                          gather. Collective modes (split-lsa: ``"lsa"``).
    ``block_m``           the GEMM's M tile; default 128 for blockscale, 256
                          for mxfp8 (which requires 256). Not for gemv.
    ``block_n``           the GEMM's N tile; 256 is the only legal value.
    ``m_max``             the largest M the op instance (its window) serves. By
                          default each group of otherwise identical tuples gets
                          its largest padded M. Collective modes only.
    ``sdma_queues``       SDMA queues per destination (default 1): modes whose
                          tail runs SDMA phases (fused-sdma, split-sdma, fused-lsa).

M padding
    Collective modes pad M up to a multiple of ``world * block_m`` (whole row
    bands per destination), exactly like ``GemmAllReduceOp.padded_m``;
    ``gemm-only`` pads to a multiple of 64 (the packed A-scale group), ``gemv``
    to its M bucket. A
    :class:`~gemmar_aot.builder.workload.Workload` keeps both the padded ``m`` and the
    ``m_requested``. Two M values that pad to the same workload are built once
    and reported in :attr:`Manifest.warnings`, not as errors; ``m_max`` is
    padded the same way.

Limits
    Besides :data:`~gemmar_aot.builder.manifest_check.MAX_M_VALUES` per tuple,
    the whole manifest is bounded: at most :data:`MAX_WORKLOADS` distinct
    workloads and :data:`MAX_GEMM_COMPILES` GEMM compiles (the expensive
    kernels), counted before anything is planned; past either the manifest is
    refused with the numbers.

Warnings
    Merged duplicates and a range whose ``stop`` is off its grid are not errors;
    they are collected in :attr:`Manifest.warnings`, which ``plan`` and ``build``
    print (and put in their ``--json`` output).

Errors
    Validation applies the op's own rules (:mod:`gemmar_aot.model.rules`) and collects
    every problem before raising one :class:`~gemmar_aot.util.errors.ManifestError`.
    Each problem names the file, the entry and its line, the field, the value,
    the rule and a fix, e.g.::

        smoke.toml: tuple[2] (line 14): k = 200: K must be a multiple of 128 (the block-scale group); use 256

    The parser raises nothing but ManifestError, whatever the input.

The ``[manifest]`` table and each ``[[tuple]]`` are checked by
:mod:`gemmar_aot.builder.manifest_check`; this module parses the TOML, expands the checked
tuples into workloads and bounds the whole manifest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from gemmar_aot.model import rules
from gemmar_aot.builder.manifest_check import (
    FLYDSL_ARCH,
    COMMON,
    Checker,
    Draft,
    check_manifest_table,
    check_tuple,
    padded,
    render,
    type_name,
    unknown_key,
)
from gemmar_aot.builder.manifest_ep import EpEntry, EpHipEntry, check_ep, entry_lines
from gemmar_aot.builder.manifest_hipcc import HipccEntry, check_hipcc
from gemmar_aot.builder.workload import Workload
from gemmar_aot.util.errors import ManifestError
from gemmar_aot.util.filedigest import sha256_hex

#: Most distinct workloads (tuples after padding and de-duplication) one manifest
#: may ask for, across all its tuples.
MAX_WORKLOADS = 4096
#: Most GEMM compiles one manifest may ask for, across all its tuples. GEMMs are
#: the expensive kernels (an order of magnitude above a phase kernel; BENCHMARKS.md has the
#: per-kind compile times): 8192 of them are hours of CPU. A fused GEMM is one compile per M and
#: rank; an unfused one (split modes, gemm-only) one per shape; gemv one per bucket.
MAX_GEMM_COMPILES = 8192
#: Mean CPU seconds of one GEMM compile, for the limit's message.
GEMM_COMPILE_SECONDS = 1.5
#: Repeated M values warned about one by one; past this, one line counts the rest.
MAX_REPEAT_WARNINGS = 32

#: Most EP kernel compiles (every rank's variants of every [[ep]] entry) one manifest may ask for.
MAX_EP_COMPILES = 8192

_TOP_KEYS = ("manifest", "tuple", "ep", "hipcc")
#: Most hipcc code objects (sources x archs x NIC variants, every entry) one manifest may ask for.
MAX_HIPCC_COMPILES = 512


@dataclass(frozen=True)
class Manifest:
    """A validated manifest.

    ``workloads`` are in manifest order (tuple by tuple, M values in the order
    written), padded, with duplicates removed; ``warnings`` says what was merged.
    """

    name: str
    path: str  # as given, for messages
    arch: str
    description: str
    workloads: tuple[Workload, ...]
    warnings: tuple[str, ...] = ()
    eps: tuple[EpEntry, ...] = ()  # the [[ep]] entries, in manifest order, repeats removed
    hipcc: tuple[HipccEntry, ...] = ()  # the [[hipcc]] entries, each variant in the first that asks for it
    ep_hip: tuple[EpHipEntry, ...] = ()  # the HIP-backend [[ep]] entries (mori's JIT v2), repeats removed
    text: bytes = b""  # the bytes read, once: the lock names their sha256, a wheel carries them
    sha256: str = ""


# --------------------------------------------------------------------------
# Expansion and the whole manifest's limits
# --------------------------------------------------------------------------


def _expand(ck: Checker, drafts: list[Draft]) -> list[Workload]:
    """The distinct workloads of the checked tuples, in manifest order; [] after a refusal.

    Counted as they are made: the first M past :data:`MAX_WORKLOADS` distinct ones stops the
    expansion and refuses the manifest (a manifest of a million M values is refused after
    4,097 of them, never all made); a repeat is counted, not made, and warned about (the first
    :data:`MAX_REPEAT_WARNINGS` one by one)."""
    first: dict[tuple, tuple[str, int]] = {}  # identity -> (source, m_requested) of its first
    out: list[Workload] = []
    repeats = 0
    for d in drafts:
        group = tuple(d.common[f] for f in COMMON) + (d.m_max,)
        for m_req, m_pad in zip(d.fields["m_values"], padded(d.fields)):
            ident = (group, m_pad)
            seen = first.get(ident)
            if seen is None:
                if len(out) == MAX_WORKLOADS:
                    ck.problem("top level", f"the tuples expand to more than {MAX_WORKLOADS} distinct workloads "
                               f"(padded M values; {_entry_of(d.source, ck.path)} goes past it), more than the "
                               f"{MAX_WORKLOADS} one manifest may ask for; split it into several manifests (each "
                               "gets its own lock file) or use coarser M ranges")
                    return []
                first[ident] = (d.source, m_req)
                out.append(Workload(m=m_pad, m_max=d.m_max, m_requested=m_req, source=d.source, **d.common))
                continue
            repeats += 1
            if repeats > MAX_REPEAT_WARNINGS:
                continue
            src, req = seen
            entry = _entry_of(d.source, ck.path)
            if src == d.source:
                ck.warnings.append(f"{ck.path}: {entry}: m = {req} and m = {m_req} both pad to {m_pad}; it is "
                                   f"built once")
            else:
                ck.warnings.append(f"{ck.path}: {entry}: m = {m_req} (padded {m_pad}) repeats "
                                   f"{_entry_of(src, ck.path)}; it is built once")
    if repeats > MAX_REPEAT_WARNINGS:
        ck.warnings.append(f"{ck.path}: and {repeats - MAX_REPEAT_WARNINGS} more M values repeat one above; each "
                           "is built once")
    return out


def gemm_compiles(workloads) -> dict[str, int]:
    """GEMM compiles per transport these workloads need (what MAX_GEMM_COMPILES bounds)."""
    fused: dict[str, int] = {}
    shared: dict[str, set] = {}
    for w in workloads:
        if w.transport in ("fused-sdma", "fused-lsa"):
            fused[w.transport] = fused.get(w.transport, 0) + w.world
        elif w.transport == "gemm-only":
            shared.setdefault(w.transport, set()).add((w.n, w.k, rules.gemm_only_wants_narrow(w.m, w.n)))
        elif w.transport == "gemv":
            shared.setdefault(w.transport, set()).add((w.n, w.k, w.m))
        else:  # split modes share one unfused GEMM per shape
            shared.setdefault("split", set()).add((w.n, w.k, w.quant, w.block_m))
    return {**fused, **{t: len(v) for t, v in shared.items()}}


def _check_limits(ck: Checker, workloads: list[Workload]) -> None:
    """Bound the GEMM compiles the whole manifest asks for, before any of it is planned or
    compiled (:func:`_expand` has bounded the workloads)."""
    by_mode = gemm_compiles(workloads)
    total = sum(by_mode.values())
    if total > MAX_GEMM_COMPILES:
        parts = ", ".join(f"{t} {n}" for t, n in sorted(by_mode.items(), key=lambda x: -x[1]))
        hours = total * GEMM_COMPILE_SECONDS / 3600
        ck.problem("top level", f"the tuples ask for {total} GEMM compiles ({parts}; about {hours:.1f} "
                   f"CPU-hours at ~{GEMM_COMPILE_SECONDS} s each), more than the {MAX_GEMM_COMPILES} one "
                   "manifest may ask for; split it into several manifests (each gets its own lock file), "
                   "or ask for fewer M values or ranks")


def _check_eps(ck: Checker, eps: Any, room: int) -> tuple[list[EpEntry], list[EpHipEntry]]:
    """The checked ``[[ep]]`` entries (FlyDSL, HIP), repeats removed (warned about), bounded by ``room``
    workloads and :data:`MAX_EP_COMPILES` kernels."""
    from gemmar_aot.model.ep import kernels_per_rank

    if isinstance(eps, dict):
        ck.problem("top level", "[ep] is a single table, but EP entries are an array of tables; write the header "
                   "as [[ep]]")
        return [], []
    if not isinstance(eps, list):
        ck.problem("top level", f"ep = {render(eps)}: EP entries must be [[ep]] sections, not {type_name(eps)}")
        return [], []
    lines = entry_lines(ck, len(eps))
    out: list[EpEntry] = []
    hip: list[EpHipEntry] = []
    seen: dict = {}
    compiles = 0
    for i, raw in enumerate(eps):
        e = check_ep(ck, i, raw, lines[i])
        if e is None:
            continue
        same = (e.fields, e.device, e.nics) if isinstance(e, EpHipEntry) else e.config
        if same in seen:
            ck.warnings.append(f"{ck.path}: {_entry_of(e.source, ck.path)}: repeats "
                               f"{_entry_of(seen[same], ck.path)}; it is built once")
            continue
        seen[same] = e.source
        if isinstance(e, EpHipEntry):
            compiles += len(e.nics) * 10  # at most a translation unit per plan per NIC variant
            hip.append(e)
            continue
        compiles += e.config.world * kernels_per_rank(e.config)
        out.append(e)
    if len(out) + len(hip) > room:
        ck.problem("top level", f"the [[ep]] entries and the tuples make more than {MAX_WORKLOADS} distinct "
                   f"workloads, more than one manifest may ask for; split it into several manifests")
    elif compiles > MAX_EP_COMPILES:
        ck.problem("top level", f"the [[ep]] entries ask for {compiles} kernel compiles (every rank's variants), "
                   f"more than the {MAX_EP_COMPILES} one manifest may ask for; split it into several manifests")
    return out, hip


def _check_flydsl_arch(ck: Checker, arch: str, flydsl: bool) -> None:
    """[[tuple]] and FlyDSL [[ep]] entries (``flydsl``) only in a gfx950 manifest."""
    if arch != FLYDSL_ARCH and flydsl:
        ck.problem("top level", f'arch = "{arch}": [[tuple]] and FlyDSL [[ep]] entries are mori\'s FlyDSL ops, built '
                   f'for {FLYDSL_ARCH} (MI355X) only; a {arch} manifest holds [[hipcc]] entries and HIP-backend '
                   f'[[ep]] entries (kernel_backend = "hip"): set arch = "{FLYDSL_ARCH}", or move them to a '
                   f'{FLYDSL_ARCH} manifest')


def _check_hipccs(ck: Checker, entries: Any, arch: str) -> list[HipccEntry]:
    """The checked ``[[hipcc]]`` entries, each code object in the first entry that asks for it (a
    repeat warned about), bounded by :data:`MAX_HIPCC_COMPILES`."""
    from dataclasses import replace

    from gemmar_aot.builder.manifest_hipcc import entry_lines as hipcc_lines

    if not isinstance(entries, list):
        ck.problem("top level", f"hipcc = {render(entries)}: hipcc entries must be [[hipcc]] sections (an array of "
                   "tables); write the header as [[hipcc]]")
        return []
    lines = hipcc_lines(ck, len(entries))
    out: list[HipccEntry] = []
    seen: dict = {}
    for i, raw in enumerate(entries):
        e = check_hipcc(ck, i, raw, lines[i], arch)
        if e is None:
            continue
        repeats = [v for v in e.variants if v in seen]
        for v in repeats[:3]:
            ck.warnings.append(f"{ck.path}: {_entry_of(e.source, ck.path)}: {v.describe()} repeats "
                               f"{_entry_of(seen[v], ck.path)}; it is built once")
        fresh = tuple(v for v in e.variants if v not in seen)
        seen.update((v, e.source) for v in fresh)
        if fresh:
            out.append(replace(e, variants=fresh))
    if len(seen) > MAX_HIPCC_COMPILES:
        ck.problem("top level", f"the [[hipcc]] entries ask for {len(seen)} code objects (sources x archs x NIC "
                   f"variants), more than the {MAX_HIPCC_COMPILES} one manifest may ask for; split it into several "
                   "manifests")
    return out


def _entry_of(source: str, path: str) -> str:
    prefix = path + ":"
    return source[len(prefix):] if source.startswith(prefix) else source


# --------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------


def _default_name(path: str) -> str:
    if path.startswith("<"):
        return "manifest"
    return Path(path).stem or "manifest"


def _text_of(text: str | bytes, path: str) -> tuple[str, bytes]:
    """The manifest's text, and the bytes it was read as (what the lock's sha256 names)."""
    if isinstance(text, (bytes, bytearray)):
        try:
            return bytes(text).decode("utf-8"), bytes(text)
        except UnicodeDecodeError as exc:
            raise ManifestError([f"{path}: not UTF-8 text (bad byte at offset {exc.start}); "
                                 "save the manifest as UTF-8"]) from None
    if not isinstance(text, str):
        raise ManifestError([f"{path}: expected the manifest's text, got {type(text).__name__}"])
    return text, text.encode("utf-8")


def parse_manifest(text: str, path: str = "<string>") -> Manifest:
    """Parse and validate manifest ``text``; ``path`` is only used in messages.

    Raises :class:`ManifestError` listing every problem; never anything else.
    """
    path = str(path)
    text, read = _text_of(text, path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError([f"{path}: not valid TOML: {exc}; fix the syntax there"]) from None
    except RecursionError:
        raise ManifestError([f"{path}: not valid TOML: arrays or tables are nested too deeply "
                             "for the parser; flatten them"]) from None
    except Exception as exc:  # e.g. ValueError for an integer of thousands of digits
        raise ManifestError([f"{path}: not valid TOML: the parser stopped with "
                             f"{type(exc).__name__}: {render(str(exc))}; fix that value"]) from None

    ck = Checker(path, text)
    for key in data:
        if key not in _TOP_KEYS:
            unknown_key(ck, "top level", key, ("[manifest]", "[[tuple]]", "[[ep]]", "[[hipcc]]"), "a manifest")
    name, description, arch = check_manifest_table(ck, data.get("manifest", {}), _default_name(path))

    tuples = data.get("tuple")
    drafts: list[Draft] = []
    if tuples is None and ("ep" in data or "hipcc" in data):
        pass  # an EP-only or hipcc-only manifest
    elif tuples is None:
        ck.problem("top level", "there is no [[tuple]]: a manifest must list at least one workload; "
                   'add e.g. [[tuple]] with transport = "fused-sdma", m, n, k, world and quant (or an [[ep]] '
                   "or a [[hipcc]] entry)")
    elif isinstance(tuples, dict):
        ck.problem("top level", "[tuple] is a single table, but tuples are an array of tables; "
                   "write the header as [[tuple]]")
    elif not isinstance(tuples, list):
        ck.problem("top level", f"tuple = {render(tuples)}: tuples must be [[tuple]] sections, not "
                   f"{type_name(tuples)}; write each as a [[tuple]] section")
    elif not tuples:
        ck.problem("top level", "tuple = []: a manifest must list at least one workload; "
                   "add a [[tuple]] section")
    else:
        lines = ck.tuple_lines(len(tuples))
        for i, raw in enumerate(tuples):
            d = check_tuple(ck, i, raw, lines[i])
            if d is not None:
                drafts.append(d)

    eps, ep_hip = _check_eps(ck, data["ep"], MAX_WORKLOADS) if "ep" in data else ([], [])
    hipcc = _check_hipccs(ck, data["hipcc"], arch) if "hipcc" in data else []
    _check_flydsl_arch(ck, arch, bool(drafts or eps))
    if ck.problems:
        raise ManifestError(ck.problems)
    workloads = _expand(ck, drafts)
    if not ck.problems:
        _check_limits(ck, workloads)
        if len(workloads) + len(eps) + len(ep_hip) > MAX_WORKLOADS:
            ck.problem("top level", f"the tuples and [[ep]] entries make {len(workloads) + len(eps) + len(ep_hip)} "
                       f"distinct workloads, more than the {MAX_WORKLOADS} one manifest may ask for; split it into "
                       "several manifests (each gets its own lock file)")
    if ck.problems:
        raise ManifestError(ck.problems)
    return Manifest(
        name=name,
        path=path,
        arch=arch,
        description=description,
        workloads=tuple(workloads),
        warnings=tuple(ck.warnings),
        eps=tuple(eps),
        hipcc=tuple(hipcc),
        ep_hip=tuple(ep_hip),
        text=read,
        sha256=sha256_hex(read),
    )


def load_manifest(path: str | os.PathLike) -> Manifest:
    """Read and validate the manifest at ``path``. Raises :class:`ManifestError`."""
    try:
        shown = os.fspath(path)
    except TypeError:
        raise ManifestError([f"{path!r}: not a file path"]) from None
    if isinstance(shown, bytes):
        shown = shown.decode("utf-8", "replace")
    try:
        data = Path(shown).read_bytes()
    except FileNotFoundError:
        raise ManifestError([f"{shown}: no such file; check the path (the shipped manifests are "
                             "in manifests/)"]) from None
    except IsADirectoryError:
        raise ManifestError([f"{shown}: is a directory; pass a manifest .toml file"]) from None
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise ManifestError([f"{shown}: cannot read it ({why}); check the path and its "
                             "permissions"]) from None
    return parse_manifest(data, path=shown)


__all__ = [
    "MAX_EP_COMPILES",
    "MAX_HIPCC_COMPILES",
    "MAX_GEMM_COMPILES",
    "MAX_WORKLOADS",
    "gemm_compiles",
    "MAX_REPEAT_WARNINGS",
    "Manifest",
    "load_manifest",
    "parse_manifest",
]
