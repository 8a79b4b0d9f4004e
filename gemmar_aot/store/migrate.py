"""A store of an older format upgraded in place, once, when a writer first opens it
(``DirectoryBackend.init``, the ``backend`` here). Must be called with the backend's init lock held.

Each step is idempotent and the format file is written last: an interrupted migration is
simply redone. A store of a format in ``local.MIGRATABLE`` is read as it is until then
(:func:`pointer_of_format3` is how its dictionary pointers read)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from typing import Any

from gemmar_aot.util.canonical_json import canonical_json_bytes
from gemmar_aot.util.filedigest import is_hex64

from .backend import BadRecord, read_record
from .blob_codec import BadBlob
from .store_errors import StoreFormatError


def migrate(backend: Any, fmt: int, *, to: int, format_file: str, dictionary_pointers: Mapping[str, str]) -> None:
    """Upgrade a store of format ``fmt`` (2 or 3) to format ``to`` in place (``format_file``: the
    format file's name; ``dictionary_pointers``: kind -> the pointer file's name)."""
    if fmt not in (2, 3):
        raise StoreFormatError(f"{backend.root}: no migration from store format {fmt}")
    if fmt == 2:
        _from_2(backend, dictionary_pointers["blobs"])
    _from_3(backend, dictionary_pointers)
    backend.write_file(backend.root / format_file, f"{to}\n".encode())
    backend.format = to


def _from_2(backend: Any, dictionary_pointer: str) -> None:
    """2 -> 3: records and blobs are read as they are (a format-2 record is a plain zstd
    frame, which format 3 reads); the per-key build locks in ``locks/ab/<key>.lock`` go
    (claims now live in ``claims/``; a builder of the old version still running would
    not be excluded, so stop old builders first); each dictionary gets its spare copy."""
    lock_dir = backend.lock_dir
    if lock_dir.is_dir():
        for sub in sorted(lock_dir.iterdir()):
            if len(sub.name) == 2 and sub.is_dir():
                for p in sub.iterdir():
                    if p.name.endswith(".lock") and is_hex64(p.name[:-5]):
                        with contextlib.suppress(OSError):
                            p.unlink()
                with contextlib.suppress(OSError):
                    sub.rmdir()  # only when empty: anything else is not ours
    pointer = backend.root / dictionary_pointer
    with contextlib.suppress(FileNotFoundError, ValueError, KeyError, TypeError):
        d = pointer_of_format3(json.loads(pointer.read_bytes()))["hash"]
        if is_hex64(d) and backend.blob_path(d).is_file() and not backend.spare_path(d).is_file():
            data = backend.blob_path(d).read_bytes()
            try:
                backend.codec.decode_dictionary(data, d)
                backend.write_file(backend.spare_path(d), data)
            except BadBlob:
                pass  # a corrupt dictionary is handled (quarantined) on first use


def pointer_of_format3(info: Any) -> Any:
    """A dictionary pointer of formats 2 and 3 (``{"digest", "bytes", ...}``) as format 4 spells
    it (``{"hash", "size", ...}``: the dictionary's Digest, then how it was trained); anything
    else as it is."""
    if not isinstance(info, dict) or "hash" in info or "size" in info:
        return info
    return {{"digest": "hash", "bytes": "size"}.get(k, k): v for k, v in info.items()}


def _from_3(backend: Any, dictionary_pointers: Mapping[str, str]) -> None:
    """3 -> 4: one digest spelling on disk. Each dictionary pointer is respelled
    (:func:`pointer_of_format3`); each record of record schema 1 (blobs named ``{"digest",
    "size"}``) is written again as :func:`~gemmar_aot.store.backend.read_record` reads it -- in
    record schema 2, its derive stamp cleared, so the next build derives it again from its
    blobs (no compile) -- keeping its mtime (``gc``'s LRU clock). A record that does not
    decode is left for ``verify`` to report."""
    for name in dictionary_pointers.values():
        p = backend.root / name
        with contextlib.suppress(FileNotFoundError, ValueError):
            info = json.loads(p.read_bytes())
            new = pointer_of_format3(info)
            if new is not info:
                backend.write_file(p, canonical_json_bytes(new))  # as set_dictionary writes one
    for key, p in backend.iter_record_files():
        try:
            data = p.read_bytes()
            rec = json.loads(backend.codec.decode_frame_only(data))
            if not (isinstance(rec, dict) and rec.get("schema") == 1):
                continue
            new = backend.encode_record(read_record(rec, key))
            st = os.stat(p)
        except (OSError, BadBlob, BadRecord, ValueError, UnicodeDecodeError):
            continue
        backend.write_file(p, new)
        with contextlib.suppress(OSError):
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
