"""Lock files: the runtime's entry point. Deterministic bytes, atomic writes, schema checked.

The lead defines what a lock holds; this module only requires a top-level integer
``schema`` and that every launch entry -- any JSON object with a ``blob`` member -- names
its blob by sha256 (a string, or ``{"digest": ...}``) and its action ``key``. The same
lock (as a dict, in any insertion order) always serialises to the same bytes: sorted
keys, indent 1, ASCII, a trailing newline.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ._fs import atomic_write_bytes, is_hex64
from .errors import LockFileError

#: Version of the lock-file schema this gemmar-aot reads and writes.
LOCK_SCHEMA = 1


def _check_json(obj: Any, where: str) -> None:
    """Reject what ``json.dumps`` would silently change (non-str keys) or refuse late."""
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if not isinstance(k, str):
                raise LockFileError(f"lock key {k!r} at {where} is not a string")
            _check_json(v, f"{where}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _check_json(v, f"{where}[{i}]")
    elif isinstance(obj, float):
        if obj != obj or obj in (float("inf"), float("-inf")):
            raise LockFileError(f"lock value at {where} is not a finite number")
    elif not isinstance(obj, (str, int, bool, type(None))):
        raise LockFileError(f"lock value at {where} is a {type(obj).__name__}, not JSON")


def dumps_lock(lock: Mapping[str, Any]) -> bytes:
    """The canonical bytes of ``lock`` (adds ``schema`` when it is missing)."""
    if not isinstance(lock, Mapping):
        raise LockFileError(f"a lock is a JSON object, got {type(lock).__name__}")
    lock = dict(lock)
    lock.setdefault("schema", LOCK_SCHEMA)
    if lock["schema"] != LOCK_SCHEMA:
        raise LockFileError(f"this gemmar-aot writes lock schema {LOCK_SCHEMA}, got {lock['schema']!r}")
    _check_json(lock, "$")
    lock_blobs(lock)  # every launch names a valid digest
    return (json.dumps(lock, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=False) + "\n").encode()


def write_lock_file(path: str | os.PathLike, lock: Mapping[str, Any]) -> Path:
    """Write ``lock`` to ``path`` atomically, deterministically. Returns the path."""
    path = Path(path)
    atomic_write_bytes(path, dumps_lock(lock))
    return path


def parse_lock(data: bytes | str, where: str = "<lock>") -> dict:
    try:
        lock = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise LockFileError(f"{where} is not valid JSON: {e}") from None
    if not isinstance(lock, dict):
        raise LockFileError(f"{where}: a lock file holds a JSON object")
    schema = lock.get("schema")
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise LockFileError(f"{where} has no integer 'schema'; it is not a gemmar-aot lock file")
    if schema > LOCK_SCHEMA:
        raise LockFileError(f"{where} has lock schema {schema}, written by a newer gemmar-aot; this one "
                            f"reads schema {LOCK_SCHEMA}: upgrade gemmar-aot")
    if schema != LOCK_SCHEMA:
        raise LockFileError(f"{where} has unknown lock schema {schema} (this gemmar-aot reads "
                            f"{LOCK_SCHEMA}); rebuild the lock file")
    try:
        lock_blobs(lock)
    except LockFileError as e:
        raise LockFileError(f"{where}: {e}") from None
    return lock


def read_lock_file(path: str | os.PathLike) -> dict:
    """Read and validate a lock file. Raises LockFileError naming the path."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise LockFileError(f"no lock file at {path}; run the build that writes it") from None
    return parse_lock(data, str(path))


def iter_launches(lock: Any, where: str = "$") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(json path, entry) of every launch entry (an object with a ``blob`` member), in document order.

    The ``launch`` and ``metadata`` members of an entry are opaque and not searched.
    """
    if isinstance(lock, Mapping):
        if "blob" in lock:
            yield where, lock
            return
        for k, v in lock.items():
            yield from iter_launches(v, f"{where}.{k}")
    elif isinstance(lock, (list, tuple)):
        for i, v in enumerate(lock):
            yield from iter_launches(v, f"{where}[{i}]")


def _blob_digest(entry: Mapping[str, Any], where: str) -> str:
    b = entry["blob"]
    d = b.get("digest") if isinstance(b, Mapping) else b
    if not is_hex64(d):
        raise LockFileError(f"launch at {where} has blob {b!r}, not a sha256 digest")
    return d


def lock_blobs(lock: Mapping[str, Any]) -> set[str]:
    """Every blob digest the lock references."""
    return {_blob_digest(e, w) for w, e in iter_launches(lock)}


def lock_keys(lock: Mapping[str, Any]) -> set[str]:
    """Every action key the lock's launches name (entries without a valid ``key`` are skipped)."""
    return {e["key"] for _, e in iter_launches(lock) if is_hex64(e.get("key"))}
