"""A lock and the files that travel beside it: the one place that names them, orders their
writing and tells a reader where each is. Standard library only.

A build writes its lock into the store as ``locks/<manifest>.lock.json``
(``locks/<manifest>.<profile>.lock.json`` for a toolchain profile other than the default), and
a wheel ships it as ``<pkg>/lock.json.zst``. Beside it, named from it:

* the **record index** (``<name>.records.zst``, :mod:`gemmar_aot.store.record_index`): every
  record the lock names, so a rank binds its lock entries without opening the store;
* the **blob index** (``<name>.blobs.zst``, :mod:`gemmar_aot.store.blob_index`): the lock's code
  objects, a rank's in one read;
* the **signature envelope** (``<name>.intoto.jsonl``, :mod:`gemmar_aot.trust.envelope`): who
  vouched for the lock's bytes.

**Write order** (:meth:`LockBundle.write`): the two indexes, then the lock, then (signing, after
it) the envelope. A reader that finds a new record index beside the old lock refuses it (another
lock's key set) and never serves a mix of the two; one that finds a new blob index reads what it
lacks from the store, each code object checked against the digest its lock names; an envelope
is over the lock's bytes, so it can only follow them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

#: ``<store>/locks/<manifest name>`` + this is a lock file.
LOCK_SUFFIX = ".lock.json"
#: The names a lock file goes by: in a store (LOCK_SUFFIX), in an artifact wheel (``lock.json.zst``)
#: and in older wheels (``lock.json``).
LOCK_NAME_SUFFIXES = (LOCK_SUFFIX, ".json.zst", ".json")
RECORD_INDEX_SUFFIX = ".records.zst"
BLOB_INDEX_SUFFIX = ".blobs.zst"
#: One envelope per line, as SLSA's provenance files.
ENVELOPE_SUFFIX = ".intoto.jsonl"


@dataclass(frozen=True)
class LockBundle:
    """The lock at ``lock`` and the paths of the files beside it."""

    lock: Path

    def __init__(self, lock: str | os.PathLike):
        object.__setattr__(self, "lock", Path(lock))

    @classmethod
    def in_store(cls, store_root: str | os.PathLike, manifest_name: str, profile: str | None = None) -> "LockBundle":
        """The bundle a build of ``manifest_name`` writes into ``store_root``: ``locks/<manifest>.lock.json``,
        or ``locks/<manifest>.<profile>.lock.json`` for a toolchain profile other than the default, so one
        store holds several profiles' locks side by side."""
        suffix = "" if profile in (None, "default") else f".{profile}"
        return cls(Path(store_root) / "locks" / f"{manifest_name}{suffix}{LOCK_SUFFIX}")

    def _beside(self, suffix: str) -> Path:
        """The lock's name with its lock ending replaced by ``suffix`` (``locks/M.lock.json`` ->
        ``locks/M<suffix>``, ``pkg/lock.json.zst`` -> ``pkg/lock<suffix>``)."""
        p = self.lock
        for s in LOCK_NAME_SUFFIXES:
            if p.name.endswith(s) and len(p.name) > len(s):
                return p.with_name(p.name[: -len(s)] + suffix)
        return p.with_name(p.name + suffix)

    @property
    def record_index(self) -> Path:
        return self._beside(RECORD_INDEX_SUFFIX)

    @property
    def blob_index(self) -> Path:
        return self._beside(BLOB_INDEX_SUFFIX)

    @property
    def envelope(self) -> Path:
        return self._beside(ENVELOPE_SUFFIX)

    def write(self, lock, *, record_index: bytes, blob_index: bytes) -> Path:
        """Publish the indexes, then ``lock`` (a :class:`~gemmar_aot.model.lock.Lock`), each
        atomically, in the order the module docstring gives; returns the lock's path."""
        from gemmar_aot.model.lock import write_lock
        from gemmar_aot.util.atomic_write import atomic_write_bytes

        atomic_write_bytes(self.record_index, record_index)
        atomic_write_bytes(self.blob_index, blob_index)
        return write_lock(self.lock, lock)

    def read(self, verify: Callable[[bytes | None, bytes], Any] | None = None) -> tuple[Any, Any]:
        """The lock, read once and checked (:class:`~gemmar_aot.model.lock.Lock`), and what
        ``verify`` says of it: given a verifier (``verify(envelope bytes or None, the lock's plain
        bytes)``, e.g. a trust set's check), the envelope beside the lock is read and handed to it
        with the bytes the lock is then parsed from, before they are parsed; without one, (lock,
        None). Raises the lock reader's errors (``LockFileError``), what ``verify`` raises, and
        OSError for an envelope that is there but cannot be read."""
        from gemmar_aot.model.lock_codec import plain_lock_bytes
        from gemmar_aot.model.lock import Lock, read_lock

        if verify is None:
            return read_lock(self.lock), None
        try:
            data = self.lock.read_bytes()
        except OSError:
            read_lock(self.lock)  # raises the reader's error (no such file, a directory)
            raise
        try:
            envelope = self.envelope.read_bytes()
        except FileNotFoundError:
            envelope = None
        plain = plain_lock_bytes(data, str(self.lock))  # decompressed once: for the signature, then the reader
        verified = verify(envelope, plain)
        return Lock.from_bytes(plain, str(self.lock)), verified
