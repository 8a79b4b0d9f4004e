"""Maintenance: ls, stats, verify, gc, export/import, and dictionary training/repacking.

Each function takes a :class:`~gemmar_aot.store.Store` and uses only its public interface
(and that of its local :class:`~gemmar_aot.store.local.DirectoryBackend`, ``store.local``).
Each returns plain data (lists/dicts of str/int/None) so the CLI's ``--json`` is a
``json.dumps`` away. None of them is needed at serving time; the store never imports this.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zstandard

from . import blobfmt
from ._fs import is_hex64, iter_fanned, iter_stray, remove_stale_temps
from .backend import BadRecord, record_blobs, record_launcher
from .cas import Store
from .codec import BadBlob
from .errors import CorruptArtifactError, StoreError, StoreFormatError
from .local import BLOB_SUFFIX, CLAIM_SUFFIX, DICT_POINTERS, FORMAT_FILE, RECORD_SUFFIX

#: Temp files and lock files older than this are debris (a writer that was killed).
STALE_S = 3600.0
#: Fewer code objects than this: no dictionary (zstd's trainer needs samples, and the gain is small).
MIN_DICT_SAMPLES = 32
#: zstd's own default maximum dictionary size.
MAX_DICT_BYTES = 112 * 1024
#: A dictionary is used only if blobs + dictionary are this many times smaller than plain zstd.
MIN_DICT_GAIN = 1.25
#: Record dictionary size cap: records share most of their text (ingredients, launch records).
RECORD_DICT_BYTES = 64 * 1024
#: Sample bytes read for training at most (zstd wants ~100x the dictionary size; more only costs time).
MAX_SAMPLE_BYTES = 64 << 20


@dataclass
class _BlobInfo:
    path: Path
    file_bytes: int
    mtime: float
    dict_ref: str | None
    raw_size: int | None
    error: str = ""


def _scan_blobs(store: Store) -> dict[str, _BlobInfo]:
    """Every published blob, from its first bytes only (no decompression)."""
    out: dict[str, _BlobInfo] = {}
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
        out[digest] = _BlobInfo(p, st.st_size, st.st_mtime, dict_ref, size, err)
    return out


def _record_dict_refs(store: Store) -> Counter[str]:
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


def dictionary_digests(store: Store) -> set[str]:
    """The digests of every zstd dictionary in the store (blobs that are not code objects)."""
    return _dictionary_digests(store, _scan_blobs(store))


def _dictionary_digests(store: Store, blobs: Mapping[str, _BlobInfo]) -> set[str]:
    """Every dictionary: named by a blob or a record, or current for blobs or records."""
    ds = {b.dict_ref for b in blobs.values() if b.dict_ref} | set(_record_dict_refs(store))
    for kind in DICT_POINTERS:
        info = store.dictionary_info(kind)
        if info:
            ds.add(info["digest"])
    return ds


def _record_files(store: Store) -> Iterable[tuple[str, Path]]:
    return store.local.iter_record_files()


# ---- ls / stats ----

def ls(store: Store, filter: Callable[[dict], bool] | None = None) -> list[dict]:  # noqa: A002
    """Every readable record (sorted by key) for which ``filter(record)`` is true."""
    out = []
    for key, _p in _record_files(store):
        rec = store.read_record_file(key)
        if rec is not None and (filter is None or filter(rec)):
            out.append(rec)
    return out


def stats(store: Store) -> dict:
    """Sizes and counts of the store, and the hits/misses of the last build."""
    blobs = _scan_blobs(store)
    dicts = _dictionary_digests(store, blobs)
    code = [b for d, b in blobs.items() if d not in dicts]
    entries = 0
    record_bytes = 0
    for _k, p in _record_files(store):
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
        "current_dictionary": info["digest"] if info else None,
        "current_record_dictionary": rec_info["digest"] if rec_info else None,
        "record_bytes": record_bytes,
        "total_bytes": comp + record_bytes + dict_bytes + spare_bytes,
        "quarantined": quarantined,
        "last_build": store.last_build_stats(),
    }


# ---- verify ----

def _problem(kind: str, path: Path, problem: str, q: Path | None = None) -> dict:
    return {"kind": kind, "path": str(path), "problem": problem,
            "quarantined_to": str(q) if q is not None else None}


def verify(store: Store) -> list[dict]:
    """Decode and check every blob and record. Bad files are quarantined. Returns the problems."""
    problems: list[dict] = []
    for p in iter_stray(store.blob_dir, BLOB_SUFFIX):
        problems.append(_problem("stray", p, "not a blob file name; ignored by the store"))
    for p in iter_stray(store.ac_dir, RECORD_SUFFIX):
        problems.append(_problem("stray", p, "not a record file name; ignored by the store"))
    blobs = _scan_blobs(store)
    dicts = _dictionary_digests(store, blobs)
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
    for key, p in _record_files(store):
        try:
            rec = store.local.decode_record(p.read_bytes(), key)
        except FileNotFoundError:
            continue
        except (BadRecord, BadBlob) as e:
            q = store.quarantine(p, f"unreadable record: {e}")
            problems.append(_problem("record", p, f"unreadable record: {e}", q))
            continue
        ln = record_launcher(rec)
        if ln is not None and not store.blob_path(ln.hash).is_file():
            problems.append(_problem("record", p, f"its launcher {ln.hash} is missing: the record cannot be "
                                     f"derived again (a change of derive code recompiles it)"))
        d, size = rec["blob"]["digest"], rec["blob"]["size"]
        if not store.blob_path(d).is_file():
            problems.append(_problem("record", p, f"its blob {d} is missing: the key is a miss (gc removes it)"))
        elif blobs.get(d) and blobs[d].raw_size is not None and blobs[d].raw_size != size:
            why = f"says its blob {d} has {size} bytes, the blob has {blobs[d].raw_size}"
            problems.append(_problem("record", p, why, store.quarantine(p, why)))
    for kind, pointer in DICT_POINTERS.items():
        info = store.dictionary_info(kind)
        if info and not store.blob_path(info["digest"]).is_file():
            problems.append(_problem("dictionary", store.root / pointer,
                                     f"names dictionary {info['digest']}, which is not in the store; new "
                                     f"{kind} are written without a dictionary"))
    return problems


# ---- gc ----

def _read_records(store: Store) -> dict[str, tuple[Path, dict | None, float, int]]:
    """key -> (record file, the record or None when unreadable, mtime, size), for :func:`gc`."""
    records: dict[str, tuple[Path, dict | None, float, int]] = {}
    for key, p in _record_files(store):
        try:
            st = p.stat()
            data = p.read_bytes()
        except FileNotFoundError:
            continue
        try:
            rec = store.local.decode_record(data, key)
        except (BadRecord, BadBlob):
            rec = None
        records[key] = (p, rec, st.st_mtime, st.st_size)
    return records


def _fit_budget(max_bytes: int, blobs: dict, records: dict, removed: dict, live: set, refs: Counter,
                dict_refs: Counter, keep_blobs: set, protected, dict_live) -> bool:
    """Remove least-recently-used unprotected records (into ``removed``, updating ``live``,
    ``refs`` and ``dict_refs``) until blobs, dictionaries and records fit ``max_bytes``.
    Returns whether the store is still over it (the protected part alone is larger)."""
    total = (sum(blobs[d].file_bytes for d in live)
             + sum(blobs[d].file_bytes for d in blobs if dict_live(d) and d not in live)
             + sum(records[k][3] for k in records if k not in removed))
    lru = sorted((records[k][2], k) for k in records if k not in removed and not protected(k))
    for _mtime, key in lru:
        if total <= max_bytes:
            break
        removed[key] = "least recently used (store over max_bytes)"
        total -= records[key][3]
        for d in (b.hash for b in record_blobs(records[key][1])):
            refs[d] -= 1
            if refs[d] == 0 and d not in keep_blobs and d in live:
                live.discard(d)
                total -= blobs[d].file_bytes
                dr = blobs[d].dict_ref
                if dr:
                    dict_refs[dr] -= 1
                    if not dict_live(dr) and dr in blobs and dr not in live:
                        total -= blobs[dr].file_bytes
    return total > max_bytes


def _delete(store: Store, records: dict, removed: dict, blobs: dict, dead_blobs: list, *, dry_run: bool) -> int:
    """Unlink the removed records, then the dead blobs (and a dead dictionary's spare copy);
    returns the bytes freed (or that would be, with ``dry_run``)."""
    if not dry_run:
        for key in sorted(removed):  # records before blobs: no record ever names a deleted blob
            with contextlib.suppress(FileNotFoundError):
                os.unlink(records[key][0])
    freed = sum(records[key][3] for key in removed)
    for d in dead_blobs:
        freed += blobs[d].file_bytes
        if not dry_run:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(blobs[d].path)
    if not dry_run:
        for d in dead_blobs:  # a dictionary that goes takes its spare copy along
            with contextlib.suppress(FileNotFoundError):
                os.unlink(store.local.spare_path(d))
    return freed


def _unlink_older(paths: Iterable[Path], cutoff: float, *, dry_run: bool) -> int:
    """How many of ``paths`` were last modified before ``cutoff``, each removed unless ``dry_run``
    (one that vanishes or cannot be read is skipped)."""
    n = 0
    for f in paths:
        with contextlib.suppress(OSError):
            if f.stat().st_mtime < cutoff:
                n += 1
                if not dry_run:
                    f.unlink()
    return n


def _sweep_leftovers(store: Store, now: float, stale_s: float, purge_quarantine_days: float | None, *,
                     dry_run: bool) -> tuple[int, int, int]:
    """(stale temp files, stale per-key build claims, quarantined files older than
    ``purge_quarantine_days``), each removed unless ``dry_run``."""
    temps = sum(remove_stale_temps(p, stale_s, dry_run=dry_run)
                for p in (store.blob_dir, store.ac_dir, store.local.spare_dir))
    temps += _unlink_older((f for p in (store.root, store.stats_dir) if p.is_dir() for f in p.iterdir()
                            if f.name.startswith(".") and f.name.endswith(".tmp") and f.is_file()),
                           now - stale_s, dry_run=dry_run)
    # Stale per-key build claims (claims/ab/<key>.claim); locks/ holds lock files, not ours.
    locks = _unlink_older((p for key, p in iter_fanned(store.claim_dir, CLAIM_SUFFIX) if is_hex64(key)),
                          now - stale_s, dry_run=dry_run)
    purged = 0
    if purge_quarantine_days is not None and store.quarantine_dir.is_dir():
        purged = _unlink_older(store.quarantine_dir.iterdir(), now - purge_quarantine_days * 86400,
                               dry_run=dry_run)
    return temps, locks, purged


def gc(store: Store, keep_blobs: Iterable[str] = (), keep_keys: Iterable[str] | None = None,
       max_bytes: int | None = None, max_age_days: float | None = None, *, dry_run: bool = False,
       now: float | None = None, stale_s: float = STALE_S, purge_quarantine_days: float | None = None) -> dict:
    """Remove what is not needed.

    - ``keep_blobs`` (the lock files' blobs) always survive, with their dictionaries.
    - ``keep_keys``: when given, every other record is removed; when None, records are
      removed only by the caps below.
    - ``max_age_days``: remove records not used (mtime, refreshed by hits) for that long.
    - ``max_bytes``: then remove least-recently-used records until blobs + records fit.
    A record is protected from the caps when its key is in ``keep_keys`` or its blob in
    ``keep_blobs``. Records whose blob is missing, unreadable records, blobs no remaining
    record or keep set references, and temp files and per-key build locks older than
    ``stale_s`` go too. ``max_bytes`` counts compressed blobs, dictionaries and records.

    Run it while no build writes to the store: a race costs a recompile, never a wrong kernel.
    """
    now = time.time() if now is None else now
    keep_blobs = set(keep_blobs)
    keep_keys = None if keep_keys is None else set(keep_keys)
    blobs = _scan_blobs(store)
    records = _read_records(store)

    removed: dict[str, str] = {}
    for key, (_p, rec, _m, _s) in records.items():
        if rec is None:
            removed[key] = "unreadable"
        elif keep_keys is not None and key not in keep_keys:
            removed[key] = "unreferenced"
        elif rec["blob"]["digest"] not in blobs:
            removed[key] = "blob missing"

    def protected(key: str) -> bool:
        rec = records[key][1]
        return (keep_keys is not None and key in keep_keys) or rec["blob"]["digest"] in keep_blobs

    if max_age_days is not None:
        cutoff = now - max_age_days * 86400
        for key, (_p, _r, mtime, _s) in records.items():
            if key not in removed and mtime < cutoff and not protected(key):
                removed[key] = f"unused for more than {max_age_days:g} days"

    # A record keeps every blob it names: its code object and its launcher (what a re-derive reads).
    refs = Counter(d.hash for k in records if k not in removed for d in record_blobs(records[k][1]))
    live = {d for d in blobs if d in keep_blobs or refs[d] > 0}
    dict_refs = Counter(blobs[d].dict_ref for d in live if blobs[d].dict_ref)
    dict_refs.update(_record_dict_refs(store))  # records that stay or go alike: they name few
    current = {info["digest"] for info in (store.dictionary_info(k) for k in DICT_POINTERS) if info}

    def dict_live(d: str) -> bool:
        return dict_refs[d] > 0 or d in current

    over_budget = False
    if max_bytes is not None:
        over_budget = _fit_budget(max_bytes, blobs, records, removed, live, refs, dict_refs, keep_blobs,
                                  protected, dict_live)

    live_dicts = {d for d in blobs if dict_live(d)}
    dead_blobs = sorted(d for d in blobs if d not in live and d not in live_dicts)

    freed = _delete(store, records, removed, blobs, dead_blobs, dry_run=dry_run)
    temps, locks, purged = _sweep_leftovers(store, now, stale_s, purge_quarantine_days, dry_run=dry_run)
    reasons = Counter(removed.values())
    return {
        "dry_run": dry_run,
        "removed_records": len(removed),
        "removed_record_reasons": dict(sorted(reasons.items())),
        "removed_blobs": len(dead_blobs),
        "freed_bytes": freed,
        "kept_records": len(records) - len(removed),
        "kept_blobs": len([d for d in live if d not in live_dicts]),
        "kept_dictionaries": len(live_dicts),
        "missing_keep_blobs": sorted(keep_blobs - set(blobs)),
        "over_budget": over_budget,
        "removed_temp_files": temps,
        "removed_claim_files": locks,
        "purged_quarantine_files": purged,
    }


# ---- export / import ----

def _write_blobs(dest: Store, payload: Mapping[str, bytes], dicts: set[str]) -> int:
    """Publish verified blob files in ``dest`` (dictionaries first, with their spares); the count written."""
    written = 0
    for d in sorted(payload, key=lambda d: (d not in dicts, d)):
        written += dest.local.put_blob_file(d, payload[d])
        if d in dicts and not dest.local.spare_path(d).is_file():
            dest.local.write_file(dest.local.spare_path(d), payload[d])
    return written


def _file_dict_ref(data: bytes) -> str | None:
    try:
        return blobfmt.split(data)[0]
    except blobfmt.BlobFormatError:
        return None


def export(store: Store, lock: Mapping[str, Any], dest_dir: str | os.PathLike) -> dict:
    """Copy what ``lock`` needs (its blobs, their dictionaries, the records of its keys) into a
    store at ``dest_dir``. Every blob is verified first; nothing is written if one is missing
    or corrupt."""
    dest = Store(dest_dir, level=store.level, touch=False, durable=store.durable)
    if dest.root.resolve() == store.root.resolve():
        raise StoreError(f"export destination {dest_dir} is the store itself")
    payload: dict[str, bytes] = {}
    missing: list[str] = []
    corrupt: list[str] = []

    def take(digest: str) -> None:
        if digest in payload:
            return
        p = store.blob_path(digest)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            missing.append(f"blob {digest} is not in the store ({p})")
            return
        try:
            store.local.codec.decode(data, digest)
        except BadBlob as e:
            q = store.quarantine(p, str(e))
            corrupt.append(f"{p}: {e} (moved to {q})")
            return
        payload[digest] = data
        dict_ref = _file_dict_ref(data)
        if dict_ref:
            take(dict_ref)

    for d in sorted(lock.blob_digests()):
        take(d)
    records: dict[str, dict] = {}
    missing_records: list[str] = []
    for key in sorted(lock.action_keys()):
        rec = store.get_record(key)
        if rec is not None and rec["blob"]["digest"] in payload:
            records[key] = rec
            ln = record_launcher(rec)
            if ln is not None and store.has_blob(ln.hash):  # so the export can be derived again
                take(ln.hash)
        else:
            missing_records.append(key)
    if corrupt:
        raise CorruptArtifactError(
            f"export to {dest_dir} stopped, nothing was written: {len(corrupt)} corrupt blob(s) "
            f"(quarantined; rebuild to recompile them):\n" + "\n".join(f"  - {c}" for c in corrupt + missing),
            path=Path(corrupt[0].split(":")[0]), problems=corrupt + missing)
    if missing:
        raise StoreError(f"export to {dest_dir} stopped, nothing was written: the lock needs "
                         f"{len(missing)} blob(s) this store does not have (was it built into "
                         f"another store?):\n" + "\n".join(f"  - {m}" for m in missing))
    dest.init()
    dicts = {_file_dict_ref(b) for b in payload.values()} - {None}
    written = _write_blobs(dest, payload, dicts)
    for key, rec in records.items():
        dest.local.put_record(key, rec)
    return {
        "dest": str(dest.root),
        "blobs": len(payload) - len(dicts),
        "dictionaries": len(dicts),
        "blobs_written": written,
        "records": len(records),
        "missing_records": missing_records,
        "bytes": sum(len(b) for b in payload.values()),
    }


def import_(store: Store, src_dir: str | os.PathLike) -> dict:
    """Add the blobs and records of the store at ``src_dir`` (e.g. an export) to ``store``.

    Every blob is decoded and checked against its digest, and every record against its
    blob, before anything is added; one bad file rejects the whole import (nothing is
    written). The source is never modified. Existing good entries are kept.
    """
    src = Store(src_dir, readonly=True)
    if src.format is None:
        raise StoreFormatError(f"{src_dir} is not a gemmar-aot store (no {FORMAT_FILE} file)")
    if src.root.resolve() == store.root.resolve():
        raise StoreError(f"import source {src_dir} is the store itself")
    problems: list[str] = []
    payload: dict[str, bytes] = {}
    sizes: dict[str, int] = {}
    ignored = ([str(p) for p in iter_stray(src.blob_dir, BLOB_SUFFIX)]
               + [str(p) for p in iter_stray(src.ac_dir, RECORD_SUFFIX)])
    for digest, p in src.local.iter_blob_files():
        data = p.read_bytes()
        try:
            raw = src.local.codec.decode(data, digest)
        except BadBlob as e:
            problems.append(f"{p}: {e}")
            continue
        payload[digest] = data
        sizes[digest] = len(raw)
    records: dict[str, dict] = {}
    for key, p in _record_files(src):
        try:
            rec = src.local.decode_record(p.read_bytes(), key)
        except (BadRecord, BadBlob) as e:
            problems.append(f"{p}: unreadable record: {e}")
            continue
        d, size = rec["blob"]["digest"], rec["blob"]["size"]
        if d in sizes:
            if sizes[d] != size:
                problems.append(f"{p}: says blob {d} has {size} bytes, it has {sizes[d]}")
                continue
        elif not store.has_blob(d):
            problems.append(f"{p}: its blob {d} is neither in the import nor in this store")
            continue
        records[key] = rec
    if problems:
        raise CorruptArtifactError(
            f"import from {src_dir} rejected, nothing was imported: {len(problems)} problem(s):\n"
            + "\n".join(f"  - {x}" for x in problems),
            path=Path(problems[0].split(": ")[0]), problems=problems)
    store.init()
    dicts = {_file_dict_ref(b) for b in payload.values()} - {None}
    dicts |= _dictionary_digests(src, {}) & set(payload)
    added = _write_blobs(store, payload, dicts)
    rec_added = 0
    for key, rec in records.items():
        if store.read_record_file(key) is None:
            store.local.put_record(key, rec)
            rec_added += 1
    return {
        "src": str(src.root),
        "blobs": len(payload),
        "blobs_added": added,
        "records": len(records),
        "records_added": rec_added,
        "ignored_files": ignored,
    }


# ---- dictionary ----

def _code_samples(store: Store, limit: int) -> list[bytes]:
    blobs = _scan_blobs(store)
    dicts = _dictionary_digests(store, blobs)
    out: list[bytes] = []
    total = 0
    for d in sorted(blobs):
        if d in dicts or len(out) >= limit or total >= MAX_SAMPLE_BYTES:
            continue
        try:
            raw = store.load_blob(d)
        except StoreError:
            continue
        if raw[:4] != blobfmt.ZSTD_DICT_MAGIC:
            out.append(raw)
            total += len(raw)
    return out


def train_best_dictionary(samples: list[bytes], *, max_dict_bytes: int = MAX_DICT_BYTES,
                          min_gain: float = MIN_DICT_GAIN) -> tuple[bytes | None, dict]:
    """Train zstd dictionaries of a few sizes on ``samples`` and keep the best, if it pays.

    zstd's trainer silently falls back to a poor dictionary when asked for more than
    ~5 % of the sample bytes, so sizes start at total/24 (capped at ``max_dict_bytes``)
    and halve. Each candidate is scored by the bytes of all samples compressed with it
    (level 3, one frame each) plus the dictionary as stored (zstd level 19); the best is
    kept only if that beats plain per-blob zstd by ``min_gain``. Training uses level 3:
    level 19 takes 20x longer for the same dictionary quality (bench/bench_store.py).
    Returns (dictionary bytes or None, a report).
    """
    total = sum(len(s) for s in samples)
    plain_c = zstandard.ZstdCompressor(level=3)
    plain = sum(len(plain_c.compress(s)) for s in samples)
    report: dict = {"samples": len(samples), "sample_bytes": total, "plain_bytes": plain, "candidates": []}
    size = min(max_dict_bytes, total // 24)
    best: tuple[int, bytes] | None = None
    while size >= 4096 and len(report["candidates"]) < 3:
        try:
            d = zstandard.train_dictionary(size, samples, level=3)
        except zstandard.ZstdError as e:
            report["candidates"].append({"asked": size, "error": str(e)})
            size //= 2
            continue
        raw = d.as_bytes()
        c = zstandard.ZstdCompressor(level=3, dict_data=d)
        cost = sum(len(c.compress(s)) for s in samples) + len(zstandard.ZstdCompressor(level=19).compress(raw))
        report["candidates"].append({"asked": size, "dict_bytes": len(raw), "total_bytes": cost})
        if best is None or cost < best[0]:
            best = (cost, raw)
        size //= 2
    if best is None or best[0] * min_gain > plain:
        report["chosen"] = None
        return None, report
    report["chosen"] = len(best[1])
    report["gain_vs_plain"] = round(plain / best[0], 2)
    return best[1], report


def _record_samples(store: Store, limit: int) -> list[bytes]:
    """Canonical JSON of up to ``limit`` readable records (sorted by key)."""
    from gemmar_aot.canonical_json import canonical_json_bytes

    out: list[bytes] = []
    total = 0
    for key, _p in _record_files(store):
        if len(out) >= limit or total >= MAX_SAMPLE_BYTES:
            break
        rec = store.read_record_file(key)
        if rec is not None:
            out.append(canonical_json_bytes(rec))
            total += len(out[-1])
    return out


def train_dictionary(store: Store, *, max_dict_bytes: int = MAX_DICT_BYTES, max_samples: int = 4096,
                     min_samples: int = MIN_DICT_SAMPLES, kind: str = "blobs") -> str | None:
    """Train a zstd dictionary on the store's code objects (``kind="blobs"``) or records
    (``"records"``) and make it the one new ones use.

    Returns its digest, or None when there are too few samples or no dictionary pays off.
    Existing files keep their encoding until ``repack``.
    """
    samples = (_code_samples if kind == "blobs" else _record_samples)(store, max_samples)
    if len(samples) < min_samples:
        return None
    raw, _report = train_best_dictionary(samples, max_dict_bytes=max_dict_bytes)
    if raw is None:
        return None
    return store.set_dictionary(raw, trained_on=len(samples), kind=kind)


def repack(store: Store, *, level: int | None = None) -> dict:
    """Re-encode blobs and records not using the current dictionaries (or, with ``level``,
    every blob).

    A file is rewritten only when the new encoding is smaller (or the level was asked);
    digests and records do not change. Each rewrite is verified and atomic.
    """
    if level is not None:
        store.level = level
    current = store.current_dictionary()
    blobs = _scan_blobs(store)
    dicts = _dictionary_digests(store, blobs)
    n = before = after = 0
    for digest, info in sorted(blobs.items()):
        if digest in dicts or (level is None and info.dict_ref == current):
            continue
        done = store.local.reencode_blob(digest, dictionary=current, level=level,
                                         only_if_smaller=level is None)
        if done:
            n += 1
            before += done[0]
            after += done[1]
    rec_dict = store.current_dictionary("records")
    rn = rbefore = rafter = 0
    if rec_dict is not None:
        for key, p in _record_files(store):
            try:
                with open(p, "rb") as f:
                    ref = blobfmt.split(f.read(blobfmt.DICT_REF_LEN))[0]
            except (OSError, blobfmt.BlobFormatError):
                ref = None
            if ref == rec_dict:
                continue
            done = store.local.reencode_record(key, rec_dict)
            if done:
                rn += 1
                rbefore += done[0]
                rafter += done[1]
    return {"repacked": n, "bytes_before": before, "bytes_after": after, "dictionary": current,
            "records_repacked": rn, "record_bytes_before": rbefore, "record_bytes_after": rafter,
            "record_dictionary": rec_dict}


def _maybe_train(store: Store, kind: str, n: int, min_samples: int, max_dict_bytes: int,
                 retrain_factor: float) -> str | None:
    info = store.dictionary_info(kind)
    stale = info is None or store.current_dictionary(kind) is None  # none yet, or lost/corrupt
    if n >= min_samples and (stale or n >= retrain_factor * max(1, int(info.get("trained_on", 0)))):
        return train_dictionary(store, max_dict_bytes=max_dict_bytes, min_samples=min_samples, kind=kind)
    return None


def optimize(store: Store, *, min_blobs: int = MIN_DICT_SAMPLES, max_dict_bytes: int = MAX_DICT_BYTES,
             retrain_factor: float = 2.0) -> dict:
    """Train a dictionary for blobs and one for records once the store holds ``min_blobs`` of
    each (and again when they have grown ``retrain_factor`` times since), then repack. Cheap
    when nothing changed."""
    blobs = _scan_blobs(store)
    n = len(blobs) - len(_dictionary_digests(store, blobs) & set(blobs))
    trained = _maybe_train(store, "blobs", n, min_blobs, max_dict_bytes, retrain_factor)
    n_records = sum(1 for _ in _record_files(store))
    trained_records = _maybe_train(store, "records", n_records, min_blobs, RECORD_DICT_BYTES, retrain_factor)
    rep = repack(store)
    return {"blobs": n, "trained": trained, "records": n_records, "trained_records": trained_records, **rep}
