"""Writing an artifact wheel: one manifest's kernels as a pip-installable, reproducible wheel.

``gemmar-aot wheel MANIFEST --out DIR`` builds the manifest (:func:`gemmar_aot.builder.pipeline.run_build`,
which compiles only what the store misses) and writes ONE wheel holding its lock file and
exactly the code objects the lock names, as a store directory inside an import package
(:mod:`.wheel_layout` says what is where). Serving pods ``pip install`` it; the runtime finds it
through the entry-point group ``gemmar_aot.artifacts`` (see :mod:`gemmar_aot.runtime.artifacts`),
no path or env var needed.

:func:`wheel_from_lock` goes in steps, each checking what it takes before anything is written:
the lock and its signature (:class:`SignedLock`), the manifest it was built from
(:class:`ManifestSource`), the wheel's name and version (:class:`WheelName`), what the store
gives for it (:class:`StoreContent`: every code object verified, packed and read back), the
files in their order; then one atomic write of the zip.

Reproducible: the same lock gives the same wheel bytes, whatever the store's history, the
checkout path, the machine or the clock. Blobs are *re-encoded canonically* rather than
copied (a store's files depend on which dictionary it had trained when they were written):
decoded and verified, a zstd dictionary trained on exactly the wheel's code objects in
digest order (:func:`gemmar_aot.store.dictionaries.train_best_dictionary`; deterministic, or none
when it does not pay), each blob compressed at level 19 with it. Zip entries are in a fixed order
(package files sorted, then METADATA, WHEEL, entry_points.txt, top_level.txt, RECORD), dated 1980-01-01 (or
``$SOURCE_DATE_EPOCH``, clamped to the zip range), mode 0644, Unix; the ``.zst`` files are
STORED, everything else (the pack included) DEFLATED at level 9 (:mod:`.archive`). "Same
toolchain" therefore also means the same python-zstandard/libzstd (recorded in BUILD_INFO) and zlib.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gemmar_aot import __version__
from gemmar_aot.util.atomic_write import atomic_write_bytes
from gemmar_aot.util.canonical_json import canonical_json_bytes
from gemmar_aot.model.lock import ENTRY_POINT_GROUP, Lock, compress_lock, read_lock
from gemmar_aot.trust.envelope import read_envelope
from gemmar_aot.model.bundle import LockBundle
from gemmar_aot.store import STORE_FORMAT, BlobNotFoundError, CorruptArtifactError, Store
from gemmar_aot.store.pack import PackBackend, write_pack
from gemmar_aot.store.pack_encode import encode_blobs
from gemmar_aot.store.record_index import RecordIndexError, RecordMissingError, build_index_from_store
from gemmar_aot.toolchain.profiles import DEFAULT_PROFILE

from .archive import record_file, zip_bytes
from .wheel_layout import (ENVELOPE_ARCNAME, INDEX_ARCNAME, LOCK_ARCNAME, PACK_ARCPATH, TAG, WHEEL_FORMAT, WheelError,
                     check_version, coverage, default_version, lock_sizes, names, requires_dist, wheel_filename)
from gemmar_aot.util.filedigest import sha256_hex

#: zstd level of the shipped blobs (as the store's DEFAULT_LEVEL; see bench/bench_store.py).
ZSTD_LEVEL = 19


class WheelBuildFailed(WheelError):
    """The manifest's build failed; ``summary`` is :func:`run_build`'s summary (failures listed)."""

    def __init__(self, summary: dict):
        self.summary = summary
        super().__init__(f"the build of {summary.get('manifest')} failed ({summary.get('failed')} kernel(s)); "
                         f"no wheel was written")


def wheel_from_lock(lock: Lock | Mapping[str, Any] | str | os.PathLike, store_root: str | os.PathLike,
                    manifest: str | os.PathLike | None, out_dir: str | os.PathLike, *,
                    version: str | None = None, manifest_text: bytes | None = None,
                    manifest_file: str | None = None, envelope: bytes | None = None) -> dict:
    """Write the wheel of an already-built ``lock`` (a Lock, its JSON data or a path) whose blobs are in
    ``store_root``.

    ``manifest``: the manifest file the lock was built from (or pass ``manifest_text`` and
    ``manifest_file``, its bare file name); its sha256 must be the lock's. ``envelope``: the lock's
    signature envelope (:mod:`gemmar_aot.trust`), shipped as ``lock.intoto.jsonl``; default: the one
    beside a lock given as a path, if any. It must vouch for this lock's bytes. Returns a summary.
    """
    signed = _signed_lock(lock, envelope)
    store = _open_store(Path(store_root))
    return _write_wheel(signed, _manifest_source(signed.lock, manifest, manifest_text, manifest_file),
                        _store_content(signed.lock, store, _record_index(signed.lock, store)), out_dir, version)


def wheel_from_build(built: Any, out_dir: str | os.PathLike, *, version: str | None = None) -> dict:
    """Write the wheel of a build that just ran (``gemmar_aot.builder.pipeline.Built``), from what it
    holds in memory: the manifest it read, its lock (serialised once), the record index it wrote
    beside the lock, the code objects it verified for the lock's blob index. Nothing is read again.
    The same lock gives the same bytes as :func:`wheel_from_lock`."""
    lock_path = Path(built.summary["lock_file"])
    env_file = LockBundle(lock_path).envelope
    signed = _signed_lock(built.lock, env_file.read_bytes() if env_file.is_file() else None)
    m = built.manifest
    source = _checked_source(signed.lock, ManifestSource(m.text, Path(m.path).name, m.sha256,
                                                         " ".join(m.description.split())))
    return _write_wheel(signed, source, _store_content(signed.lock, built.store, built.record_index, built.blobs),
                        out_dir, version)


def _write_wheel(signed: "SignedLock", source: "ManifestSource", content: "StoreContent",
                 out_dir: str | os.PathLike, version: str | None) -> dict:
    name = _wheel_name(signed, version)
    build_info = _build_info(signed, source, name, content)
    data = zip_bytes(_wheel_files(signed, source, name, content, build_info))
    dest = Path(out_dir) / name.filename
    dest.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(dest, data, mode=0o644)
    return _summary(dest, data, signed, name, content, build_info)


@dataclass(frozen=True)
class SignedLock:
    """The lock a wheel ships, its canonical bytes and their sha256, and its signature envelope
    with what the envelope says (both None: unsigned)."""

    lock: Lock
    lock_bytes: bytes
    sha256: str
    envelope: bytes | None
    signature: dict | None


def _signed_lock(lock: Lock | Mapping[str, Any] | str | os.PathLike, envelope: bytes | None) -> SignedLock:
    """The lock, read and checked; the envelope given, else the one beside a lock given as a path;
    an envelope that vouches for other bytes is refused."""
    lock_path = None if isinstance(lock, (Lock, Mapping)) else Path(lock)
    if isinstance(lock, Mapping):
        lock = Lock.from_json(lock, "<lock>")
    elif not isinstance(lock, Lock):
        lock = read_lock(lock).check_parts()
    lock_bytes = lock.to_bytes()
    sha256 = sha256_hex(lock_bytes)
    if envelope is None and lock_path is not None and LockBundle(lock_path).envelope.is_file():
        envelope = LockBundle(lock_path).envelope.read_bytes()
    signature = None
    if envelope is not None:
        env = read_envelope(envelope, "the lock's signature envelope")
        if env.subject[1] != sha256:
            raise WheelError(f"the signature envelope beside the lock vouches for other bytes (sha256 "
                             f"{env.subject[1][:16]}, the lock's is {sha256[:16]}): "
                             f"the lock was rebuilt after it was signed; re-sign it (gemmar-aot sign LOCK "
                             f"--sign-key KEY) or build with --sign-key")
        signature = env.summary()
    return SignedLock(lock, lock_bytes, sha256, envelope, signature)


@dataclass(frozen=True)
class ManifestSource:
    """The manifest text the lock was built from (BUILD_INFO.json carries it), its file name and
    sha256, and its ``[manifest] description`` (for METADATA)."""

    text: bytes
    file: str | None
    sha256: str
    description: str


def _manifest_source(lock: Lock, manifest: str | os.PathLike | None, text: bytes | None,
                     file: str | None) -> ManifestSource:
    """The manifest's text from ``manifest`` (a path) or ``text``; refused unless it is the one the lock names."""
    if manifest is not None:
        text = Path(manifest).read_bytes()
        file = Path(manifest).name
    if text is None:
        raise WheelError("the manifest text is needed (the wheel records it): pass manifest (the file the "
                         "lock was built from), or manifest_text and manifest_file")
    try:
        description = _manifest_description(text)
    except Exception:  # noqa: BLE001 - the description is decoration
        description = ""
    return _checked_source(lock, ManifestSource(text, file, sha256_hex(text), description))


