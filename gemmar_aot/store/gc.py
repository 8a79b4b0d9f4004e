"""Garbage collection: remove the records and blobs no lock or cap keeps, and the debris of
killed writers (temp files, stale build claims, old quarantine).

On the store's public interface like every maintenance module (:mod:`.inventory` says so in
full); plain data out, for ``--json``. Never needed at serving time; the store never imports this.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from gemmar_aot.util.filedigest import is_hex64
from gemmar_aot.util.lifecycle import remove_stale_work

from ._fs import iter_fanned, remove_stale_temps
from .backend import BadRecord, record_blob, record_blobs
from .cas import Store
from .blob_codec import BadBlob
from .inventory import record_dict_refs, scan_blobs
from .local import CLAIM_SUFFIX, DICT_POINTERS

#: Temp files and lock files older than this are debris (a writer that was killed).
STALE_S = 3600.0


def _read_records(store: Store) -> dict[str, tuple[Path, dict | None, float, int]]:
    """key -> (record file, the record or None when unreadable, mtime, size), for :func:`gc`."""
    records: dict[str, tuple[Path, dict | None, float, int]] = {}
    for key, p in store.local.iter_record_files():
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


def _remove_stale_work(store: Store, cutoff: float, *, dry_run: bool) -> int:
    """How many compile directories under ``work/`` (a build killed outright leaves its compiles'
    ones) were last modified before ``cutoff``, each removed unless ``dry_run``."""
    work = getattr(store.local, "work_dir", None)
    return 0 if work is None else remove_stale_work(work, cutoff, dry_run=dry_run)


def _sweep_leftovers(store: Store, now: float, stale_s: float, purge_quarantine_days: float | None, *,
                     dry_run: bool) -> tuple[int, int, int]:
    """(stale temp files, stale per-key build claims, quarantined files older than
    ``purge_quarantine_days``), each removed unless ``dry_run``."""
    temps = sum(remove_stale_temps(p, stale_s, dry_run=dry_run)
                for p in (store.blob_dir, store.ac_dir, store.local.spare_dir))
    temps += _unlink_older((f for p in (store.root, store.stats_dir) if p.is_dir() for f in p.iterdir()
                            if f.name.startswith(".") and f.name.endswith(".tmp") and f.is_file()),
                           now - stale_s, dry_run=dry_run)
    temps += _remove_stale_work(store, now - stale_s, dry_run=dry_run)
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
    blobs = scan_blobs(store)
    records = _read_records(store)

    removed: dict[str, str] = {}
    for key, (_p, rec, _m, _s) in records.items():
        if rec is None:
            removed[key] = "unreadable"
        elif keep_keys is not None and key not in keep_keys:
            removed[key] = "unreferenced"
        elif record_blob(rec).hash not in blobs:
            removed[key] = "blob missing"

    def protected(key: str) -> bool:
        rec = records[key][1]
        return (keep_keys is not None and key in keep_keys) or record_blob(rec).hash in keep_blobs

    if max_age_days is not None:
        cutoff = now - max_age_days * 86400
        for key, (_p, _r, mtime, _s) in records.items():
            if key not in removed and mtime < cutoff and not protected(key):
                removed[key] = f"unused for more than {max_age_days:g} days"

    # A record keeps every blob it names: its code object and its launcher (what a re-derive reads).
    refs = Counter(d.hash for k in records if k not in removed for d in record_blobs(records[k][1]))
    live = {d for d in blobs if d in keep_blobs or refs[d] > 0}
    dict_refs = Counter(blobs[d].dict_ref for d in live if blobs[d].dict_ref)
    dict_refs.update(record_dict_refs(store))  # records that stay or go alike: they name few
    current = {info["hash"] for info in (store.dictionary_info(k) for k in DICT_POINTERS) if info}

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
