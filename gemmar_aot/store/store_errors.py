"""Errors the store raises. Each names the path involved and what to do about it."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from gemmar_aot.model.schema import LockFileError  # noqa: F401 - a lock is malformed or of another schema
from gemmar_aot.util.errors import GemmarError


class StoreError(GemmarError):
    """The store cannot do what was asked (missing blob, lock timeout, bad argument)."""


class StoreFormatError(StoreError):
    """The directory is not a store this version can read (newer or unknown format)."""


class BlobNotFoundError(StoreError):
    """A blob that a record or lock file names is not in the store."""

    def __init__(self, digest: str, path: Path):
        self.digest = digest
        self.path = Path(path)
        super().__init__(f"blob {digest} is not in the store (expected at {path}); "
                         f"rebuild, or import the artifacts the lock file was built with")


class CorruptArtifactError(StoreError):
    """Stored bytes do not match their digest (or cannot be decoded). Bad bytes are never returned.

    ``path`` is the file that was read; ``quarantined_to`` where it was moved (None if the
    move failed, e.g. on a read-only store); ``problems`` lists every bad file when one
    operation (import, export) found several.
    """

    def __init__(self, message: str, *, path: Path | None = None, digest: str | None = None,
                 reason: str = "", quarantined_to: Path | None = None,
                 problems: Sequence[str] = ()):
        self.path = Path(path) if path is not None else None
        self.digest = digest
        self.reason = reason
        self.quarantined_to = quarantined_to
        self.problems = list(problems)
        super().__init__(message)

    @classmethod
    def for_blob(cls, path: Path, digest: str, reason: str, quarantined_to: Path | None) -> "CorruptArtifactError":
        where = (f"moved to {quarantined_to}; the records using it are now misses, so the next build "
                 f"recompiles it" if quarantined_to is not None
                 else "not quarantined (read-only store); rebuild or re-import the store, or, if it "
                      "is an installed artifact package, reinstall it (pip install --force-reinstall)")
        return cls(f"corrupt blob {path}: {reason}; {where}", path=path, digest=digest,
                   reason=reason, quarantined_to=quarantined_to)
