"""Content-addressed artifact store for compiled kernels (Bazel's action cache + CAS model).

Layout under the store root::

    STORE_FORMAT                      "2\\n"; another format is refused
    blobs/sha256/ab/<digest>.zst      zstd of the raw bytes whose sha256 is <digest>
    ac/ab/<key>.json.zst              record (zstd JSON): {schema, key, blob: {digest, size}, metadata, launch, ingredients, ...}
    locks/ab/<key>.lock               per-key build lock (filelock); gc removes stale ones and
                                      leaves every other file in locks/ alone
    quarantine/                       files that failed verification, with a .reason note
    stats/last-build.json             hits/misses of the last build
    dictionary.json                   the zstd dictionary new blobs use (optional; itself a blob)

Runtime-safe: imports only the standard library and ``zstandard`` (``filelock`` lazily,
when claiming a key to build it).
"""

from .cas import DEFAULT_LEVEL, RECORD_SCHEMA, STORE_FORMAT, Claim, Store, read_store_format
from .errors import (
    BlobNotFoundError,
    CorruptArtifactError,
    LockFileError,
    StoreError,
    StoreFormatError,
)
from .lockfile import LOCK_SCHEMA, dumps_lock, iter_launches, lock_blobs, lock_keys, read_lock_file, write_lock_file
from .root import ENV_VAR, default_store_root

__all__ = [
    "BlobNotFoundError",
    "Claim",
    "CorruptArtifactError",
    "DEFAULT_LEVEL",
    "ENV_VAR",
    "LOCK_SCHEMA",
    "LockFileError",
    "RECORD_SCHEMA",
    "STORE_FORMAT",
    "Store",
    "StoreError",
    "StoreFormatError",
    "default_store_root",
    "dumps_lock",
    "iter_launches",
    "lock_blobs",
    "lock_keys",
    "read_lock_file",
    "read_store_format",
    "write_lock_file",
]
