"""Prebuilt artifact wheels: one manifest's kernels as a pip-installable, reproducible wheel.

``gemmar-aot wheel MANIFEST --out DIR`` builds the manifest (:func:`gemmar_aot.build.run_build`,
which compiles only what the store misses) and writes ONE wheel holding its lock file and
exactly the code objects the lock names, as a store directory inside an import package.
Serving pods ``pip install`` it; the runtime finds it through the entry-point group
``gemmar_aot.artifacts`` (see :mod:`gemmar_aot.runtime.artifacts`), no path or env var needed.

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

Reproducible: the same lock gives the same wheel bytes, whatever the store's history, the
checkout path, the machine or the clock. Blobs are *re-encoded canonically* rather than
copied (a store's files depend on which dictionary it had trained when they were written):
decoded and verified, a zstd dictionary trained on exactly the wheel's code objects in
digest order (:func:`gemmar_aot.store.maint.train_best_dictionary`; deterministic, or none
when it does not pay), each blob compressed at level 19 with it. Zip entries are in a fixed order
(package files sorted, then METADATA, WHEEL, entry_points.txt, top_level.txt, RECORD), dated 1980-01-01 (or
``$SOURCE_DATE_EPOCH``, clamped to the zip range), mode 0644, Unix; the pack is
STORED, everything else DEFLATED at level 9. "Same toolchain" therefore also means the
same python-zstandard/libzstd (recorded in BUILD_INFO) and zlib.

Records (``ac/``) are not shipped as files: one per kernel would more than double the wheel
(and compile times in them differ per machine). The lock's record index carries what the
runtime binds each lock entry to -- each record's hashing form, without the compile time and
without the action key and blob digest the lock already holds -- in one small zstd frame.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import time
import zipfile
import zlib
from collections.abc import Mapping
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath
from typing import Any


from gemmar_aot import __version__
from gemmar_aot.model.lock import ENTRY_POINT_GROUP, Lock, compress_lock, read_lock
from gemmar_aot.atomic_write import atomic_write_bytes
from gemmar_aot.canonical_json import canonical_json_bytes as _canonical_json
from gemmar_aot.errors import GemmarError
from gemmar_aot.store import STORE_FORMAT
from gemmar_aot.store.errors import BlobNotFoundError, StoreError
from gemmar_aot.store.pack import PACK_FILE, PREFIX_HEX, PackBackend, write_pack
from gemmar_aot.store.pack_encode import encode_blobs as _encode_blobs
from gemmar_aot.signing import envelope_path, read_envelope
from gemmar_aot.toolchain.profiles import DEFAULT_PROFILE
from gemmar_aot.store.record_index import (RecordIndex, RecordIndexError, RecordMissingError, build_index_from_store,
                                           index_path)

#: Version of the layout inside the wheel (BUILD_INFO.json ``format``).
WHEEL_FORMAT = 1
DIST_PREFIX = "gemmar-artifacts-"
DEFAULT_PUBLIC_VERSION = "1.0.0"
#: zstd level of the shipped blobs (as the store's DEFAULT_LEVEL; see bench/bench_store.py).
ZSTD_LEVEL = 19
#: 1980-01-01 00:00:00, the earliest time a zip entry can hold.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
FILE_MODE = 0o100644
TAG = "py3-none-any"

_NORMALIZED_VERSION = re.compile(
    r"^(?:[1-9]\d*!)?(?:0|[1-9]\d*)(?:\.(?:0|[1-9]\d*))*(?:(?:a|b|rc)(?:0|[1-9]\d*))?"
    r"(?:\.post(?:0|[1-9]\d*))?(?:\.dev(?:0|[1-9]\d*))?(?:\+[a-z0-9]+(?:\.[a-z0-9]+)*)?$")


class WheelError(GemmarError):
    """A wheel cannot be built, or a file is not an artifact wheel."""


class WheelBuildFailed(WheelError):
    """The manifest's build failed; ``summary`` is :func:`run_build`'s summary (failures listed)."""

    def __init__(self, summary: dict):
        self.summary = summary
        super().__init__(f"the build of {summary.get('manifest')} failed ({summary.get('failed')} kernel(s)); "
                         f"no wheel was written")


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
    label = hashlib.sha256(lock_bytes).hexdigest()[:12]
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


def zip_date_time() -> tuple[int, int, int, int, int, int]:
    """``$SOURCE_DATE_EPOCH`` as a zip date (UTC, clamped to 1980..2107), else 1980-01-01."""
    env = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not env:
        return ZIP_EPOCH
    try:
        epoch = int(env)
    except ValueError:
        raise WheelError(f"SOURCE_DATE_EPOCH={env!r} is not an integer number of seconds") from None
    t = time.gmtime(min(max(epoch, 315532800), 4354819198))  # 1980-01-01 .. 2107-12-31
    return (t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec - t.tm_sec % 2)


# ---------------------------------------------------------------------------
# content
# ---------------------------------------------------------------------------


#: The pack file (every blob, one index) inside the package; a store root holding it opens as a pack.
PACK_ARCPATH = f"store/{PACK_FILE}"
#: The lock inside the package: its canonical bytes in one zstd frame (``model.lock.read_lock``
#: reads either form); deflated JSON was 41% of the reference wheel, this is a third smaller.
LOCK_ARCNAME = "lock.json.zst"
#: The lock's record index, beside it (``record_index.index_path(LOCK_ARCNAME)``).
INDEX_ARCNAME = index_path(LOCK_ARCNAME).name
#: The lock's signature envelope, beside it (``signing.envelope_path(LOCK_ARCNAME)``).
ENVELOPE_ARCNAME = envelope_path(LOCK_ARCNAME).name
#: What wheels of gemmar-aot before LOCK_ARCNAME named their lock (plain JSON); inspect still reads them.
OLD_LOCK_ARCNAME = "lock.json"


def lock_sizes(lock: Lock) -> dict[str, int | None]:
    """digest -> raw size as the lock names it. Raises on disagreement."""
    sizes: dict[str, int | None] = {}
    for where, e in lock.iter_launches():
        d, s = e.blob.hash, e.blob.size
        old = sizes.get(d)
        if old is not None and old != s:
            raise WheelError(f"the lock names blob {d} with sizes {old} and {s} (at {where}); rebuild it")
        sizes[d] = s
    return sizes


def coverage(lock: Lock) -> list[dict]:
    """The tuples a lock covers, grouped: transport, N, K, world, quant, wire -> M list."""
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
    return sorted(out, key=lambda g: (g["transport"], g["n"], g["k"], g["world"], g["quant"], g["wire"] or "",
                                      g["m_max"] or 0))


def _init_py(manifest_name: str, dist: str, version: str) -> bytes:
    return f'''"""Prebuilt gemmar-aot kernels for manifest {manifest_name!r} ({dist} {version}).

