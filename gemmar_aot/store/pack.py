"""A pack: many blob files in one file with an index (what an artifact wheel ships).

One zip entry per blob cost a wheel ~300 bytes of zip and RECORD overhead per code object;
a pack costs 16 bytes of index per blob. Layout (all integers little-endian)::

    b"GAPACK01"                          magic + version
    u32 count                            index entries
    count x (8-byte sha256 prefix, u32 offset, u32 length)   sorted by (prefix, offset)
    payload                              the blob files (:mod:`.blobfmt`), back to back

``offset`` counts from the start of the payload. The index only *locates*: every load
decodes the entry and checks the full sha256 (and size) the caller names, so a prefix
names a blob no better than a hint, and two blobs sharing a prefix are simply both tried.
A prefix may appear more than once (e.g. a dictionary stored twice, as a spare), and a
reader takes the first copy that verifies, so one flipped byte in a doubled entry costs
nothing. The artifact wheel stores each blob once (see :func:`gemmar_aot.package.wheel.pack_blobs`). Decoding goes through :class:`~gemmar_aot.store.blob_codec.BlobCodec`, exactly as in
a store directory. Deterministic: the same blobs give the same bytes.

A store root holding :data:`PACK_FILE` opens (read-only) as a :class:`PackBackend`.

Runtime-safe: standard library + ``zstandard``.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._fs import check_hex64
from .backend import CacheBackend, Digest
from .blob_codec import BadBlob, BlobCodec, DictionaryUnavailable, SizeMismatch
from .store_errors import BlobNotFoundError, CorruptArtifactError, StoreError, StoreFormatError

PACK_FILE = "blobs.pack"
MAGIC = b"GAPACK01"
_ENTRY = struct.Struct("<8sII")
PREFIX_HEX = 16
_HEAD = struct.Struct("<8sI")


class PackFormatError(StoreFormatError):
    """The pack file is not one this version reads (or its index is damaged)."""


def write_pack(blobs: Mapping[str, Sequence[bytes]]) -> bytes:
    """The pack of ``blobs``: digest -> stored copies (blob-file bytes; usually one, two for a
    dictionary). Deterministic."""
    entries = []
    payload = bytearray()
    for digest in sorted(blobs):
        check_hex64(digest, "blob digest")
        for data in blobs[digest]:
            entries.append((bytes.fromhex(digest[:PREFIX_HEX]), len(payload), len(data)))
            payload += data
    head = _HEAD.pack(MAGIC, len(entries)) + b"".join(_ENTRY.pack(*e) for e in entries)
    return head + bytes(payload)


def read_index(data: bytes, where: str) -> tuple[dict[str, list[tuple[int, int]]], int]:
    """({digest prefix (16 hex): [(offset, length), ...]}, payload start) of pack bytes; raises
    PackFormatError."""
    if len(data) < _HEAD.size:
        raise PackFormatError(f"{where}: too short to be a pack file")
    magic, count = _HEAD.unpack_from(data, 0)
    if magic != MAGIC:
        raise PackFormatError(f"{where}: not a gemmar-aot pack file (magic {magic!r}, expected {MAGIC!r}); "
                              f"reinstall the artifact package or upgrade gemmar-aot")
    start = _HEAD.size + count * _ENTRY.size
    if start > len(data):
        raise PackFormatError(f"{where}: index of {count} entries is longer than the file (truncated)")
    index: dict[str, list[tuple[int, int]]] = {}
    for i in range(count):
        raw, off, n = _ENTRY.unpack_from(data, _HEAD.size + i * _ENTRY.size)
        if start + off + n > len(data):
            raise PackFormatError(f"{where}: entry {i} ({raw.hex()}) points past the end of the file")
        index.setdefault(raw.hex(), []).append((off, n))
    return index, start


class PackBackend(CacheBackend):
    """A read-only backend over ``root/blobs.pack`` (or over pack bytes, ``data``, read from
    ``where``): blobs only, no action cache."""

    name = "pack"
    writable = False
    readonly = True
    durable = False

    def __init__(self, root: str | Path, *, data: bytes | None = None, where: str | None = None):
        self.root = Path(root)
        self.path = Path(where) if where is not None else self.root / PACK_FILE
        if data is None:
            from .local import read_store_format

            self.format = read_store_format(self.root)
            data = self.path.read_bytes()
        else:
            self.format = None
        self._data = data
        self.index, self._start = read_index(self._data, str(self.path))
        self.codec = BlobCodec(self._load_dictionary)
        self.counters: Counter[str] = Counter()
        self.level = self.codec.level

    def __repr__(self) -> str:
        return f"PackBackend({str(self.path)!r})"

    def describe_blob(self, digest: str) -> str:
        return f"{self.path} (blob {digest})"

    def blob_path(self, digest: str) -> Path:
        check_hex64(digest, "blob digest")
        return self.path

    def _copies(self, digest: str) -> Iterator[bytes]:
        """Every entry whose prefix is ``digest``'s (the caller verifies which is which)."""
        for off, n in self.index.get(digest[:PREFIX_HEX], ()):
            yield self._data[self._start + off:self._start + off + n]

    def _load_dictionary(self, digest: str) -> bytes:
        problems = []
        for data in self._copies(digest):
            try:
                raw = self.codec.decode_dictionary(data, digest)
                if problems:
                    self.counters["dictionaries_recovered"] += 1
                return raw
            except BadBlob as e:
                problems.append(str(e))
        raise DictionaryUnavailable(f"its zstd dictionary {digest} is "
                                    + (f"corrupt in every copy ({'; '.join(problems)})" if problems
                                       else "not in the pack"))

    def load_blob_file(self, digest: str) -> bytes:
        """The stored (encoded) bytes of ``digest``'s first entry that decodes to it, unverified
        beyond that; for tools that repack."""
        for data in self._copies(digest):
            try:
                self.codec.decode(data, digest)
                return data
            except BadBlob:
                continue
        raise BlobNotFoundError(digest, self.path)

    def prefixes(self) -> list[str]:
        """The index's digest prefixes (16 hex), sorted."""
        return sorted(self.index)

    def stored_bytes(self, digest: str) -> int:
        """Bytes of every entry under ``digest``'s prefix (both copies of a dictionary)."""
        return sum(n for _off, n in self.index.get(digest[:PREFIX_HEX], ()))

    def dictionary_refs(self) -> set[str]:
        """Digests of the dictionaries the pack's blobs name."""
        from . import blobfmt

        out = set()
        for entries in self.index.values():
            for off, n in entries:
                try:
                    ref = blobfmt.split(self._data[self._start + off:self._start + off + n])[0]
                except blobfmt.BlobFormatError:
                    continue
                if ref:
                    out.add(ref)
        return out

    # ---- blobs ----

    def contains_blob(self, digest: Digest | str) -> bool:
        return (digest.hash if isinstance(digest, Digest) else digest)[:PREFIX_HEX] in self.index

    def load_blob(self, digest: str, size: int | None = None) -> bytes:
        """Verified bytes of blob ``digest``; BlobNotFoundError or CorruptArtifactError naming the pack."""
        check_hex64(digest, "blob digest")
        reasons = []
        for data in self._copies(digest):
            try:
                return self.codec.decode(data, digest, size)
            except SizeMismatch as e:
                raise CorruptArtifactError(f"{e} (the lock naming it is wrong; the blob in {self.path} is "
                                           f"intact)", path=self.path, digest=digest, reason=str(e)) from None
            except BadBlob as e:
                reasons.append(str(e))
        if not reasons:
            raise BlobNotFoundError(digest, self.path)
        raise CorruptArtifactError.for_blob(self.path, digest, "; ".join(reasons), None)

    def get_blob(self, digest: Digest) -> bytes | None:
        try:
            return self.load_blob(digest.hash, digest.size)
        except BlobNotFoundError:
            return None

    def put_blob(self, data: bytes, **_: Any) -> Digest:
        raise StoreError(f"{self.path} is a read-only pack (an installed artifact package)")

    # ---- no action cache ----

    def get_record(self, key: str) -> dict | None:
        check_hex64(key, "key")
        return None

    def put_record(self, key: str, record: Mapping[str, Any]) -> None:
        raise StoreError(f"{self.path} is a read-only pack (an installed artifact package)")

    def record_path(self, key: str) -> Path:
        check_hex64(key, "key")
        return self.path

    def init(self) -> None:
        raise StoreError(f"{self.root} is a read-only pack (an installed artifact package)")

    def quarantine(self, path: Path, reason: str) -> None:
        return None

    def dictionary_info(self, kind: str = "blobs") -> None:
        return None

    def current_dictionary(self, kind: str = "blobs") -> None:
        return None