def _checked_source(lock: Lock, source: ManifestSource) -> ManifestSource:
    """``source``, refused unless it is the manifest the lock names."""
    if lock.manifest.sha256 != source.sha256:
        raise WheelError(f"the lock for {lock.manifest.name} was built from another version of the manifest "
                         f"{source.file or ''} (lock: sha256 {lock.manifest.sha256}, file: {source.sha256}); "
                         f"rebuild the manifest, then make the wheel")
    return source


def _manifest_description(text: bytes) -> str:
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover - python 3.10
        import tomli as tomllib
    d = tomllib.loads(text.decode()).get("manifest", {}).get("description", "")
    return " ".join(str(d).split())


@dataclass(frozen=True)
class WheelName:
    """The wheel's distribution name, import package and version (:mod:`.wheel_layout`)."""

    dist: str
    pkg: str
    version: str

    @property
    def filename(self) -> str:
        return wheel_filename(self.dist, self.version)

    @property
    def dist_info(self) -> str:
        return f"{self.dist.replace('-', '_')}-{self.version}.dist-info"


def _wheel_name(signed: SignedLock, version: str | None) -> WheelName:
    """Named after the lock's manifest; ``version`` checked, else the default from the lock's bytes."""
    dist, pkg = names(signed.lock.manifest.name)
    version = check_version(version) if version else default_version(signed.lock_bytes, signed.lock.toolchain.profile)
    return WheelName(dist, pkg, version)


