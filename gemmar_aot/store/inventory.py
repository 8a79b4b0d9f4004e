"""What the store holds and whether it is intact: ls, stats and verify, and the scans of the
store's files (every blob's and record's first bytes) that they and the other maintenance
modules (:mod:`.gc`, :mod:`.transfer`, :mod:`.dictionaries`) start from.

Each function takes a :class:`~gemmar_aot.store.Store` and uses only its public interface
(and that of its local :class:`~gemmar_aot.store.local.DirectoryBackend`, ``store.local``).
Each returns plain data (lists/dicts of str/int/None) so the CLI's ``--json`` is a
``json.dumps`` away. None of them is needed at serving time; the store never imports this.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import blobfmt
from ._fs import iter_stray
from .backend import BadRecord, record_blob, record_launcher
from .cas import Store
from .blob_codec import BadBlob
from .store_errors import StoreError
from .local import BLOB_SUFFIX, DICT_POINTERS, RECORD_SUFFIX


@dataclass
class BlobInfo:
    path: Path
    file_bytes: int
    mtime: float
    dict_ref: str | None
    raw_size: int | None
    error: str = ""


def scan_blobs(store: Store) -> dict[str, BlobInfo]:
    """Every published blob, from its first bytes only (no decompression)."""
    out: dict[str, BlobInfo] = {}
    for digest, p in store.local.iter_blob_files():
        try:
            st = p.stat()
            with open(p, "rb") as f:
                head = f.read(blobfmt.PEEK_BYTES)
        except FileNotFoundError:
            continue
        try:
            dict_ref, size = blobfmt.peek(head)
            err = ""
        except blobfmt.BlobFormatError as e:
            dict_ref, size, err = None, None, str(e)
        out[digest] = BlobInfo(p, st.st_size, st.st_mtime, dict_ref, size, err)
    return out


def record_dict_refs(store: Store) -> Counter[str]:
    """dictionary digest -> how many record files name it (from their first bytes)."""
    refs: Counter[str] = Counter()
    for _key, p in store.local.iter_record_files():
        try:
            with open(p, "rb") as f:
                ref = blobfmt.split(f.read(blobfmt.DICT_REF_LEN))[0]
        except (OSError, blobfmt.BlobFormatError):
            continue
        if ref:
            refs[ref] += 1
    return refs


def dictionary_digests(store: Store, blobs: Mapping[str, BlobInfo] | None = None) -> set[str]:
    """The digests of every zstd dictionary in the store (blobs that are not code objects): named
    by a blob of ``blobs`` (default: :func:`scan_blobs`) or by a record, or current for blobs or
    records."""
    if blobs is None:
        blobs = scan_blobs(store)
    ds = {b.dict_ref for b in blobs.values() if b.dict_ref} | set(record_dict_refs(store))
    for kind in DICT_POINTERS:
        info = store.dictionary_info(kind)
        if info:
            ds.add(info["hash"])
    return ds


# ---- ls / stats ----

def ls(store: Store, filter: Callable[[dict], bool] | None = None) -> list[dict]:  # noqa: A002
    """Every readable record (sorted by key) for which ``filter(record)`` is true."""
    out = []
    for key, _p in store.local.iter_record_files():
        rec = store.read_record_file(key)
        if rec is not None and (filter is None or filter(rec)):
            out.append(rec)
    return out


def stats(store: Store) -> dict:
    """Sizes and counts of the store, and the hits/misses of the last build."""
    blobs = scan_blobs(store)
    dicts = dictionary_digests(store, blobs)
    code = [b for d, b in blobs.items() if d not in dicts]
    entries = 0
    record_bytes = 0
    for _k, p in store.local.iter_record_files():
        with contextlib.suppress(OSError):
            record_bytes += p.stat().st_size
            entries += 1
    raw = sum(b.raw_size or 0 for b in code)
    comp = sum(b.file_bytes for b in code)
    quarantined = 0
    if store.quarantine_dir.is_dir():
        quarantined = sum(1 for p in store.quarantine_dir.iterdir() if not p.name.endswith(".reason"))
    info = store.dictionary_info()
    rec_info = store.dictionary_info("records")
    spare_bytes = 0
    for d in dicts:
        with contextlib.suppress(OSError):
            spare_bytes += store.local.spare_path(d).stat().st_size
    dict_bytes = sum(blobs[d].file_bytes for d in dicts if d in blobs)
    return {
        "root": str(store.root),
        "format": store.format,
        "entries": entries,
        "blobs": len(code),
        "raw_bytes": raw,
        "compressed_bytes": comp,
        "ratio": round(raw / comp, 3) if comp else None,
        "dictionaries": len([d for d in dicts if d in blobs]),
        "dictionary_bytes": dict_bytes,
        "dictionary_spare_bytes": spare_bytes,
        "current_dictionary": info["hash"] if info else None,
        "current_record_dictionary": rec_info["hash"] if rec_info else None,
        "record_bytes": record_bytes,
        "total_bytes": comp + record_bytes + dict_bytes + spare_bytes,
        "quarantined": quarantined,
        "last_build": store.last_build_stats(),
    }


# ---- verify ----

def _problem(kind: str, path: Path, problem: str, q: Path | None = None) -> dict:
    return {"kind": kind, "path": str(path), "problem": problem,
            "quarantined_to": str(q) if q is not None else None}


@dataclass
class Health:
    """What :func:`verify` found, in two kinds that are never mixed:

    - ``damage``: corrupt, mismatched, foreign or missing code -- a file that cannot be used
      as it is (quarantined where it is a file of its own). A store with damage fails ``verify``.
    - ``degraded``: the store serves every entry it holds, but some of them cannot be derived
      again without the network -- records whose launcher blob is not here (a remote cache's
      per-key hits before launchers travelled, an import of such a store). It costs
      recompiles at the next change of derive code, unless a remote cache serves the launchers
      then; ``gemmar-aot verify --remote URL`` fetches them now. Never damage: ``verify`` passes
      unless ``--strict``.
    """

    damage: list[dict]
    degraded: list[dict]

    @property
    def clean(self) -> bool:
        """Neither damage nor anything degraded."""
        return not self.damage and not self.degraded


#: ``record_check(record, load)``: why a record contradicts its own blobs, or None (``load(Digest)``
#: gives a blob's verified bytes, None when absent). The compiler's derive step supplies it
#: (``gemmar_aot.compiler.derive_check.RecordCheck``): the store knows nothing of derivation.
RecordCheck = Callable[[Mapping, Callable], "str | None"]


def verify(store: Store, record_check: RecordCheck | None = None) -> Health:
    """Decode and check every blob and record. Bad files are quarantined. Returns what was found.

    With ``record_check``, every record -- in the action cache and in each lock's record index,
    where a pod reads them -- is also held against its own blobs: a record that contradicts them
    is damage (the action-cache file is quarantined; a lock naming one is reported, for a rebuild
    to replace)."""
    problems: list[dict] = []
    for p in iter_stray(store.blob_dir, BLOB_SUFFIX):
        problems.append(_problem("stray", p, "not a blob file name; ignored by the store"))
    for p in iter_stray(store.ac_dir, RECORD_SUFFIX):
        problems.append(_problem("stray", p, "not a record file name; ignored by the store"))
    blobs = scan_blobs(store)
    dicts = dictionary_digests(store, blobs)
    # Dictionaries first, so a bad dictionary is reported as itself.
    for digest in sorted(blobs, key=lambda d: (d not in dicts, d)):
        info = blobs[digest]
        try:
            data = info.path.read_bytes()
        except FileNotFoundError:
            continue  # quarantined with its dictionary, or removed under us
        try:
            if digest in dicts:
                store.local.codec.decode_dictionary(data, digest)
            else:
                store.local.codec.decode(data, digest)
        except BadBlob as e:
            q = store.quarantine(info.path, str(e))
            problems.append(_problem("dictionary" if digest in dicts else "blob", info.path, str(e), q))
    # Each dictionary's spare copy: restored from the blob when damaged or missing.
    for digest in sorted(dicts):
        sp = store.local.spare_path(digest)
        try:
            store.local.codec.decode_dictionary(sp.read_bytes(), digest)
            continue
        except FileNotFoundError:
            why = "missing"
        except BadBlob as e:
            why = str(e)
        if not store.has_blob(digest):
            continue  # reported above (or the pointer check below)
        q = store.quarantine(sp, f"dictionary spare copy: {why}") if sp.exists() else None
        with contextlib.suppress(OSError, StoreError):
            store.local.write_file(sp, store.blob_path(digest).read_bytes())
            why += "; rewritten from the blob"
        problems.append(_problem("dictionary spare", sp, why, q))
    found, no_launcher = _verify_records(store, blobs, record_check)
    problems += found
    for kind, pointer in DICT_POINTERS.items():
        info = store.dictionary_info(kind)
        if info and not store.blob_path(info["hash"]).is_file():
            problems.append(_problem("dictionary", store.root / pointer,
                                     f"names dictionary {info['hash']}, which is not in the store; new "
                                     f"{kind} are written without a dictionary"))
    if record_check is not None:
        problems += lock_record_problems(store, record_check)
    return Health(problems, [missing_launchers(store, no_launcher)] if no_launcher else [])


def _verify_records(store: Store, blobs: Mapping[str, BlobInfo],
                    record_check: RecordCheck | None) -> tuple[list[dict], list[dict]]:
    """Every action-cache record decoded and held against its blob (and, with ``record_check``,
    against what its blobs derive to): (damage, records whose launcher is not here)."""
    problems: list[dict] = []
    no_launcher: list[dict] = []
    for key, p in store.local.iter_record_files():
        try:
            rec = store.local.decode_record(p.read_bytes(), key)
        except FileNotFoundError:
            continue
        except (BadRecord, BadBlob) as e:
            q = store.quarantine(p, f"unreadable record: {e}")
            problems.append(_problem("record", p, f"unreadable record: {e}", q))
            continue
        if record_check is not None:
            why = record_check(rec, lambda d: _verified_blob(store, d))
            if why is not None:
                why += "; quarantined: the next build compiles the kernel again"
                problems.append(_problem("record", p, why, store.quarantine(p, why)))
                continue
        ln = record_launcher(rec)
        if ln is not None and not store.blob_path(ln.hash).is_file():
            no_launcher.append({"key": key, "launcher": ln.hash, "size": ln.size,
                                "compile_seconds": rec.get("compile_seconds")})
        blob = record_blob(rec)
        d, size = blob.hash, blob.size
        if not store.blob_path(d).is_file():
            problems.append(_problem("record", p, f"its blob {d} is missing: the key is a miss (gc removes it)"))
        elif blobs.get(d) and blobs[d].raw_size is not None and blobs[d].raw_size != size:
            why = f"says its blob {d} has {size} bytes, the blob has {blobs[d].raw_size}"
            problems.append(_problem("record", p, why, store.quarantine(p, why)))
    return problems, no_launcher


def _verified_blob(store: Store, d) -> bytes | None:
    """Blob ``d``'s verified bytes, or None when it is missing or damaged (reported on its own)."""
    from .store_errors import BlobNotFoundError, CorruptArtifactError

    try:
        return store.load_blob(d.hash, d.size)
    except (BlobNotFoundError, CorruptArtifactError):
        return None


