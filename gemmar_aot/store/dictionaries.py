"""The store's zstd dictionaries: training one for code objects and one for records, repacking
the files that do not use the current ones, and ``optimize`` (both, when the store has grown).

On the store's public interface like every maintenance module (:mod:`.inventory` says so in
full); plain data out, for ``--json``. Never needed at serving time; the store never imports this.
"""

from __future__ import annotations

import zstandard

from . import blobfmt
from .cas import Store
from .store_errors import StoreError
from .inventory import dictionary_digests, scan_blobs

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


def _code_samples(store: Store, limit: int) -> list[bytes]:
    blobs = scan_blobs(store)
    dicts = dictionary_digests(store, blobs)
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
    from gemmar_aot.util.canonical_json import canonical_json_bytes

    out: list[bytes] = []
    total = 0
    for key, _p in store.local.iter_record_files():
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
    blobs = scan_blobs(store)
    dicts = dictionary_digests(store, blobs)
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
        for key, p in store.local.iter_record_files():
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
    blobs = scan_blobs(store)
    n = len(blobs) - len(dictionary_digests(store, blobs) & set(blobs))
    trained = _maybe_train(store, "blobs", n, min_blobs, max_dict_bytes, retrain_factor)
    n_records = sum(1 for _ in store.local.iter_record_files())
    trained_records = _maybe_train(store, "records", n_records, min_blobs, RECORD_DICT_BYTES, retrain_factor)
    rep = repack(store)
    return {"blobs": n, "trained": trained, "records": n_records, "trained_records": trained_records, **rep}
