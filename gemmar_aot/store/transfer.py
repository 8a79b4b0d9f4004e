"""Moving entries between stores: ``export`` (what one lock needs, into a new store) and
``import_`` (a store's blobs and records, all verified before any is written).

On the store's public interface like every maintenance module (:mod:`.inventory` says so in
full); plain data out, for ``--json``. Never needed at serving time; the store never imports this.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import blobfmt
from ._fs import iter_stray
from .backend import BadRecord, record_blob, record_launcher
from .cas import Store
from .blob_codec import BadBlob
from .store_errors import CorruptArtifactError, StoreError, StoreFormatError
from .inventory import dictionary_digests
from .local import BLOB_SUFFIX, FORMAT_FILE, RECORD_SUFFIX


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
        if rec is not None and record_blob(rec).hash in payload:
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
    for key, p in src.local.iter_record_files():
        try:
            rec = src.local.decode_record(p.read_bytes(), key)
        except (BadRecord, BadBlob) as e:
            problems.append(f"{p}: unreadable record: {e}")
            continue
        blob = record_blob(rec)
        d, size = blob.hash, blob.size
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
    dicts |= dictionary_digests(src, {}) & set(payload)
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