Generated by ``gemmar-aot wheel``; do not edit. The runtime finds these kernels through
the entry point ``{manifest_name} = {dist.replace("-", "_")}:locate`` in the group
``{ENTRY_POINT_GROUP}``; nothing here imports gemmar_aot. The store is read-only data.
"""

from pathlib import Path

__version__ = {version!r}
MANIFEST = {manifest_name!r}
_HERE = Path(__file__).resolve().parent
LOCK = _HERE / {LOCK_ARCNAME!r}
STORE = _HERE / "store"
BUILD_INFO = _HERE / "BUILD_INFO.json"


def locate():
    """(lock file, store root) of these artifacts, for gemmar_aot.runtime.load_artifacts."""
    return (str(LOCK), str(STORE))
'''.encode()


def _metadata(dist: str, version: str, manifest_name: str, arch: str, description: str) -> bytes:
    summary = f"Prebuilt gemmar-aot {arch} kernels for manifest {manifest_name}"
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {dist}",
        f"Version: {version}",
        f"Summary: {summary}",
        "Requires-Python: >=3.10",
        f"Requires-Dist: {requires_dist()}",
        "Description-Content-Type: text/plain",
        "",
        f"{summary}, built by gemmar-aot {__version__} (`gemmar-aot wheel`).",
        "Installing this package makes gemmar_aot.runtime find the kernels (entry-point group",
        f"{ENTRY_POINT_GROUP}). `gemmar-aot inspect <wheel>` shows the manifest, the toolchain and",
        "the tuples covered, and verifies every file.",
    ]
    if description:
        lines += ["", description]
    return ("\n".join(lines) + "\n").encode()


def _wheel_file() -> bytes:
    return (f"Wheel-Version: 1.0\nGenerator: gemmar-aot {__version__}\nRoot-Is-Purelib: true\n"
            f"Tag: {TAG}\n").encode()


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _record(files: Mapping[str, bytes], record_name: str) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for name in files:
        w.writerow([name, _record_hash(files[name]), len(files[name])])
    w.writerow([record_name, "", ""])
    return buf.getvalue().encode()


def encode_blobs(raws: Mapping[str, bytes]) -> tuple[dict[str, bytes], dict]:
    """Canonical file bytes of ``raws`` at the wheel's level (:func:`gemmar_aot.store.pack.encode_blobs`)."""
    return _encode_blobs(raws, ZSTD_LEVEL)


