"""What an artifact wheel holds and what it is called: its layout, its names and version, the
file names inside its package, and the facts about a lock that writing and inspecting one share.

Layout (``{pkg}`` = ``gemmar_artifacts_<manifest>``, ``{dist}`` = ``{pkg}-{version}``)::

    {pkg}/__init__.py                    locate() -> (lock path, store root), relative to __file__
    {pkg}/lock.json.zst                  the build's lock file (canonical bytes) in one zstd frame
                                         with its checksum (model.lock.compress_lock)
    {pkg}/lock.records.zst               the lock's record index (gemmar_aot.store.record_index):
                                         the action-cache records the lock names, each line
                                         verified against the lock at load (absent when the
                                         store lacked a record the lock names)
    {pkg}/BUILD_INFO.json                arch, toolchain fingerprint, manifest text + sha256,
                                         coverage, sizes, blob encoding
    {pkg}/store/STORE_FORMAT             a store directory the runtime opens read-only:
    {pkg}/store/blobs.pack               every code object the lock names, and the zstd dictionary
                                         (one copy), in one pack file with an index (gemmar_aot.store.pack)
    {dist}.dist-info/METADATA            Requires-Dist: gemmar-aot>=X.Y.Z,<X+1
    {dist}.dist-info/WHEEL               Root-Is-Purelib: true, Tag: py3-none-any
    {dist}.dist-info/entry_points.txt    [gemmar_aot.artifacts] <manifest> = {pkg}:locate
    {dist}.dist-info/RECORD              sha256 (urlsafe base64, unpadded) and size of every file

Names: distribution ``gemmar-artifacts-<manifest name, lowercased, every run of other
characters than [a-z0-9] -> "-">`` (``dsv4-pro-wo_b`` -> ``gemmar-artifacts-dsv4-pro-wo-b``),
import package the same with ``_`` (``gemmar_artifacts_dsv4_pro_wo_b``), entry point named
after the manifest.

Version: ``1.0.0+<first 12 hex digits of the sha256 of the lock file>`` unless ``--version``
gives one. The lock pins everything the runtime sees -- every code object by sha256, the
manifest text by sha256, the toolchain fingerprint, the gemmar-aot version -- so the
version changes exactly when the served kernels (or the manifest) change, and two builds
of the same thing get the same version. Local versions do not sort by age: pin the exact
version (``==1.0.0+abcdef012345``), or pass ``--version`` (e.g. a release number) to get
ordered upgrades.


Records (``ac/``) are not shipped as files: one per kernel would more than double the wheel
(and compile times in them differ per machine). The lock's record index carries what the
runtime binds each lock entry to -- each record's hashing form, without the compile time and
without the action key and blob digest the lock already holds -- in one small zstd frame.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from gemmar_aot import __version__
from gemmar_aot.util.errors import GemmarError
from gemmar_aot.model.lock import Lock
from gemmar_aot.model.bundle import LockBundle
from gemmar_aot.store.pack import PACK_FILE
from gemmar_aot.toolchain.profiles import DEFAULT_PROFILE
from gemmar_aot.util.filedigest import sha256_hex

#: Version of the layout inside the wheel (BUILD_INFO.json ``format``).
#: 2: BUILD_INFO.json spells the manifest's and the lock's digests as every digest is spelled,
#:    ``{"hash", "size"}`` (format 1: ``"sha256"`` and ``"bytes"``), and the record index's size
#:    as ``"size"``.
WHEEL_FORMAT = 2
#: The formats ``inspect`` reads.
READ_WHEEL_FORMATS = (1, 2)


def build_info_digest(info: Mapping[str, Any], part: str) -> str | None:
    """The sha256 BUILD_INFO.json (``info``, of either format) records for ``part``: "manifest" or "lock"."""
    got = info.get(part) if isinstance(info.get(part), Mapping) else {}
    d = got.get("digest")
    return d.get("hash") if isinstance(d, Mapping) else got.get("sha256")
DIST_PREFIX = "gemmar-artifacts-"
DEFAULT_PUBLIC_VERSION = "1.0.0"
TAG = "py3-none-any"

_NORMALIZED_VERSION = re.compile(
    r"^(?:[1-9]\d*!)?(?:0|[1-9]\d*)(?:\.(?:0|[1-9]\d*))*(?:(?:a|b|rc)(?:0|[1-9]\d*))?"
    r"(?:\.post(?:0|[1-9]\d*))?(?:\.dev(?:0|[1-9]\d*))?(?:\+[a-z0-9]+(?:\.[a-z0-9]+)*)?$")


class WheelError(GemmarError):
    """A wheel cannot be built, or a file is not an artifact wheel."""


# ---------------------------------------------------------------------------
# names, versions
# ---------------------------------------------------------------------------


def names(manifest_name: str) -> tuple[str, str]:
    """(distribution name, import package) for a manifest name."""
    slug = re.sub(r"[^a-z0-9]+", "-", manifest_name.lower()).strip("-")
    if not slug:
        raise WheelError(f"manifest name {manifest_name!r} has no letters or digits to name a wheel after")
    dist = DIST_PREFIX + slug
    return dist, dist.replace("-", "_")


def default_version(lock_bytes: bytes, profile: str | None = None) -> str:
    """``1.0.0+<first 12 hex of the lock's sha256>``; a toolchain profile other than the default
    is named in the local label (``1.0.0+nightly.<hex>``), so the two wheels of one manifest
    tell themselves apart by version as well as by content."""
    label = sha256_hex(lock_bytes)[:12]
    if profile and profile != DEFAULT_PROFILE:
        label = f"{profile}.{label}"
    return f"{DEFAULT_PUBLIC_VERSION}+{label}"


def check_version(version: str) -> str:
    if not _NORMALIZED_VERSION.match(version):
        raise WheelError(f"--version {version!r} is not a normalized PEP 440 version; write e.g. 1.2.0, "
                         f"2.0.0rc1, 1.0.0.post1 or 1.0.0+build7 (lowercase, no leading zeros, no 'v')")
    return version


def requires_dist() -> str:
    """``gemmar-aot`` ranged to this version's major: the lock schema and store format of a major."""
    major = int(__version__.split(".")[0])
    return f"gemmar-aot<{major + 1},>={__version__}"