@dataclass(frozen=True)
class StoreContent:
    """What the wheel carries of the store and the lock: the compressed lock, the lock's code
    objects (verified) and their pack with its encoding facts, and the record index (None when
    the store lacks a record the lock names)."""

    lock_file: bytes
    raws: Mapping[str, bytes]
    record_index: bytes | None
    pack: bytes
    encoding: dict


def _open_store(store_root: Path) -> Store:
    st = Store(store_root, readonly=True)
    if st.format is None:
        raise WheelError(f"{store_root} is not an artifact store (no STORE_FORMAT file)")
    return st


def _store_content(lock: Lock, st: Store, record_index: bytes | None,
                   blobs: Mapping[str, bytes] | None = None) -> StoreContent:
    """What the wheel carries of the store: ``blobs`` (the code objects a build just verified),
    else each read from ``st`` and verified."""
    lock_file = compress_lock(lock, ZSTD_LEVEL)
    raws = _load_raws(lock, st) if blobs is None else {d: blobs[d] for d in sorted(lock_sizes(lock))}
    pack, encoding = pack_blobs(raws)
    return StoreContent(lock_file, raws, record_index, pack, encoding)


def _load_raws(lock: Lock, st: Store) -> dict[str, bytes]:
    """Every code object the lock names, verified (against digest and the lock's size)."""
    store_root = st.root
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


def _record_index(lock: Lock, st: Store) -> bytes | None:
    """The lock's record index, made from the store's records (None when the store lacks one of
    them: such a wheel loads as wheels before the index did, its lock entries unbound). A record
    that is not the one the lock names is an error: the wheel would be refused at load."""
    try:
        return build_index_from_store(lock, st)
    except RecordMissingError:
        return None
    except RecordIndexError as e:
        raise WheelError(f"no wheel written: {e}") from None


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
    files, encoding = encode_blobs(raws, ZSTD_LEVEL)
    dict_digest = encoding["dictionary"]
    pack = write_pack({d: [data] for d, data in files.items()})
    reader = PackBackend(".", data=pack, where=PACK_ARCPATH)
    for d in sorted(raws):  # every byte shipped decodes back to its digest
        reader.load_blob(d, len(raws[d]))
    encoding["blob_bytes"] = sum(len(v) for d, v in files.items() if d != dict_digest)
    encoding["dictionary_file_bytes"] = len(files[dict_digest]) if dict_digest else 0
    return pack, encoding


def _build_info(signed: SignedLock, source: ManifestSource, name: WheelName, content: StoreContent) -> dict:
    """BUILD_INFO.json: what the wheel was built from and holds (``gemmar-aot inspect`` shows it)."""
    lock = signed.lock
    return {
        "format": WHEEL_FORMAT,
        "generator": f"gemmar-aot {__version__}",
        "distribution": name.dist,
        "package": name.pkg,
        "version": name.version,
        "arch": lock.arch,
        "code_object_version": lock.code_object_version,
        "toolchain": {"digest": lock.toolchain.digest, "profile": lock.toolchain.profile,
                      **lock.toolchain.ingredients},
        "manifest": {"name": lock.manifest.name, "file": source.file,
                     "digest": {"hash": source.sha256, "size": len(source.text)},
                     "text": source.text.decode("utf-8", errors="replace")},
        "lock": {"digest": {"hash": signed.sha256, "size": len(signed.lock_bytes)},
                 "file": LOCK_ARCNAME, "file_size": len(content.lock_file)},
        "coverage": coverage(lock),
        "kernels": len(lock.action_keys()),
        "code_objects": len(content.raws),
        "raw_bytes": sum(len(r) for r in content.raws.values()),
        "blob_bytes": content.encoding["blob_bytes"],
        "dictionary_file_bytes": content.encoding["dictionary_file_bytes"],
        "pack_bytes": len(content.pack),
        "record_index": (None if content.record_index is None
                         else {"file": INDEX_ARCNAME, "size": len(content.record_index)}),
        "encoding": content.encoding,
    }