def pack_blobs(raws: Mapping[str, bytes]) -> tuple[bytes, dict]:
    """The wheel's pack file of ``raws`` (digest -> raw) and the encoding facts.

    Every blob once, the dictionary included, and every code object is decoded back from
    the finished pack and checked against its digest and size before the pack is returned.
    Deterministic for a given libzstd.

    No spare dictionary copy (the build store keeps one, issue 8 item 5): there a damaged
    dictionary would make the next build recompile every kernel, and nothing else holds
    it. An installed wheel is read-only data that pip's RECORD pins by sha256 and the
    runtime verifies per blob: a damaged dictionary is refused at load, naming the pack,
    and the fix is reinstalling the wheel -- nothing to recompile. The spare was 14 KB,
    a tenth of the reference wheel.
    """
    files, encoding = encode_blobs(raws)
    dict_digest = encoding["dictionary"]
    pack = write_pack({d: [data] for d, data in files.items()})
    reader = PackBackend(".", data=pack, where=PACK_ARCPATH)
    for d in sorted(raws):  # every byte shipped decodes back to its digest
        reader.load_blob(d, len(raws[d]))
    encoding["blob_bytes"] = sum(len(v) for d, v in files.items() if d != dict_digest)
    encoding["dictionary_file_bytes"] = len(files[dict_digest]) if dict_digest else 0
    return pack, encoding


# ---------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------


def _load_raws(lock: Mapping[str, Any], store_root: Path) -> dict[str, bytes]:
    """Every code object the lock names, verified (against digest and the lock's size)."""
    from gemmar_aot.store import BlobNotFoundError, CorruptArtifactError, Store

    st = Store(store_root, readonly=True)
    if st.format is None:
        raise WheelError(f"{store_root} is not an artifact store (no STORE_FORMAT file)")
    raws: dict[str, bytes] = {}
    problems: list[str] = []
    for d, size in sorted(lock_sizes(lock).items()):
        try:
            raws[d] = st.load_blob(d, size)
        except (BlobNotFoundError, CorruptArtifactError) as e:
            problems.append(str(e))
    if problems:
        raise WheelError(f"no wheel written: {len(problems)} blob(s) the lock names are not usable in "
                         f"{store_root}:\n" + "\n".join(f"  - {p}" for p in problems))
    return raws


def _record_index(lock: Lock, store_root: Path) -> bytes | None:
    """The lock's record index, made from the store's records (None when the store lacks one of
    them: such a wheel loads as wheels before the index did, its lock entries unbound). A record
    that is not the one the lock names is an error: the wheel would be refused at load."""
    from gemmar_aot.store import Store

    try:
        return build_index_from_store(lock, Store(store_root, readonly=True))
    except RecordMissingError:
        return None
    except RecordIndexError as e:
        raise WheelError(f"no wheel written: {e}") from None