def wheel_filename(dist: str, version: str) -> str:
    return f"{dist.replace('-', '_')}-{version}-{TAG}.whl"


# ---------------------------------------------------------------------------
# the package's files
# ---------------------------------------------------------------------------


#: The pack file (every blob, one index) inside the package; a store root holding it opens as a pack.
PACK_ARCPATH = f"store/{PACK_FILE}"
#: The lock inside the package: its canonical bytes in one zstd frame (``model.lock.read_lock``
#: reads either form); deflated JSON was 41% of the reference wheel, this is a third smaller.
LOCK_ARCNAME = "lock.json.zst"
#: The lock's record index, beside it (``LockBundle(LOCK_ARCNAME).record_index``).
INDEX_ARCNAME = LockBundle(LOCK_ARCNAME).record_index.name
#: The lock's signature envelope, beside it (``LockBundle(LOCK_ARCNAME).envelope``).
ENVELOPE_ARCNAME = LockBundle(LOCK_ARCNAME).envelope.name
#: What wheels of gemmar-aot before LOCK_ARCNAME named their lock (plain JSON); inspect still reads them.
OLD_LOCK_ARCNAME = "lock.json"


# ---------------------------------------------------------------------------
# the lock, as BUILD_INFO.json and inspect describe it
# ---------------------------------------------------------------------------


def lock_sizes(lock: Lock) -> dict[str, int | None]:
    """digest -> raw size as the lock names it. Raises on disagreement."""
    sizes: dict[str, int | None] = {}
    for where, e in lock.iter_entries():
        d, s = e.blob.hash, e.blob.size
        old = sizes.get(d)
        if old is not None and old != s:
            raise WheelError(f"the lock names blob {d} with sizes {old} and {s} (at {where}); rebuild it")
        sizes[d] = s
    return sizes


def coverage(lock: Lock) -> list[dict]:
    """The tuples a lock covers, grouped: transport, N, K, world, quant, wire -> M list; then its
    ``[[ep]]`` entries, one row each (``transport`` "ep", the configuration, its ranks); then its
    hipcc code objects, a row per (arch, NIC variant, host proxy) naming their sources."""
    groups: dict[tuple, dict] = {}
    for t in lock.tuples:
        i = t.id
        wire = i.key.wire if t.layout is not None else None  # the collective modes: the wire is what they serve
        m_max = None if t.layout is None else t.layout.m_max
        k = (i.transport, i.n, i.k, i.world, i.quant, wire, i.block_m, i.sdma_queues, m_max)
        g = groups.setdefault(k, {
            "transport": i.transport, "m": [], "n": i.n, "k": i.k, "world": i.world,
            "quant": i.quant, "wire": wire, "block_m": i.block_m,
            "sdma_queues": i.sdma_queues, "m_max": m_max,
            "ranks": sorted(r.rank for r in t.ranks)})
        g["m"].append(i.m)
    out = []
    for g in groups.values():
        g["m"] = sorted(set(g["m"]))
        out.append(g)
    out = sorted(out, key=lambda g: (g["transport"], g["n"], g["k"], g["world"], g["quant"], g["wire"] or "",
                                     g["m_max"] or 0))
    hipcc: dict[tuple, list[str]] = {}  # mori's hipcc code objects: the sources of each (arch, NIC, proxy)
    for h in lock.hipcc:
        hipcc.setdefault((h.variant.arch, h.variant.nic, h.variant.host_proxy), []).append(h.variant.source)
    jitv2: dict[tuple, list[str]] = {}  # mori's JIT v2 code objects: the plans of each (arch, NIC)
    for j in lock.jitv2:
        jitv2.setdefault((j.variant.arch, j.variant.nic), []).append(j.plan)
    return (out + [{"transport": "ep", **ep.config.to_json(), "ranks": [r.rank for r in ep.ranks]} for ep in lock.eps]
            + [{"transport": "hipcc", "arch": a, "nic": n, "host_proxy": p, "sources": sorted(srcs)}
               for (a, n, p), srcs in sorted(hipcc.items())]
            + [{"transport": "jitv2", "arch": a, "nic": n, "plans": sorted(plans)}
               for (a, n), plans in sorted(jitv2.items())])

