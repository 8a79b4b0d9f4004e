"""Content-addressed artifact store for compiled kernels (Bazel's action cache + CAS model).

Layout under the store root::

    STORE_FORMAT                      "4\\n"; another format is refused (2 and 3 are migrated)
    blobs/sha256/ab/<digest>.zst      zstd of the raw bytes whose sha256 is <digest>
    ac/ab/<key>.json.zst              record (zstd JSON, record dictionary): {schema, key,
                                      blob: {hash, size}, metadata, launch, ingredients, ...}
    dictionaries/<digest>.zst         the spare copy of each zstd dictionary
    claims/ab/<key>.claim             per-key build claims (filelock); gc removes stale ones
    locks/<manifest>.lock.json        lock files (the build's; nothing else lives in locks/)
    quarantine/                       files that failed verification, with a .reason note
    stats/last-build.json             hits/misses of the last build
    work/<dir>/                       one directory per compile in flight (hipcc: staging, output);
                                      removed by its compile, by gc when a killed build left it
    dictionary.json                   the zstd dictionary new blobs use (optional; itself a blob)
    record-dictionary.json            the zstd dictionary new records use (optional)

Modules: ``backend`` (the seam: CacheBackend, Digest, the record envelope), ``blob_codec`` (the
one decode-and-verify path), ``local`` (the directory backend), ``pack`` (a wheel's
one-file blob pack), ``cas`` (Store: backends layered, claims), ``record`` (the record
digest a lock names each record by), ``remote/`` (the remote cache's backend). Maintenance, on
Store's public interface: ``inventory`` (ls, stats, verify), ``gc``, ``transfer``
(export/import), ``dictionaries`` (training, repack, optimize). Lock files are the model's
(:mod:`gemmar_aot.model`).

Runtime-safe: imports only the standard library and ``zstandard`` (``filelock`` lazily,
when claiming a key to build it).
"""

import importlib

#: name -> the module that defines it, imported when the name is first read: a pod that reads
#: its records and code objects from a lock's indexes (``record_index``, ``blob_index``) never
#: imports the store's write side (``cas``, ``local``).
_EXPORTS = {
    "CacheBackend": "backend", "Digest": "backend",
    "DEFAULT_LEVEL": "cas", "RECORD_SCHEMA": "cas", "STORE_FORMAT": "cas", "Claim": "cas", "Store": "cas",
    "read_store_format": "cas",
    "BlobNotFoundError": "store_errors", "CorruptArtifactError": "store_errors", "LockFileError": "store_errors",
    "StoreError": "store_errors", "StoreFormatError": "store_errors",
    "ENV_VAR": "root", "default_store_root": "root",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value