def wheel_from_lock(lock: Lock | Mapping[str, Any] | str | os.PathLike, store_root: str | os.PathLike,
                    manifest: str | os.PathLike | None, out_dir: str | os.PathLike, *,
                    version: str | None = None, manifest_text: bytes | None = None,
                    manifest_file: str | None = None, envelope: bytes | None = None) -> dict:
    """Write the wheel of an already-built ``lock`` (a Lock, its JSON data or a path) whose blobs are in
    ``store_root``.

    ``manifest``: the manifest file the lock was built from (or pass ``manifest_text`` and
    ``manifest_file``, its bare file name); its sha256 must be the lock's. ``envelope``: the lock's
    signature envelope (:mod:`gemmar_aot.signing`), shipped as ``lock.intoto.jsonl``; default: the one
    beside a lock given as a path, if any. It must vouch for this lock's bytes. Returns a summary.
    """
    lock_path = None if isinstance(lock, (Lock, Mapping)) else Path(lock)
    if isinstance(lock, Mapping):
        lock = Lock.from_json(lock, "<lock>")
    elif not isinstance(lock, Lock):
        lock = read_lock(lock).check_parts()
    lock_bytes = lock.to_bytes()
    if envelope is None and lock_path is not None and envelope_path(lock_path).is_file():
        envelope = envelope_path(lock_path).read_bytes()
    signature = None
    if envelope is not None:
        env = read_envelope(envelope, "the lock's signature envelope")
        if env.subject[1] != hashlib.sha256(lock_bytes).hexdigest():
            raise WheelError(f"the signature envelope beside the lock vouches for other bytes (sha256 "
                             f"{env.subject[1][:16]}, the lock's is {hashlib.sha256(lock_bytes).hexdigest()[:16]}): "
                             f"the lock was rebuilt after it was signed; re-sign it (gemmar-aot sign LOCK "
                             f"--sign-key KEY) or build with --sign-key")
        signature = env.summary()
    if manifest is not None:
        manifest_text = Path(manifest).read_bytes()
        manifest_file = Path(manifest).name
    if manifest_text is None:
        raise WheelError("the manifest text is needed (the wheel records it)")
    mname = lock.manifest.name
    msha = hashlib.sha256(manifest_text).hexdigest()
    if lock.manifest.sha256 != msha:
        raise WheelError(f"the lock for {mname} was built from another version of the manifest "
                         f"{manifest_file or ''} (lock: sha256 {lock.manifest.sha256}, file: {msha}); rebuild "
                         f"the manifest, then make the wheel")
    arch = lock.arch
    dist, pkg = names(mname)
    version = check_version(version) if version else default_version(lock_bytes, lock.toolchain.profile)

    lock_file = compress_lock(lock, ZSTD_LEVEL)
    raws = _load_raws(lock, Path(store_root))
    record_index = _record_index(lock, Path(store_root))
    pack, encoding = pack_blobs(raws)
    dict_digest = encoding["dictionary"]
    try:
        description = _manifest_description(manifest_text)
    except Exception:  # noqa: BLE001 - the description is decoration
        description = ""
    build_info = {
        "format": WHEEL_FORMAT,
        "generator": f"gemmar-aot {__version__}",
        "distribution": dist,
        "package": pkg,
        "version": version,
        "arch": arch,
        "code_object_version": lock.code_object_version,
        "toolchain": {"digest": lock.toolchain.digest, "profile": lock.toolchain.profile,
                      **lock.toolchain.ingredients},
        "manifest": {"name": mname, "file": manifest_file, "sha256": msha,
                     "text": manifest_text.decode("utf-8", errors="replace")},
        "lock": {"sha256": hashlib.sha256(lock_bytes).hexdigest(), "bytes": len(lock_bytes),
                 "file": LOCK_ARCNAME, "file_bytes": len(lock_file)},
        "coverage": coverage(lock),
        "kernels": len(lock.action_keys()),
        "code_objects": len(raws),
        "raw_bytes": sum(len(r) for r in raws.values()),
        "blob_bytes": encoding["blob_bytes"],
        "dictionary_file_bytes": encoding["dictionary_file_bytes"],
        "pack_bytes": len(pack),
        "record_index": None if record_index is None else {"file": INDEX_ARCNAME, "bytes": len(record_index)},
        "encoding": encoding,
    }
    files: dict[str, bytes] = {
        f"{pkg}/BUILD_INFO.json": _canonical_json(build_info),
        f"{pkg}/__init__.py": _init_py(mname, dist, version),
        f"{pkg}/{LOCK_ARCNAME}": lock_file,
        f"{pkg}/store/STORE_FORMAT": f"{STORE_FORMAT}\n".encode(),
        f"{pkg}/{PACK_ARCPATH}": pack,
    }
    if record_index is not None:
        files[f"{pkg}/{INDEX_ARCNAME}"] = record_index
    if envelope is not None:
        files[f"{pkg}/{ENVELOPE_ARCNAME}"] = envelope
    files = {k: files[k] for k in sorted(files)}
    di = f"{dist.replace('-', '_')}-{version}.dist-info"
    files[f"{di}/METADATA"] = _metadata(dist, version, mname, arch, description)
    files[f"{di}/WHEEL"] = _wheel_file()
    files[f"{di}/entry_points.txt"] = f"[{ENTRY_POINT_GROUP}]\n{mname} = {pkg}:locate\n".encode()
    files[f"{di}/top_level.txt"] = f"{pkg}\n".encode()
    record_name = f"{di}/RECORD"
    files[record_name] = _record(files, record_name)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / wheel_filename(dist, version)
    data = _zip_bytes(files)
    _atomic_write(dest, data)
    return {
        "wheel": str(dest),
        "distribution": dist,
        "package": pkg,
        "version": version,
        "manifest": mname,
        "arch": arch,
        "toolchain": lock.toolchain.digest,
        "toolchain_profile": lock.toolchain.profile or DEFAULT_PROFILE,
        "wheel_bytes": len(data),
        "wheel_sha256": hashlib.sha256(data).hexdigest(),
        "kernels": build_info["kernels"],
        "code_objects": build_info["code_objects"],
        "raw_bytes": build_info["raw_bytes"],
        "blob_bytes": build_info["blob_bytes"],
        "dictionary": dict_digest,
        "dictionary_file_bytes": build_info["dictionary_file_bytes"],
        "lock_sha256": build_info["lock"]["sha256"],
        "coverage": build_info["coverage"],
        "signature": signature,
    }


