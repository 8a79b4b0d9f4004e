"""A store of an older format upgraded in place, once, when a writer first opens it
(``DirectoryBackend.init``, the ``backend`` here). Must be called with the backend's init lock held."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from gemmar_aot.util.filedigest import is_hex64

from .codec import BadBlob
from .errors import StoreFormatError


def migrate(backend: Any, fmt: int, *, to: int, format_file: str, dictionary_pointer: str) -> None:
    """Upgrade a store of format ``fmt`` to format ``to`` in place (``format_file``: the format
    file's name; ``dictionary_pointer``: the blob dictionary's pointer file's).

    2 -> 3: records and blobs are read as they are (a format-2 record is a plain zstd
    frame, which format 3 reads); the per-key build locks in ``locks/ab/<key>.lock`` go
    (claims now live in ``claims/``; a builder of the old version still running would
    not be excluded, so stop old builders first); each dictionary gets its spare copy.
    The format file is written last: an interrupted migration is simply redone.
    """
    if fmt != 2:
        raise StoreFormatError(f"{backend.root}: no migration from store format {fmt}")
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
        d = json.loads(pointer.read_bytes())["digest"]
        if is_hex64(d) and backend.blob_path(d).is_file() and not backend.spare_path(d).is_file():
            data = backend.blob_path(d).read_bytes()
            try:
                backend.codec.decode_dictionary(data, d)
                backend.write_file(backend.spare_path(d), data)
            except BadBlob:
                pass  # a corrupt dictionary is handled (quarantined) on first use
    backend.write_file(backend.root / format_file, f"{to}\n".encode())
    backend.format = to