def lock_record_problems(store: Store, record_check: RecordCheck) -> list[dict]:
    """Each lock whose record index holds a record that contradicts its own blobs: what a pod of
    that lock would launch. A lock this gemmar-aot cannot read (another schema, no index) is not
    damage here: ``inspect`` and the pod say what it is."""
    from gemmar_aot.model.bundle import LOCK_SUFFIX, LockBundle
    from gemmar_aot.model.lock import read_lock

    from .record_index import RecordIndex

    out = []
    for lp in sorted(store.lock_dir.glob("*" + LOCK_SUFFIX)):
        try:
            lock = read_lock(lp)
            index = RecordIndex.read(LockBundle(lp).record_index)
        except (ValueError, OSError, StoreError):
            continue
        if index is None:
            continue
        kernels = lock.kernels()
        recs = index.records([(k, e.record, e.blob.hash) for k, e in kernels.items()], whole=True)
        bad = []
        for key, rec in recs.items():
            if not isinstance(rec, dict):
                continue  # a line that does not hash to the lock's digest: the pod refuses it by itself
            why = record_check(rec, lambda dg: _verified_blob(store, dg))
            if why is not None:
                bad.append(why)
        if bad:
            m = lock.manifest
            problems = "; ".join(bad[:2]) + (f"; and {len(bad) - 2} more" if len(bad) > 2 else "")
            out.append(_problem(
                "lock", lp, f"its record index names {len(bad)} record(s) that contradict their own blobs, which a "
                f"pod would launch as written: {problems}. Fix: rebuild its manifest ({m.name}: gemmar-aot build "
                f"MANIFEST --store {store.root}), which compiles those kernels again and writes a new lock"))
    return out