def _manifest_description(text: bytes) -> str:
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover - python 3.10
        import tomli as tomllib
    d = tomllib.loads(text.decode()).get("manifest", {}).get("description", "")
    return " ".join(str(d).split())


def _zip_bytes(files: Mapping[str, bytes]) -> bytes:
    """A zip of ``files`` in the given order; identical input -> identical bytes."""
    date_time = zip_date_time()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zi = zipfile.ZipInfo(name, date_time=date_time)
            zi.create_system = 3  # Unix, whatever the host
            zi.external_attr = FILE_MODE << 16
            # A .zst file is one zstd frame: deflate gains nothing. The pack is stored deflated:
            # its 424 blob files each repeat a 44-byte dictionary reference and zstd frame
            # headers, which deflate takes out (88.8 -> 52.6 KB for the reference manifest);
            # pip inflates it on install, so the runtime reads the same pack bytes.
            if name.endswith(".zst"):
                zi.compress_type = zipfile.ZIP_STORED
                zf.writestr(zi, data)
            else:
                zi.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(zi, data, compresslevel=9)
    return buf.getvalue()


def _atomic_write(dest: Path, data: bytes) -> None:
    atomic_write_bytes(dest, data, mode=0o644)


def build_wheel(manifest: str | os.PathLike, out_dir: str | os.PathLike, *, store: str | os.PathLike | None = None,
                jobs: int | None = None, version: str | None = None, progress: bool = True,
                toolchain_root: str | None = None, remote: str | None = None,
                remote_read_only: bool = False, remote_required: bool = False,
                toolchain_profile: str | None = None, signers=(), sign_expires: float | None = None) -> dict:
    """Build ``manifest`` into the store (compiling only misses), then write its wheel into ``out_dir``.
    ``signers``/``sign_expires``: as for ``run_build``; the wheel carries the lock's envelope.

    ``remote*``: the shared remote cache, as for ``run_build`` (a CI packaging job after
    sharded builds finds every kernel there). ``toolchain_profile``: as for ``run_build``; the
    wheel carries that profile's lock (and says so in BUILD_INFO.json and its version).

    Raises :class:`WheelBuildFailed` (carrying the build summary) when a kernel fails to compile.
    """
    from gemmar_aot.build.pipeline import run_build

    summary = run_build(Path(manifest), store=Path(store) if store is not None else None, jobs=jobs,
                        progress=progress, toolchain_root=toolchain_root, remote=remote,
                        remote_read_only=remote_read_only, remote_required=remote_required,
                        toolchain_profile=toolchain_profile, signers=signers, sign_expires=sign_expires)
    if summary["failed"] or not summary["lock_file"]:
        raise WheelBuildFailed(summary)
    out = wheel_from_lock(summary["lock_file"], summary["store"], manifest, out_dir, version=version)
    out["build"] = summary
    return out


# ---------------------------------------------------------------------------
# inspecting
# ---------------------------------------------------------------------------


def _parse_record(text: str) -> dict[str, tuple[str, str]]:
    out = {}
    for row in csv.reader(io.StringIO(text)):
        if row:
            out[row[0]] = (row[1] if len(row) > 1 else "", row[2] if len(row) > 2 else "")
    return out


