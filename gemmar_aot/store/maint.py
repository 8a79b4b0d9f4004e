"""Maintenance: ls, stats, verify, gc, export/import, and dictionary training/repacking.

Each function returns plain data (lists/dicts of str/int/None) so the CLI's ``--json``
is a ``json.dumps`` away. None of them is needed at serving time.
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
from .cas import FORMAT_FILE, RECORD_SUFFIX, Store, _Bad, encode_record
from .errors import CorruptArtifactError, StoreError, StoreFormatError
from .lockfile import lock_blobs, lock_keys

#: Temp files and lock files older than this are debris (a writer that was killed).
STALE_S = 3600.0
#: Fewer code objects than this: no dictionary (zstd's trainer needs samples, and the gain is small).
MIN_DICT_SAMPLES = 32
#: zstd's own default maximum dictionary size.
MAX_DICT_BYTES = 112 * 1024
#: A dictionary is used only if blobs + dictionary are this many times smaller than plain zstd.
MIN_DICT_GAIN = 1.25
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
    for digest, p in iter_fanned(store.blob_dir, ".zst"):
        if not is_hex64(digest) or p.parent.name != digest[:2]:
            continue
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


def _dictionary_digests(store: Store, blobs: Mapping[str, _BlobInfo]) -> set[str]:
    ds = {b.dict_ref for b in blobs.values() if b.dict_ref}
    info = store.dictionary_info()
    if info:
        ds.add(info["digest"])
    return ds


def _record_files(store: Store) -> Iterable[tuple[str, Path]]:
    for key, p in iter_fanned(store.ac_dir, RECORD_SUFFIX):
        if is_hex64(key) and p.parent.name == key[:2]:
            yield key, p


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
    return {
        "root": str(store.root),
        "format": store.format,
        "entries": entries,
        "blobs": len(code),
        "raw_bytes": raw,
        "compressed_bytes": comp,
        "ratio": round(raw / comp, 3) if comp else None,
        "dictionaries": len([d for d in dicts if d in blobs]),
        "dictionary_bytes": sum(blobs[d].file_bytes for d in dicts if d in blobs),
        "current_dictionary": info["digest"] if info else None,
        "record_bytes": record_bytes,
        "total_bytes": comp + record_bytes + sum(blobs[d].file_bytes for d in dicts if d in blobs),
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
    for p in iter_stray(store.blob_dir, ".zst"):
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
            store._decode(data, digest, None)
        except _Bad as e:
            q = store.quarantine(info.path, str(e))
            problems.append(_problem("dictionary" if digest in dicts else "blob", info.path, str(e), q))
    for key, p in _record_files(store):
        try:
            rec = store._parse_record(p.read_bytes(), key)
        except FileNotFoundError:
            continue
        except _Bad as e:
            q = store.quarantine(p, f"unreadable record: {e}")
            problems.append(_problem("record", p, f"unreadable record: {e}", q))
            continue
        d, size = rec["blob"]["digest"], rec["blob"]["size"]
        if not store.blob_path(d).is_file():
            problems.append(_problem("record", p, f"its blob {d} is missing: the key is a miss (gc removes it)"))
        elif blobs.get(d) and blobs[d].raw_size is not None and blobs[d].raw_size != size:
            why = f"says its blob {d} has {size} bytes, the blob has {blobs[d].raw_size}"
            problems.append(_problem("record", p, why, store.quarantine(p, why)))
    info = store.dictionary_info()
    if info and not store.blob_path(info["digest"]).is_file():
        problems.append(_problem("dictionary", store.root / "dictionary.json",
                                 f"names dictionary {info['digest']}, which is not in the store; new "
                                 f"blobs are written without a dictionary"))
    return problems


# ---- gc ----

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

    records: dict[str, tuple[Path, dict | None, float, int]] = {}
    for key, p in _record_files(store):
        try:
            st = p.stat()
            data = p.read_bytes()
        except FileNotFoundError:
            continue
        try:
            rec = store._parse_record(data, key)
        except _Bad:
            rec = None
        records[key] = (p, rec, st.st_mtime, st.st_size)

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

    refs = Counter(records[k][1]["blob"]["digest"] for k in records if k not in removed)
    live = {d for d in blobs if d in keep_blobs or refs[d] > 0}
    dict_refs = Counter(blobs[d].dict_ref for d in live if blobs[d].dict_ref)
    info = store.dictionary_info()
    current = info["digest"] if info else None

    def dict_live(d: str) -> bool:
        return dict_refs[d] > 0 or d == current

    over_budget = False
    if max_bytes is not None:
        total = (sum(blobs[d].file_bytes for d in live)
                 + sum(blobs[d].file_bytes for d in blobs if dict_live(d) and d not in live)
                 + sum(records[k][3] for k in records if k not in removed))
        lru = sorted((records[k][2], k) for k in records if k not in removed and not protected(k))
        for _mtime, key in lru:
            if total <= max_bytes:
                break
            removed[key] = "least recently used (store over max_bytes)"
            total -= records[key][3]
            d = records[key][1]["blob"]["digest"]
            refs[d] -= 1
            if refs[d] == 0 and d not in keep_blobs and d in live:
                live.discard(d)
                total -= blobs[d].file_bytes
                dr = blobs[d].dict_ref
                if dr:
                    dict_refs[dr] -= 1
                    if not dict_live(dr) and dr in blobs and dr not in live:
                        total -= blobs[dr].file_bytes
        over_budget = total > max_bytes

    live_dicts = {d for d in blobs if dict_live(d)}
    dead_blobs = sorted(d for d in blobs if d not in live and d not in live_dicts)

    freed = 0
    if not dry_run:
        for key in sorted(removed):  # records before blobs: no record ever names a deleted blob
            with contextlib.suppress(FileNotFoundError):
                os.unlink(records[key][0])
    for key in removed:
        freed += records[key][3]
    for d in dead_blobs:
        freed += blobs[d].file_bytes
        if not dry_run:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(blobs[d].path)
    temps = sum(remove_stale_temps(p, stale_s, dry_run=dry_run) for p in (store.blob_dir, store.ac_dir))
    for p in (store.root, store.stats_dir):
        if p.is_dir():
            for f in p.iterdir():
                if f.name.startswith(".") and f.name.endswith(".tmp") and f.is_file():
                    with contextlib.suppress(OSError):
                        if f.stat().st_mtime < now - stale_s:
                            temps += 1
                            if not dry_run:
                                f.unlink()
    # Per-key build locks only (locks/ab/<key>.lock): other files in locks/ -- the build's
    # lock files, locks/<manifest>.lock.json -- are not ours to remove.
    locks = 0
    for _key, p in iter_fanned(store.lock_dir, ".lock"):
        if not is_hex64(_key):
            continue
        with contextlib.suppress(OSError):
            if p.stat().st_mtime < now - stale_s:
                locks += 1
                if not dry_run:
                    p.unlink()
    purged = 0
    if purge_quarantine_days is not None and store.quarantine_dir.is_dir():
        for f in store.quarantine_dir.iterdir():
            with contextlib.suppress(OSError):
                if f.stat().st_mtime < now - purge_quarantine_days * 86400:
                    purged += 1
                    if not dry_run:
                        f.unlink()
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
        "removed_lock_files": locks,
        "purged_quarantine_files": purged,
    }


# ---- export / import ----

def _write_blob_if_needed(dest: Store, digest: str, data: bytes) -> bool:
    """Publish verified ``data`` as blob ``digest`` in ``dest`` unless a good copy is there."""
    p = dest.blob_path(digest)
    if p.is_file():
        try:
            dest._decode(p.read_bytes(), digest, None)
            return False
        except FileNotFoundError:
            pass
        except _Bad as e:
            dest.quarantine(p, f"replaced by a verified copy: {e}")
    dest._write(p, data)
    return True


def _order_dicts_first(payload: Mapping[str, bytes]) -> list[str]:
    dicts = {blobfmt.split(b)[0] for b in payload.values()} - {None}
    return sorted(payload, key=lambda d: (d not in dicts, d))


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
            store._decode(data, digest, None)
        except _Bad as e:
            q = store.quarantine(p, str(e))
            corrupt.append(f"{p}: {e} (moved to {q})")
            return
        payload[digest] = data
        dict_ref = blobfmt.split(data)[0]
        if dict_ref:
            take(dict_ref)

    for d in sorted(lock_blobs(lock)):
        take(d)
    records: dict[str, dict] = {}
    missing_records: list[str] = []
    for key in sorted(lock_keys(lock)):
        rec = store.get_record(key)
        if rec is not None and rec["blob"]["digest"] in payload:
            records[key] = rec
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
    written = 0
    for d in _order_dicts_first(payload):
        written += _write_blob_if_needed(dest, d, payload[d])
    for key, rec in records.items():
        dest._write(dest.record_path(key), encode_record(rec))
    dicts = {blobfmt.split(b)[0] for b in payload.values()} - {None}
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
    ignored = [str(p) for p in iter_stray(src.blob_dir, ".zst")] + [str(p) for p in iter_stray(src.ac_dir, RECORD_SUFFIX)]
    for digest, p in iter_fanned(src.blob_dir, ".zst"):
        if not is_hex64(digest) or p.parent.name != digest[:2]:
            continue
        data = p.read_bytes()
        try:
            raw = src._decode(data, digest, None)
        except _Bad as e:
            problems.append(f"{p}: {e}")
            continue
        payload[digest] = data
        sizes[digest] = len(raw)
    records: dict[str, dict] = {}
    for key, p in _record_files(src):
        try:
            rec = src._parse_record(p.read_bytes(), key)
        except _Bad as e:
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
    added = 0
    for d in _order_dicts_first(payload):
        added += _write_blob_if_needed(store, d, payload[d])
    rec_added = 0
    for key, rec in records.items():
        if store.read_record_file(key) is None:
            store._write(store.record_path(key), encode_record(rec))
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


def train_dictionary(store: Store, *, max_dict_bytes: int = MAX_DICT_BYTES, max_samples: int = 4096,
                     min_samples: int = MIN_DICT_SAMPLES) -> str | None:
    """Train a zstd dictionary on the store's code objects and make it the one new blobs use.

    Returns its digest, or None when there are too few samples or no dictionary pays off.
    Existing blobs keep their encoding until ``repack``.
    """
    samples = _code_samples(store, max_samples)
    if len(samples) < min_samples:
        return None
    raw, _report = train_best_dictionary(samples, max_dict_bytes=max_dict_bytes)
    if raw is None:
        return None
    return store.set_dictionary(raw, trained_on=len(samples))


def repack(store: Store, *, level: int | None = None) -> dict:
    """Re-encode blobs not using the current dictionary (or, with ``level``, all of them).

    A blob is rewritten only when the new encoding is smaller (or the level was asked);
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
        try:
            data = info.path.read_bytes()
            raw = store._decode(data, digest, None)
        except FileNotFoundError:
            continue
        except _Bad as e:
            store.quarantine(info.path, str(e))
            continue
        if raw[:4] == blobfmt.ZSTD_DICT_MAGIC:
            continue
        new = store.encode_blob(raw, digest, current)
        if level is None and len(new) >= len(data):
            continue
        store._write(info.path, new)
        n += 1
        before += len(data)
        after += len(new)
    return {"repacked": n, "bytes_before": before, "bytes_after": after, "dictionary": current}


def optimize(store: Store, *, min_blobs: int = MIN_DICT_SAMPLES, max_dict_bytes: int = MAX_DICT_BYTES,
             retrain_factor: float = 2.0) -> dict:
    """Train a dictionary once the store holds ``min_blobs`` code objects (and again when it has
    grown ``retrain_factor`` times since), then repack. Cheap when nothing changed."""
    blobs = _scan_blobs(store)
    n = len(blobs) - len(_dictionary_digests(store, blobs) & set(blobs))
    info = store.dictionary_info()
    trained = None
    stale = info is None or store.current_dictionary() is None  # none yet, or lost/corrupt
    if n >= min_blobs and (stale or n >= retrain_factor * max(1, int(info.get("trained_on", 0)))):
        trained = train_dictionary(store, max_dict_bytes=max_dict_bytes, min_samples=min_blobs)
    rep = repack(store) if store.current_dictionary() else {"repacked": 0, "bytes_before": 0,
                                                             "bytes_after": 0, "dictionary": None}
    return {"blobs": n, "trained": trained, **rep}