def missing_launchers(store: Store, entries: list[dict]) -> dict:
    """The ``degraded`` finding for records whose launcher is not in the store: how many, what
    that costs (the compile time their records measured), and the fix."""
    secs = sum(e["compile_seconds"] or 0 for e in entries)
    return {
        "kind": "launcher",
        "count": len(entries),
        "entries": sorted(entries, key=lambda e: e["key"]),
        "compile_seconds": round(secs, 1),
        "problem": (f"{len(entries)} record(s) have no launcher in this store: they are served as they are, "
                    f"but cannot be derived again without the network; a change of derive code recompiles "
                    f"them (~{secs:.0f} s of compile, as their records measured) unless a remote cache "
                    f"serves their launchers then"),
        "fix": (f"gemmar-aot verify --store {store.root} --remote URL fetches the {len(entries)} launcher(s) "
                f"from the remote cache that served these entries (each checked against its digest)"),
    }


def fetch_launchers(store: Store, finding: dict, backend) -> dict:
    """Fetch the launchers of a :func:`missing_launchers` finding from ``backend`` (a remote
    cache backend; its blobs are verified by it and again by the local store's write).
    Returns {"fetched", "absent", "failed": [reason]}."""
    from concurrent.futures import ThreadPoolExecutor

    from gemmar_aot.model.types import Digest

    def one(e):
        try:
            data = backend.get_blob(Digest(e["launcher"], e["size"]))
        except Exception as exc:  # noqa: BLE001 - reported per launcher, the others go on
            return "failed", f"{e['launcher']}: {exc}"
        if data is None:
            return "absent", e["launcher"]
        store.local.put_blob(data)
        return "fetched", e["launcher"]

    out: dict = {"fetched": 0, "absent": [], "failed": []}
    wanted = {e["launcher"]: e for e in finding["entries"]}  # records may share a launcher
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="launcher") as pool:
        for status, what in pool.map(one, wanted.values()):
            if status == "fetched":
                out["fetched"] += 1
            else:
                out[status].append(what)
    return out