def _wheel_files(signed: SignedLock, source: ManifestSource, name: WheelName, content: StoreContent,
                 build_info: dict) -> dict[str, bytes]:
    """Every file of the wheel in its order: the package's sorted, then the .dist-info's, RECORD last."""
    pkg, mname = name.pkg, signed.lock.manifest.name
    files: dict[str, bytes] = {
        f"{pkg}/BUILD_INFO.json": canonical_json_bytes(build_info),
        f"{pkg}/__init__.py": _init_py(mname, name.dist, name.version),
        f"{pkg}/{LOCK_ARCNAME}": content.lock_file,
        f"{pkg}/store/STORE_FORMAT": f"{STORE_FORMAT}\n".encode(),
        f"{pkg}/{PACK_ARCPATH}": content.pack,
    }
    if content.record_index is not None:
        files[f"{pkg}/{INDEX_ARCNAME}"] = content.record_index
    if signed.envelope is not None:
        files[f"{pkg}/{ENVELOPE_ARCNAME}"] = signed.envelope
    files = {k: files[k] for k in sorted(files)}
    di = name.dist_info
    files[f"{di}/METADATA"] = _metadata(name.dist, name.version, mname, signed.lock.arch, source.description)
    files[f"{di}/WHEEL"] = _wheel_file()
    files[f"{di}/entry_points.txt"] = f"[{ENTRY_POINT_GROUP}]\n{mname} = {pkg}:locate\n".encode()
    files[f"{di}/top_level.txt"] = f"{pkg}\n".encode()
    record_name = f"{di}/RECORD"
    files[record_name] = record_file(files, record_name)
    return files


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


def _summary(dest: Path, data: bytes, signed: SignedLock, name: WheelName, content: StoreContent,
             build_info: dict) -> dict:
    """What :func:`wheel_from_lock` returns (``gemmar-aot wheel --json``)."""
    lock = signed.lock
    return {
        "wheel": str(dest),
        "distribution": name.dist,
        "package": name.pkg,
        "version": name.version,
        "manifest": lock.manifest.name,
        "arch": lock.arch,
        "toolchain": lock.toolchain.digest,
        "toolchain_profile": lock.toolchain.profile or DEFAULT_PROFILE,
        "wheel_bytes": len(data),
        "wheel_sha256": sha256_hex(data),
        "kernels": build_info["kernels"],
        "code_objects": build_info["code_objects"],
        "raw_bytes": build_info["raw_bytes"],
        "blob_bytes": build_info["blob_bytes"],
        "dictionary": content.encoding["dictionary"],
        "dictionary_file_bytes": build_info["dictionary_file_bytes"],
        "lock_sha256": signed.sha256,
        "coverage": build_info["coverage"],
        "signature": signed.signature,
    }


def build_wheel(manifest: str | os.PathLike, out_dir: str | os.PathLike, *, store: str | os.PathLike | None = None,
                jobs: int | None = None, version: str | None = None, progress: bool = True,
                toolchain_root: str | None = None, remote: str | None = None,
                remote_read_only: bool = False, remote_required: bool = False,
                toolchain_profile: str | None = None, signers=(), sign_expires: float | None = None,
                compile_key=None, trusted_compile_keys=None) -> dict:
    """Build ``manifest`` into the store (compiling only misses), then write its wheel into ``out_dir``.
    ``signers``/``sign_expires``: as for ``run_build``; the wheel carries the lock's envelope.
    ``compile_key``/``trusted_compile_keys``: as for ``run_build`` (a release wheel takes only the
    remote entries a trusted builder signed).

    ``remote*``: the shared remote cache, as for ``run_build`` (a CI packaging job after
    sharded builds finds every kernel there). ``toolchain_profile``: as for ``run_build``; the
    wheel carries that profile's lock (and says so in BUILD_INFO.json and its version).

    Raises :class:`WheelBuildFailed` (carrying the build summary) when a kernel fails to compile.
    """
    from gemmar_aot.builder.manifest import load_manifest
    from gemmar_aot.builder.pipeline import build

    built = build(load_manifest(manifest), store=Path(store) if store is not None else None, jobs=jobs,
                  progress=progress, toolchain_root=toolchain_root, remote=remote,
                  remote_read_only=remote_read_only, remote_required=remote_required,
                  toolchain_profile=toolchain_profile, signers=signers, sign_expires=sign_expires,
                  compile_key=compile_key, trusted_compile_keys=trusted_compile_keys)
    if built.summary["failed"] or built.lock is None:
        raise WheelBuildFailed(built.summary)
    out = wheel_from_build(built, out_dir, version=version)
    out["build"] = built.summary
    return out
