"""Content-addressed artifact store for compiled kernels (Bazel's action cache + CAS model).

Layout under the store root::

    STORE_FORMAT                      "3\\n"; another format is refused (2 is migrated)
    blobs/sha256/ab/<digest>.zst      zstd of the raw bytes whose sha256 is <digest>
    ac/ab/<key>.json.zst              record (zstd JSON, record dictionary): {schema, key,
                                      blob: {digest, size}, metadata, launch, ingredients, ...}
    dictionaries/<digest>.zst         the spare copy of each zstd dictionary
    claims/ab/<key>.claim             per-key build claims (filelock); gc removes stale ones
    locks/<manifest>.lock.json        lock files (the build's; nothing else lives in locks/)
    quarantine/                       files that failed verification, with a .reason note
    stats/last-build.json             hits/misses of the last build
    dictionary.json                   the zstd dictionary new blobs use (optional; itself a blob)
    record-dictionary.json            the zstd dictionary new records use (optional)

Modules: ``backend`` (the seam: CacheBackend, Digest, the record envelope), ``codec`` (the
one decode-and-verify path), ``local`` (the directory backend), ``pack`` (a wheel's
one-file blob pack), ``cas`` (Store: backends layered, claims), ``record`` (the record
digest a lock names each record by), ``remote/`` (the remote cache's backend). Maintenance, on
Store's public interface: ``inventory`` (ls, stats, verify), ``gc``, ``transfer``
(export/import), ``dictionaries`` (training, repack, optimize). Lock files are the model's
(:mod:`gemmar_aot.model`).

Runtime-safe: imports only the standard library and ``zstandard`` (``filelock`` lazily,
when claiming a key to build it).
"""

from .backend import CacheBackend, Digest
from .cas import DEFAULT_LEVEL, RECORD_SCHEMA, STORE_FORMAT, Claim, Store, read_store_format
from .errors import (
    BlobNotFoundError,
    CorruptArtifactError,
    LockFileError,
    StoreError,
    StoreFormatError,
)
from .root import ENV_VAR, default_store_root

__all__ = [
    "BlobNotFoundError",
    "CacheBackend",
    "Claim",
    "CorruptArtifactError",
    "DEFAULT_LEVEL",
    "Digest",
    "ENV_VAR",
    "LockFileError",
    "RECORD_SCHEMA",
    "STORE_FORMAT",
    "Store",
    "StoreError",
    "StoreFormatError",
    "default_store_root",
    "read_store_format",
]
