"""Lock files, as the store's callers name them: a thin layer over :mod:`gemmar_aot.model`.

The model is the only reader and writer of lock JSON; these names let store code (gc's
keep set, export) and the CLI ask a typed :class:`~gemmar_aot.model.lock.Lock` what it
references.
"""

from __future__ import annotations

from gemmar_aot.model.lock import Lock, read_lock, write_lock
from gemmar_aot.model.schema import LOCK_SCHEMA, LockFileError

__all__ = ["LOCK_SCHEMA", "Lock", "LockFileError", "dumps_lock", "iter_launches", "lock_blobs", "lock_keys",
           "parse_lock", "read_lock_file", "write_lock_file"]

write_lock_file = write_lock


def read_lock_file(path) -> Lock:
    """The lock at ``path``, every rank's part checked now: the store and the CLI use whole locks,
    so a damaged part is an error when the file is read (the runtime checks only its rank's)."""
    return read_lock(path).check_parts()


def parse_lock(data: bytes | str, where: str = "<lock>") -> Lock:
    """A lock from its bytes, every rank's part checked now (see :func:`read_lock_file`)."""
    return Lock.from_bytes(data, where).check_parts()


def dumps_lock(lock: Lock) -> bytes:
    """The canonical bytes of ``lock``."""
    return lock.to_bytes()


def iter_launches(lock: Lock):
    """(JSON path, LaunchEntry) of every launch of every tuple and rank, in order."""
    return lock.iter_launches()


def lock_blobs(lock: Lock) -> set[str]:
    """The sha256 of every code object the lock names."""
    return lock.blob_digests()


def lock_keys(lock: Lock) -> set[str]:
    """Every action key the lock launches."""
    return lock.action_keys()
