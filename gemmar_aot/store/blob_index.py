"""A lock's blob index: the code objects a lock names, one zstd frame per rank, in one file.

A rank getting ready loads every code object of its launches (the reference manifest's rank 0:
53). From the store that is a file, a dictionary-compressed frame and a sha256 each; most of
that cost is per file, not per byte. The build therefore writes, next to each lock file, the
code objects that lock names, grouped as its record index is (by rank, rank 0 first)::

    locks/<manifest>.lock.json        the lock
    locks/<manifest>.records.zst      its record index (:mod:`.record_index`)
    locks/<manifest>.blobs.zst        its blob index

Format (schema :data:`INDEX_SCHEMA`): zstd frames, each with its content size and checksum. The
first holds a header (canonical JSON)::

    {"format": "gemmar-aot blob index", "schema": 1, "blobs": N,
     "groups": [[FRAME_BYTES, "PREFIXES", [SIZE, ...]], ...]}

then one frame per group, FRAME_BYTES long: that group's code objects back to back, in the order
PREFIXES (the first :data:`PREFIX_HEX` hex digits of each one's sha256) and the SIZEs name them.
One frame holds a rank's code objects, which share most of their bytes (a GEMM per M, its
phases per M), so it compresses without a trained dictionary and decompresses in one call.

Nothing in the index is trusted by itself: a reader hashes every code object it takes and
compares it with the digest and size its lock names. A prefix the index lacks is a miss (the
caller reads the store); a code object whose bytes are not the ones named raises
:class:`BlobIndexError` naming the file (the caller may still read the store).

Deterministic: the same lock and code objects give the same bytes for a given libzstd.
Runtime-safe: standard library + ``zstandard``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gemmar_aot.model.spec import canonical_json

from .blobfmt import FrameError, checked_frame
from ._fs import read_if_present
from .store_errors import StoreError
from .record_index import lock_rank_groups
from gemmar_aot.util.filedigest import sha256_hex

INDEX_SCHEMA = 1
INDEX_FORMAT = "gemmar-aot blob index"
#: A rank's frame compresses to a few KB at any level (its code objects share most bytes); 9 takes
#: a fraction of the time 19 does, for a frame within a few percent of 19's.
ZSTD_LEVEL = 9
#: Digest prefixes locate code objects in their group; the full digest is checked on every read.
PREFIX_HEX = 16
#: A group larger than this when decompressed is refused (the reference manifest's rank: ~0.6 MB).
MAX_GROUP_BYTES = 1 << 30


class BlobIndexError(StoreError):
    """A blob index that cannot be used: damaged, of another schema, or holding other bytes."""


def lock_rank_blob_groups(lock: Any, kernels: Mapping[str, Any] | None = None) -> list[list[str]]:
    """The code objects (blob digests) a lock names, grouped by rank as its record index is
    (:func:`.record_index.lock_rank_groups`), each once per rank that launches it. ``kernels``:
    ``lock.kernels()`` when the caller has it."""
    kernels = lock.kernels() if kernels is None else kernels
    return [list(dict.fromkeys(kernels[k].blob.hash for k in keys)) for keys in lock_rank_groups(lock)]


def encode_blob_index(groups: Sequence[Iterable[str]], blob_of: Callable[[str], bytes], *,
                      level: int = ZSTD_LEVEL) -> bytes:
    """The index bytes of ``groups`` (each a set of blob digests; one frame each, empty ones left
    out); ``blob_of(digest)`` gives each code object's verified bytes."""
    import zstandard

    cctx = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
    frames, table, total = [], [], 0
    for g in groups:
        members = sorted(set(g))
        if not members:
            continue
        raws = [blob_of(d) for d in members]
        frames.append(cctx.compress(b"".join(raws)))
        table.append([len(frames[-1]), "".join(d[:PREFIX_HEX] for d in members), [len(r) for r in raws]])
        total += len(members)
    head = canonical_json({"format": INDEX_FORMAT, "schema": INDEX_SCHEMA, "blobs": total,
                           "groups": table}).encode()
    return cctx.compress(head) + b"".join(frames)


def build_blob_index(lock: Any, load_blob: Callable[[str, int], bytes]) -> bytes:
    """The blob index of ``lock``; ``load_blob(digest, size)`` gives each code object, verified
    (``Store.load_blob``)."""
    kernels = lock.kernels()
    sizes = {e.blob.hash: e.blob.size for e in kernels.values()}
    return encode_blob_index(lock_rank_blob_groups(lock, kernels), lambda d: load_blob(d, sizes[d]))