def _index_problems(lock: Lock, lock_name: str, info: Mapping[str, Any], contents: Mapping[str, bytes],
                    pkg: str) -> list[str]:
    """What is wrong with the wheel's record index: every line must be its lock's record."""
    name = f"{pkg}/{index_path(lock_name).name}"
    data = contents.get(name)
    if data is None:
        return [f"{name} is missing (BUILD_INFO.json lists it)"] if info.get("record_index") else []
    try:
        index = RecordIndex.from_bytes(data, Path(name))
    except RecordIndexError as e:
        return [str(e)]
    kernels = lock.kernels()
    got = index.records((k, e.record, e.blob.hash) for k, e in kernels.items())
    out = []
    for key, rec in sorted(got.items()):
        if not isinstance(rec, dict):
            out.append(f"{name}: " + (f"no record for action key {key}" if rec is None else
                                      f"the record of action key {key} is {rec.hash}, the lock names "
                                      f"{kernels[key].record.hash}"))
    return out


def inspect_wheel(path: str | os.PathLike, trusted_keys: Any = None) -> dict:
    """What an artifact wheel holds, and whether it is intact.

    ``signature``: who signed the lock and the provenance they signed (None: unsigned); with
    ``trusted_keys`` (:func:`gemmar_aot.signing.load_trust`) also whether it verifies against them,
    ``verified``, a failure being a problem like any other.

    Checks every file against RECORD (sha256 and size; files missing from either side),
    the lock against BUILD_INFO, the manifest text against its sha256, decodes every
    blob the lock names against its digest, and checks every line of the record index
    against the record digest the lock names. ``ok`` is False and ``problems`` lists each
    finding when anything does not match.
    """
    path = Path(path)
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise WheelError(f"{path} is not a wheel (zip): {e}") from None
    problems: list[str] = []
    with zf:
        members = {zi.filename: zi for zi in zf.infolist() if not zi.is_dir()}
        dist_infos = sorted({PurePosixPath(n).parts[0] for n in members
                             if PurePosixPath(n).parts[0].endswith(".dist-info")})
        if len(dist_infos) != 1:
            raise WheelError(f"{path}: expected one .dist-info directory, found {dist_infos or 'none'}")
        di = dist_infos[0]
        record_name = f"{di}/RECORD"
        if record_name not in members:
            raise WheelError(f"{path}: no {record_name}")

        contents: dict[str, bytes] = {}
        for n in members:
            try:
                contents[n] = zf.read(n)
            except (zipfile.BadZipFile, zlib.error) as e:  # a CRC mismatch: bytes changed in place
                problems.append(f"{n}: unreadable ({e})")
        record = _parse_record(contents.get(record_name, b"").decode("utf-8", errors="replace"))
        checked = 0
        for n in sorted(members):
            if n == record_name or n not in contents:
                continue
            if n not in record:
                problems.append(f"{n}: not listed in RECORD (added after the wheel was built)")
                continue
            want_hash, want_size = record[n]
            got_hash = _record_hash(contents[n])
            if want_hash != got_hash or str(len(contents[n])) != want_size:
                problems.append(f"{n}: RECORD says {want_hash} ({want_size} bytes), the file is {got_hash} "
                                f"({len(contents[n])} bytes): modified after the wheel was built")
            checked += 1
        for n in sorted(record):
            if n != record_name and n not in members:
                problems.append(f"{n}: listed in RECORD but missing from the wheel")

        meta = HeaderParser().parsestr(contents.get(f"{di}/METADATA", b"").decode("utf-8", errors="replace"))
        wheel_meta = HeaderParser().parsestr(contents.get(f"{di}/WHEEL", b"").decode("utf-8", errors="replace"))
        pkgs = sorted({PurePosixPath(n).parts[0] for n in members
                       if n.endswith("/BUILD_INFO.json") and len(PurePosixPath(n).parts) == 2})
        if len(pkgs) != 1:
            raise WheelError(f"{path} is not a gemmar-aot artifact wheel (no <package>/BUILD_INFO.json)")
        pkg = pkgs[0]
        try:
            info = json.loads(contents[f"{pkg}/BUILD_INFO.json"])
        except (KeyError, ValueError) as e:
            raise WheelError(f"{path}: {pkg}/BUILD_INFO.json is unreadable: {e}") from None
        lock_name = f"{pkg}/{(info.get('lock') or {}).get('file') or OLD_LOCK_ARCNAME}"
        lock_file = contents.get(lock_name)
        lock = None
        if lock_file is None:
            problems.append(f"{lock_name} is missing")
        else:
            try:
                lock = Lock.from_bytes(lock_file, lock_name).check_parts()
            except GemmarError as e:
                problems.append(str(e))
            if lock is not None and hashlib.sha256(lock.to_bytes()).hexdigest() != (info.get("lock") or {}).get(
                    "sha256"):
                problems.append(f"{lock_name} does not have the sha256 BUILD_INFO.json records")
        man = info.get("manifest") or {}
        text = man.get("text", "")
        if hashlib.sha256(text.encode()).hexdigest() != man.get("sha256"):
            problems.append("BUILD_INFO.json's manifest text does not match its sha256")
        if lock is not None and lock.manifest.sha256 != man.get("sha256"):
            problems.append("the lock was built from another manifest than the one BUILD_INFO.json records")

        pack_name = f"{pkg}/{PACK_ARCPATH}"
        pack = None
        if pack_name not in contents:
            problems.append(f"{pack_name} is missing")
        else:
            try:
                pack = PackBackend(".", data=contents[pack_name], where=pack_name)
            except StoreError as e:
                problems.append(str(e))
        raw_bytes = blob_bytes = dict_bytes = 0
        kernels = code_objects = 0
        cov: list[dict] = []
        if lock is not None:
            sizes = lock_sizes(lock)
            for d, size in sorted(sizes.items()):
                try:
                    if pack is None:
                        raise BlobNotFoundError(d, Path(pack_name))
                    raw_bytes += len(pack.load_blob(d, size))
                except StoreError as e:
                    problems.append(f"{pack_name}: blob {d}: {e}")
                    raw_bytes += size or 0
            if pack is not None:
                dicts = pack.dictionary_refs()
                blob_bytes = sum(pack.stored_bytes(d) for d in sizes)
                dict_bytes = sum(pack.stored_bytes(d) for d in dicts)
                named = {d[:PREFIX_HEX] for d in set(sizes) | dicts}
                for prefix in pack.prefixes():
                    if prefix not in named:
                        problems.append(f"{pack_name}: an entry ({prefix}...) for a blob the lock does not name")
            kernels, code_objects = len(lock.action_keys()), len(sizes)
            cov = coverage(lock)
            problems.extend(_index_problems(lock, lock_name, info, contents, pkg))
        signature = _signature(contents, pkg, lock, lock_name, trusted_keys, problems)
    dist = meta.get("Name")
    eps = contents.get(f"{di}/entry_points.txt", b"").decode("utf-8", errors="replace")
    return {
        "wheel": str(path),
        "ok": not problems,
        "problems": problems,
        "files_checked": checked,
        "distribution": dist,
        "version": meta.get("Version"),
        "requires_dist": meta.get_all("Requires-Dist") or [],
        "tag": wheel_meta.get("Tag"),
        "package": pkg,
        "entry_points": [ln.strip() for ln in eps.splitlines() if "=" in ln],
        "arch": info.get("arch"),
        "code_object_version": info.get("code_object_version"),
        "toolchain": info.get("toolchain"),
        "manifest": {k: man.get(k) for k in ("name", "file", "sha256", "text")},
        "generator": info.get("generator"),
        "coverage": cov,
        "kernels": kernels,
        "code_objects": code_objects,
        "sizes": {
            "wheel_bytes": path.stat().st_size,
            "blob_bytes": blob_bytes,
            "dictionary_file_bytes": dict_bytes,
            "raw_bytes": raw_bytes,
        },
        "encoding": info.get("encoding"),
        "signature": signature,
    }


def _signature(contents: Mapping[str, bytes], pkg: str, lock: Lock | None, lock_name: str, trusted_keys: Any,
               problems: list[str]) -> dict | None:
    """The wheel's envelope, read (and verified against ``trusted_keys`` when given); a finding goes
    to ``problems``."""
    from gemmar_aot.model.codec import plain_lock_bytes
    from gemmar_aot.signing import describe_signature, trust_from

    if lock is None:
        return None
    name = f"{pkg}/{ENVELOPE_ARCNAME}"
    trust = trust_from(trusted_keys) if trusted_keys is not None else None
    # the bytes the wheel ships, as a pod reads them (never a re-serialisation of what was parsed)
    out, problem = describe_signature(contents.get(name), plain_lock_bytes(contents[lock_name], lock_name),
                                      lock_name, name, trust)
    if problem:
        problems.append(problem)
    return out