def _frame(data: bytes, path: Path, what: str) -> tuple[bytes, bytes]:
    """The first zstd frame of ``data``, decompressed and its checksum checked, and the bytes after it."""
    try:
        return checked_frame(data, MAX_GROUP_BYTES)
    except FrameError as exc:
        why = {"unchecked": "is not a blob index frame (no checksum or no plausible size)",
               "truncated": "is truncated"}.get(
            exc.kind, f"does not decompress ({exc.detail}): the file is damaged or was modified")
        raise BlobIndexError(f"{path}: {what} {why}; rebuild the manifest (gemmar-aot build) to rewrite the "
                             f"lock and its blob index, or delete {path}") from None


class BlobIndex:
    """A blob index read for one lock. :meth:`read` checks the header; a group's frame is
    decompressed (its checksum checked) the first time :meth:`blob` asks for one of its members."""

    def __init__(self, path: Path, groups: list[tuple[bytes, str, list[int]]]):
        self.path = path
        self._groups = groups
        self._frames: list[bytes | None] = [f for f, _p, _s in groups]
        self._texts: dict[int, bytes] = {}
        # digest prefix -> (group, offset in the group's bytes, size), the first group naming it
        # winning; a group's entries are added when a look-up first reaches it (rank 0's first)
        self._where: dict[str, tuple[int, int, int]] = {}
        self._mapped = 0

    def _find(self, prefix: str) -> tuple[int, int, int] | None:
        where = self._where.get(prefix)
        while where is None and self._mapped < len(self._groups):
            g = self._mapped
            _frame_bytes, prefixes, sizes = self._groups[g]
            off = 0
            for i, size in enumerate(sizes):
                self._where.setdefault(prefixes[i * PREFIX_HEX:(i + 1) * PREFIX_HEX], (g, off, size))
                off += size
            self._mapped += 1
            where = self._where.get(prefix)
        return where

    @classmethod
    def read(cls, path: str | os.PathLike) -> "BlobIndex | None":
        """The index at ``path``; None when there is no file. Raises BlobIndexError when it is
        damaged or of another schema."""
        path = Path(path)
        data = read_if_present(path)
        return None if data is None else cls.from_bytes(data, path)

    @classmethod
    def from_bytes(cls, data: bytes, path: Path) -> "BlobIndex":
        import json

        text, rest = _frame(data, path, "its header")
        try:
            head = json.loads(text)
        except ValueError:
            head = None
        damaged = BlobIndexError(f"{path}: not a gemmar-aot blob index, or a damaged one (bad header); rebuild "
                                 f"the manifest (gemmar-aot build) or delete {path}")
        if not isinstance(head, dict) or head.get("format") != INDEX_FORMAT:
            raise damaged
        if head.get("schema") != INDEX_SCHEMA:
            raise BlobIndexError(f"{path}: blob index schema {head.get('schema')!r}, this gemmar-aot reads "
                                 f"{INDEX_SCHEMA}; rebuild the manifest (gemmar-aot build) or delete {path}")
        table = head.get("groups")
        if not isinstance(table, list):
            raise damaged
        groups, pos = [], 0
        for row in table:
            if (not isinstance(row, list) or len(row) != 3 or type(row[0]) is not int or row[0] <= 0
                    or not isinstance(row[1], str) or not isinstance(row[2], list)
                    or len(row[1]) != PREFIX_HEX * len(row[2])
                    or row[2] and (set(map(type, row[2])) != {int} or min(row[2]) < 0)):
                raise damaged
            groups.append((rest[pos:pos + row[0]], row[1], row[2]))
            pos += row[0]
        if pos != len(rest):
            how = "truncated" if pos > len(rest) else "longer than its header says"
            raise BlobIndexError(f"{path}: the blob index is {how}; rebuild the manifest (gemmar-aot build) or "
                                 f"delete {path}")
        return cls(path, groups)

    def _text(self, g: int) -> bytes:
        """Group ``g``'s bytes, decompressed once (the frame is dropped then); raises BlobIndexError."""
        text = self._texts.get(g)
        if text is None:
            text, rest = _frame(self._frames[g], self.path, f"group {g}")
            if rest:
                raise BlobIndexError(f"{self.path}: group {g} holds more than one frame; rebuild the manifest "
                                     f"(gemmar-aot build) or delete {self.path}")
            self._texts[g] = text
            self._frames[g] = None
        return text

    def blob(self, digest: str, size: int | None = None) -> bytes | None:
        """The code object ``digest`` (of ``size`` bytes when given), checked; None when the index
        has none under its prefix. Raises BlobIndexError when its bytes are not that code object."""
        where = self._find(digest[:PREFIX_HEX])
        if where is None:
            return None
        g, off, n = where
        text = self._text(g)
        data = text[off:off + n]
        if len(data) != n or (size is not None and n != size) or sha256_hex(data) != digest:
            raise BlobIndexError(f"{self.path}: the code object it holds under {digest[:PREFIX_HEX]} is not "
                                 f"{digest} ({size} bytes): the index is damaged or was written for another "
                                 f"lock; rebuild the manifest (gemmar-aot build) or delete {self.path}")
        return data
